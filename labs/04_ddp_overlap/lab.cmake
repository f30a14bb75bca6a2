# STEP_USES: which earlier steps' code each step's graders run (measured: ctest labNN.step_uses)
scalelab_add_lab(04 ddp_overlap SOURCES ddp_overlap.cpp GIVEN backward_hooks.cpp STEPS 4 RANKS 1 2 4 LIBS lab03_ddp_solution_impl TIMEOUT 60
                 STEP_USES "3:2")
# The functions the attendee's object calls: step 3's run on the simulated GPU checks it opens no
# SimKernelScope (the ops' own key to that memory).
scalelab_attendee_symbols(04 ddp_overlap ddp_overlap.cpp)
# Bad input (found by the bad-input audit): one distinct "error: ..." line naming the option, exit 2
# on every rank, before any training. A --sweep element that is not a number (the shared CLI
# named only 'abc'); bucket sizes beyond a 64-bit byte count or below a byte, for --bucket-mb and
# for each --sweep size (they wrapped or rounded to 0 bytes: "the bucket size must be positive
# (--bucket-mb > 0)", for --sweep after training); a batch too large for this machine; a
# mixture-of-experts model (each rank routes only its rows: its --diverge twin check failed).
if(SCALELAB_BUILD_TESTS)
  set(lab04_data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)  # never read: checks come first
  scalelab_expect_usage_errors(lab04.cli lab04_ddp_overlap_solution LABELS reference lab04
      ARGS --steps 2 --data ${lab04_data}
      CASES
      "2|sweep_not_a_number|^error: --sweep 1,abc: expected finite numbers separated by commas.*'abc' is not one|--model|tiny|--sweep|1,abc"
      "2|bucket_beyond_64_bits|^error: --bucket-mb 1e\\+300: more than a 64-bit byte count holds|--model|tiny|--bucket-mb|1e300"
      "2|bucket_below_a_byte|^error: --bucket-mb 1e-12: less than one byte|--model|tiny|--bucket-mb|1e-12"
      "2|sweep_below_a_byte|^error: --sweep 1e-12: less than one byte|--model|tiny|--sweep|1e-12"
      "2|sweep_beyond_64_bits|^error: --sweep 1e\\+300: more than a 64-bit byte count holds|--model|tiny|--sweep|1,1e300"
      "2|batch_too_large_for_memory|^error: --batch 100000000: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank [01].*. the node has|--model|tiny|--batch|100000000"
      "2|moe_model|^error: --model tiny-moe: each DDP rank would route only its rows, .*capacity and the balancing loss.*\\(dense models: tiny, |--model|tiny-moe")
endif()
# Planted submissions (solutions/04_*/planted/cheats.plant), each a mistake that once scored full
# marks: step 1's buckets joined with no adjacency check (right in the ready order only) fail the
# any-order check; a cap compared with `<` fails the exact-cap check; step 2's all-reduce started
# beside launch_ fails the launch count, naming launch_; a count that launches one gradient early
# fails the launch check at 3 per bucket; a finish() that never averages is named by its first
# gradient off the twin (not the forward: the grader's own backward is not recorded), one that
# averages on a host copy of each bucket by the copies step 3's simulated-GPU run counts; step 4's
# exposed time to the last entry (not the latest) and hidden_fraction without its total guard
# fail step 4's value checks.
scalelab_add_planted_submissions(04
  CASES "no_adjacency_check:1_Buckets.AnyOrder:1:Step1_Buckets.AnyOrderKeepsEachBucketOneRange on rank 0: .*not next to the bucket's range"
        "cap_exclusive:1_Buckets.ABucketMay:1:Step1_Buckets.ABucketMayHoldExactlyItsCap on rank 0: .*both fit in the first bucket"
        "launch_bypassed:2:1:Step2_Launch.EachBucketStartsOnceWhenItsLastGradientIsReady on rank 0: .*0 of [0-9]+ buckets went through the Launch given to the reducer .launch_."
        "pending_off_by_one:2:1:Step2_Launch.EachBucketStartsOnceWhenItsLastGradientIsReady on rank 0: .*3 parameter.s. per bucket: bucket [0-9]+ launched before .* was ready"
        "adjacent_to_last_param:1_Buckets.AnyOrder:1:Step1_Buckets.AnyOrderKeepsEachBucketOneRange on rank 0: .*order 5, 4, 6, 7, .* could have taken"
        "wait_in_hook:2_Launch.NothingWaits:2:Step2_Launch.NothingWaitsForABucketDuringTheBackward on rank [01]: .*the backward waited for [0-9]+ all-reduce"
        "wait_last_only:3_Finish.WaitsFor:2:Step3_Finish.WaitsForEveryBucket on rank [01]: .*finish.. returned with [0-9]+ of the [0-9]+ buckets' all-reduces never waited for"
        "average_on_host:3_Finish.RunsOn:2:Step3_Finish.RunsOnTheSimulatedGpuAsOnTheHost on rank [01]: .*finish.. copied [0-9]+ bytes from the device to the host"
        "no_average:3_Finish.Gradients:2:Step3_Finish.GradientsEqualSingleDeviceForEveryBucketSize on rank [01]: first divergence: ln_f.bias gradient, backward"
        "last_entry:4:1:Step4_Measure.ExposedTime on rank 0: .*finishes latest"
        "no_total_guard:4:1:Step4_Measure.HiddenFraction on rank 0: .*nothing to hide")
# Right on the host, stopped on the simulated GPU: the average by a loop through each bucket's
# elements (the run there ends the job at the first read: a verdict "error", tests/support/on_sim.hpp).
if(SCALELAB_BUILD_TESTS)
  scalelab_add_sim_plant(04 average_loop RANKS 2 FILTER Step3*
      TEST Step3_Finish.RunsOnTheSimulatedGpuAsOnTheHost STOP host_read)
endif()
