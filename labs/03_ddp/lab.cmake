# STEP_USES: which earlier steps' code each step's graders run (measured: ctest labNN.step_uses)
scalelab_add_lab(03 ddp SOURCES ddp.cpp STEPS 4 RANKS 1 2 4 TIMEOUT 60
                 STEP_USES "4:2,3")
# The functions the attendee's object calls: steps 3 and 4 run on the simulated GPU and check it
# opens no SimKernelScope (the ops' own key to that memory).
scalelab_attendee_symbols(03 ddp ddp.cpp)
# Bad input (found by the bad-input audit): one distinct "error: ..." line naming the option, exit 2
# on every rank, before the batch is drawn (never read: the data file). A batch too large for
# this machine (the sampler's allocation used to fail, "check failed: out of host memory", or
# draw for minutes), and a mixture-of-experts model (each rank routes only its rows: its
# --diverge twin check failed on the router's gradient).
if(SCALELAB_BUILD_TESTS)
  set(lab03_data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)  # never read: checks come first
  scalelab_expect_usage_errors(lab03.cli lab03_ddp_solution LABELS reference lab03
      ARGS --steps 2 --data ${lab03_data}
      CASES
      "2|batch_beyond_the_sampler|^error: --batch 9223372036854775807: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory|--model|tiny|--batch|9223372036854775807"
      "2|batch_too_large_for_memory|^error: --batch 100000000: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank [01].*. the node has|--model|tiny|--batch|100000000"
      "2|moe_model|^error: --model tiny-moe: each DDP rank would route only its rows, .*capacity and the balancing loss.*\\(dense models: tiny, |--model|tiny-moe")
endif()
# Planted submissions (solutions/03_*/planted/cheats.plant), each with the right numbers: one
# broadcast per tensor fails step 1's traffic check, one all-reduce per gradient tensor step 3's,
# a broadcast in every forward_backward step 4's; a second forward over the whole global batch
# for the loss fails step 4's work check (at 1 rank too: twice the forward), a divergence over the
# first tensor only step 4's divergence check. An average by a loop through the gradients'
# elements fails step 3's run on the simulated GPU, this rank's rows left on the host step 4's.
# Right there too, and stopped by what those runs count (host_device_copies()): an average made
# on a host copy of the gradients (step 3), the whole global batch moved to the device (step 4);
# the loss read to the host before the backward fails step 4's read check (host_reads()).
scalelab_add_planted_submissions(03
  CASES "broadcast_per_tensor:1:2:Step1_Broadcast.OneBroadcastOfTheFlatValuesFromRank0 on rank [0-9]: .*broadcast_parameters sent: broadcast root world rank 0 on world .0 1.: [0-9]+ call.s., [0-9]+ bytes. the step sends ONE broadcast"
        "all_reduce_per_tensor:3:2:Step3_AllReduce.OneAllReduceOfTheWholeGradient on rank [0-9]: .*all_reduce_gradients sent: all_reduce.sum. on world"
        "broadcast_every_step:4:2:Step4_Training.OneAllReduceOfTheGradientAndNoBroadcast on rank [0-9]: .*forward_backward sent: .*broadcast root world rank 0 on world .0 1.: 1 call.s.*and no broadcast"
        "global_forward_for_loss:4_Training.WorkIs:2:Step4_Training.WorkIsOneForwardAndBackwardOfThisRanksRows on rank [0-9]: .*forward_backward did [0-9]+ matmul FLOPs"
        "average_on_host:3_AllReduce.RunsOn:2:Step3_AllReduce.RunsOnTheSimulatedGpuAsOnTheHost on rank [0-9]: .*all_reduce_gradients copied [0-9]+ bytes from the device to the host"
        "global_batch_to_device:4_Training.RunsOn:2:Step4_Training.RunsOnTheSimulatedGpuAsOnTheHost on rank [0-9]: .*forward_backward copied [0-9]+ bytes to the device. this rank.s rows are"
        "loss_read_mid_step:4:2:Step4_Training.ReadsTheLossOnceAfterTheBackward on rank [0-9]: .*before the backward began"
        "divergence_first_tensor:4:2:Step4_Training.DivergenceSeesOneDifferentRank on rank [0-9]: .*element [0-9]+ of the [0-9]+ flat values")
# Right on the host, stopped on the simulated GPU: the run there ends the job at the rank's first
# such line (a verdict "error", tests/support/on_sim.hpp).
if(SCALELAB_BUILD_TESTS)
  scalelab_add_sim_plant(03 average_loop RANKS 2 FILTER Step3*
      TEST Step3_AllReduce.RunsOnTheSimulatedGpuAsOnTheHost STOP host_read)
  scalelab_add_sim_plant(03 rows_left_on_host RANKS 1 FILTER Step4*
      TEST Step4_Training.RunsOnTheSimulatedGpuAsOnTheHost STOP mixed)
endif()
