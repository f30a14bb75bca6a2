# The simulator and the schedule vocabulary are given (labs/08_pipeline_parallel/schedule.cpp):
# one library that both builds of the lab link.
add_library(lab08_schedule STATIC ${CMAKE_CURRENT_LIST_DIR}/schedule.cpp)
target_include_directories(lab08_schedule PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(lab08_schedule PUBLIC scalelab::common)
# STEP_USES: which earlier steps' code each step's graders run (measured: ctest labNN.step_uses)
scalelab_add_lab(08 pipeline_parallel SOURCES pipeline_parallel.cpp STEPS 6 RANKS 1 2 4
                 STEP_RANKS "2:2,4" "3:1" LIBS lab08_schedule TIMEOUT 60
                 STEP_USES "4:1,2" "5:1,2,4" "6:1,2,4"
                 OPTIONAL_STEPS 5 6)  # the core (steps 1-4) fits 90 minutes: README.md
# Bad configurations of the program: exit 2 and one distinct "error: ..." line (mpiexec adds its
# own notice about the exit code), never a hang. The pipeline has one stage per rank, so "more stages than layers" runs
# 3 ranks on the 2-layer tiny model.
if(SCALELAB_BUILD_TESTS)
  set(lab08_data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)  # never read: checks come first
  foreach(case "3;more_stages_than_layers;--model;tiny"
               "1;zero_micro_batches;--model;tiny;--micro-batches;0"
               "1;interleaved_layers_not_divisible;--model;tiny;--schedule;interleaved;--chunks;4"
               "1;unknown_schedule;--model;tiny;--schedule;zigzag"
               "1;batch_not_divisible;--model;tiny;--batch;16;--micro-batches;3"
               "2;interleaved_m_not_multiple_of_p;--model;tiny;--schedule;interleaved;--chunks;1;--micro-batches;3")
    list(POP_FRONT case ranks name)
    scalelab_expect_usage_error(lab08.cli.${name} lab08_pipeline_parallel_solution
                                RANKS ${ranks} LABELS reference lab08 ARGS ${case} --data ${lab08_data})
  endforeach()
  # A batch too large for this machine (issue 22): named with the bytes needed and available.
  scalelab_expect_usage_error(lab08.cli.batch_too_large_for_memory lab08_pipeline_parallel_solution
    RANKS 2 LABELS reference lab08
    MATCH "^error: --batch 1000000000: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank [01].*. the node has [0-9.]+GiB available"
    ARGS --model tiny --batch 1000000000 --data ${lab08_data})
  scalelab_expect_usage_error(lab08.cli.twin_steps_negative lab08_pipeline_parallel_solution
    LABELS reference lab08 MATCH "^error: --twin-steps must be at least 0, got -1"
    ARGS --model tiny --twin-steps -1 --data ${lab08_data})
  # --chunks out of range, with or without the interleaved schedule (-5 with 1F1B trained: the
  # option was read by the interleaved schedule only), several chunks without it, a
  # mixture-of-experts --model (the micro-batches route their experts apart from the twin's whole
  # batch: exit 1 on the twin check), and a count that is not a number (named as one, without the
  # int's range).
  scalelab_expect_usage_errors(lab08.cli lab08_pipeline_parallel_solution LABELS reference lab08
      ARGS --data ${lab08_data}
      CASES
      "2|chunks_negative_without_interleaved|^error: --chunks must be in .1, 8., got -5|--model|tiny|--chunks|-5|--micro-batches|2|--batch|2"
      "2|chunks_zero_interleaved|^error: --chunks must be in .1, 8., got 0|--model|tiny|--schedule|interleaved|--chunks|0"
      "1|chunks_above_the_tags|^error: --chunks must be in .1, 8., got 9|--model|tiny|--schedule|interleaved|--chunks|9"
      "1|chunks_without_interleaved|^error: --chunks 2: several model chunks per rank need --schedule interleaved \\(got afab\\)|--model|tiny|--schedule|afab|--chunks|2"
      "2|moe_model|^error: --model tiny-moe: lab 08's pipeline trains dense blocks only. its mixture-of-experts blocks are lab 12's|--model|tiny-moe"
      "1|micro_batches_not_a_number|^error: --micro-batches two: expected a whole number, in digits .see --help.|--model|tiny|--micro-batches|two")
endif()
# Planted submissions (solutions/08_pipeline_parallel/planted/cheats.plant): the reference with one
# cheat each; the step it cheats must fail, and name the rank where it happened.
scalelab_add_planted_submissions(08
  CASES "afab_always:4:2:Step4_Execute.OneFOneBEqualsSingleDevice on rank [0-9]: .*(executed|in flight)"
        "rank1_zero_grads:4:2:Step4_Execute.AfabEqualsSingleDevice on rank [0-9]: .*rank 1: gradient of"
        "activations_in_vector:5_Memory:2:Step5_Memory.AfabHoldsEveryMicroBatchOneFOneBAtMostPMinusStage on rank [0-9]: .*held outside the Tensor allocator"
        "sends_deferred:6:1:Step6_Execute.InterleavedEqualsSingleDevice on rank 0: .*log of piece calls and send/recv"
        "sends_deferred:6:2:Step6_Execute.InterleavedEqualsSingleDevice on rank [0-9]: .*log of piece calls and send/recv"
        "no_peak_reset:5_Memory:2:Step5_Memory.[A-Za-z]+ on rank [0-9]: .*reported [0-9]+ bytes when called after a tensor"
        "received_kept:4:2:Step4_Memory.[A-Za-z]+ on rank [0-9]: .*1F1B stage [01] of 2, m 32: peak [0-9]+ bytes is not 1 micro"
        "received_kept:4:4:Step4_Memory.[A-Za-z]+ on rank [0-9]: .*1F1B stage [0-3] of 4, m 32: peak [0-9]+ bytes is not"
        "recv_dtype_ignored:2:2:Step2_SendRecv.ABfloat16[A-Za-z0-9]+ on rank [0-9]: .*DType::bf16. gave a buffer of f32"
        "warmup_not_capped:3_Simulated:1:Step3_Simulated.EveryGrid[A-Za-z]+ on rank 0: .*1f1b p 3 m 1: .*out of range"
        "self_messages_moved:6:1:Step6_Execute.InterleavedEqualsSingleDevice on rank 0: .*run_schedule"
        "zero_grad_first_chunk_only:6:1:Step6_Execute.InterleavedEqualsSingleDevice on rank 0: .*gradient of .* differs from the single-device one"
        "zero_grad_first_chunk_only:6:2:Step6_Execute.InterleavedEqualsSingleDevice on rank [0-9]: .*gradient of .* differs from the single-device one"
        "blocking_recv:2:2:Step2_SendRecv.AReceivePostedBeforeItsSendReturnsAtOnce on rank [0-9]: .*had not returned"
        "sends_counted_as_wait:5_Measure:1:Step5_Measure.ComputeAndWaitFromTheTimeline on rank 0: .*not the sends"
        "sends_waited_before_compute:4:2:Step4_Execute.[A-Za-z]+ on rank [0-9]: .*waited for a send to complete and then computed"
        "tied_add_before_send_done:1_TiedEmbedding.EachEnd:2:Step1_TiedEmbedding.EachEndSendsItsOwnGradientNotTheSum on rank [0-9]: .*before that send was done"
        "tied_add_before_send_done:1_TiedEmbedding.EachEnd:4:Step1_TiedEmbedding.EachEndSendsItsOwnGradientNotTheSum on rank [0-9]: .*before that send was done"
        "sends_waited_before_compute:4:4:Step4_Execute.[A-Za-z]+ on rank [0-9]: .*waited for a send to complete and then computed")
# receives_f32: in mixed precision the first receive gets a bf16 message of half the bytes its
# float32 buffer expects; the library's size check throws inside the graded test (the verdict
# names the test, the rank and the dtypes).
scalelab_add_planted_run(lab08.planted.receives_f32.np2 test_lab08_planted RANKS 2
  FILTER Step4* PLANT receives_f32 LAB 08 EXCEPTION
  REGEX "Step4_Execute.Bf16ComputeSendsBf16Messages on rank [0-9]: .*received [0-9]+ bytes .*bf16 elements")
# Right on the host, wrong on a GPU: the tied gradient's receive buffer made on the host (step
# 1's exchange on the simulated GPU), a receive buffer made on the host whatever device it is
# given (step 2's receive on the simulated GPU), a micro-batch's tokens and targets never moved to
# the pieces' device (step 4's run there ends the job at the first op given both: a verdict
# "error", tests/support/on_sim.hpp).
scalelab_add_planted_run(lab08.planted.recv_on_host.np2 test_lab08_planted RANKS 2
  FILTER Step2* PLANT recv_on_host LAB 08
  REGEX "Step2_SendRecv.AMessageArrivesOnTheDeviceItIsGiven on rank [0-9]: .*gave a buffer on cpu")
scalelab_add_sim_plant(08 tied_buffer_on_host RANKS 2 FILTER Step1*
  TEST Step1_TiedEmbedding.RunsOnTheSimulatedGpuAsOnTheHost STOP mixed)
scalelab_add_sim_plant(08 tokens_on_host RANKS 1 FILTER Step4*
  TEST Step4_Execute.RunsOnTheSimulatedGpuAsOnTheHost STOP mixed)
# The program with only the core written (cmake/plant_steps.cmake: steps 5 and 6 throw their
# starter's NotImplemented): it trains beside the twin (1F1B, steps 1-4), and its table stops with
# a note naming the missing step; exit 0 on the core's twin check. About 1 s on 2 cores.
scalelab_add_core_only_program(08 STEPS 5 6 RANKS 2 EXPECT_CODE 0
  MATCH "single-device"
        "the table stops here: lab 08 step [56]: .*README.md#step-[56].* \\(an optional step: \\./scalelab grade 08 lists them\\)"
  ARGS --model tiny --steps 2 --batch 4 --micro-batches 2 --twin-steps 2 --reps 1)
# The attendee's object's symbols beside the test binaries (cmake/ScalelabOwnWork.cmake): its
# static storage is bounded by the memory steps (tests/support/own_work.hpp).
scalelab_attendee_symbols(08 pipeline_parallel pipeline_parallel.cpp)
