# STEP_USES: which earlier steps' code each step's graders run (measured: ctest labNN.step_uses)
scalelab_add_lab(05 grad_accumulation SOURCES grad_accumulation.cpp GIVEN batch_plan.cpp STEPS 4 RANKS 1 2 4 LIBS lab04_ddp_overlap_solution_impl TIMEOUT 60
                 STEP_USES "2:1" "4:1")
# The functions the attendee's object calls: step 1's run on the simulated GPU checks it opens no
# SimKernelScope (the ops' own key to that memory).
scalelab_attendee_symbols(05 grad_accumulation grad_accumulation.cpp)
# Bad input (found by the bad-input audit): one distinct "error: ..." line naming the option, exit 2
# on every rank, before any training. --bucket-mb beyond a 64-bit byte count or below a byte (they
# wrapped or rounded to 0 bytes: "the bucket size must be positive"); a batch too large for this
# machine; a mixture-of-experts model (an expert's capacity and the balancing loss depend on the
# rows routed together: micro-batches gave another gradient, and the program said nothing).
if(SCALELAB_BUILD_TESTS)
  set(lab05_data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)  # never read: checks come first
  scalelab_expect_usage_errors(lab05.cli lab05_grad_accumulation_solution LABELS reference lab05
      ARGS --steps 2 --data ${lab05_data}
      CASES
      "2|bucket_beyond_64_bits|^error: --bucket-mb 1e\\+300: more than a 64-bit byte count holds|--model|tiny|--bucket-mb|1e300"
      "2|bucket_below_a_byte|^error: --bucket-mb 1e-12: less than one byte|--model|tiny|--bucket-mb|1e-12"
      "2|batch_too_large_for_memory|^error: --batch 100000000: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank [01].*. the node has|--model|tiny|--batch|100000000"
      "2|moe_model|^error: --model tiny-moe: its micro-batches would each be routed alone, .*\\(dense models: tiny, |--model|tiny-moe")
endif()
# Planted submissions (solutions/05_*/planted/cheats.plant): an accumulation that reads each
# micro-batch's loss to the host (right numbers) fails step 1's host-read check; one that never
# moves a micro-batch to the model's device fails step 1's run on the simulated GPU; a measurement
# that counts an earlier forward's activations as "before" fails step 4's; a no-sync part written
# as detach() ... attach() (not a NoSync scope) fails step 2's throwing-micro-batch check. The
# audit's plants, each right in its numbers: step 1's one whole-batch pass and every-forward-first
# fail the execution log's order (and the peak), a second forward for the loss the work count, a
# scaled loss returned the forward's-loss check; step 2's second all-reduce fails the ledger, a
# read per micro-batch the host reads, no finish() the waits, buckets launched after the backward
# the overlap; step 3's missing minimum and separate divisibility checks the bad plans; step 4's
# estimates (one forward's activations, a big batch's peak / accum) the test's own measurement and
# the log of the step run while measuring.
scalelab_add_planted_submissions(05
  CASES "reads_each_loss:1:1:Step1_Accumulate.ReadsTheLossToTheHostOnce on rank 0: .*read 4 numbers"
        "micro_batch_not_moved:1_Accumulate.RunsOn:1:Step1_Accumulate.RunsOnTheSimulatedGpuAsOnTheHost on rank 0: on the simulated GPU .*: .*on cpu.* on sim"
        "keeps_old_activations:4:1:Step4_Memory.ActivationsAnEarlierForwardLeftAreNotTheSteps on rank 0: .*earlier forward"
        "detach_by_hand:2_DdpAccumulate.AMicro:2:Step2_DdpAccumulate.AMicroBatchThatThrowsLeavesTheHooksOn on rank [0-9]: .*the hooks were left off"
        "whole_batch_once:1:1:Step1_Accumulate.EachMicroBatchForwardThenBackward on rank 0: .*ran 1 forward.s. and 1 backward"
        "all_forwards_first:1:2:Step1_Accumulate.EachMicroBatchForwardThenBackward on rank [01]: .*in the order FFBB"
        "all_forwards_first:1_Accumulate.ThePeak:1:Step1_Accumulate.ThePeakIsOneMicroBatch on rank 0: .*hold one micro-batch"
        "extra_forward_for_loss:1:4:Step1_Accumulate.DoesTheWorkOfTheWholeBatchOnce on rank [0-3]: .*matmul FLOPs"
        "returns_scaled_loss:1:1:Step1_Accumulate.MicroBatchStepReturnsTheForwardsLoss on rank 0: .*unscaled"
        "extra_all_reduce:2:2:Step2_DdpAccumulate.SendsEachBucketAndTheLossOnceAndReadsOnce on rank [01]: .*outside the exact budget"
        "reads_loss_each_micro_batch:2:4:Step2_DdpAccumulate.SendsEachBucketAndTheLossOnceAndReadsOnce on rank [0-3]: .*read [2-9] numbers"
        "no_finish:2_DdpAccumulate.Equals:1:Step2_DdpAccumulate.EqualsSingleDeviceWithOneSyncPerStep on rank 0: .*never waited for"
        "no_overlap:2:2:Step2_DdpAccumulate.TheFirstBucketStartsDuringTheLastBackward on rank [01]: .*after the last backward"
        "no_minimum_check:3:1:Step3_BatchPlan.BadPlansAreUsageErrors on rank 0: .*0 rows"
        "separate_divisibility:3:4:Step3_BatchPlan.BadPlansAreUsageErrors on rank [0-3]: .*6 rows"
        "computed_not_measured:4_Memory.Runs:1:Step4_Memory.RunsTheStepItMeasures on rank 0: .*ran 1 forward.s. and 0 backward"
        "computed_not_measured:4_Memory.Measured:4:Step4_Memory.MeasuredAroundTheStep on rank [0-3]: .*measure it, do not estimate"
        "divide_by_accum:4_Memory.Measured:2:Step4_Memory.MeasuredAroundTheStep on rank [01]: .*measure it, do not estimate"
        "divide_by_accum:4_Memory.Runs:1:Step4_Memory.RunsTheStepItMeasures on rank 0: .*ran 1 forward.s. and 1 backward")
# Right on the host, stopped on step 2's run on the simulated GPU (the job ends there, a verdict
# "error", tests/support/on_sim.hpp): the local loss read from its tensor's memory through
# data<T>(), where value() belongs. On the CPU that read is not even counted by the host-read
# check: only the simulated GPU sees it.
if(SCALELAB_BUILD_TESTS)
  scalelab_add_sim_plant(05 loss_read_from_memory RANKS 2 FILTER Step2*
      TEST Step2_DdpAccumulate.RunsOnTheSimulatedGpuAsOnTheHost STOP host_read)
endif()
