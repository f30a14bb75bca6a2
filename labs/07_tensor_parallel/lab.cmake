# STEP_USES: which earlier steps' code each step's graders run (measured: ctest labNN.step_uses)
scalelab_add_lab(07 tensor_parallel SOURCES tensor_parallel.cpp GIVEN tp_model.cpp STEPS 6 RANKS 1 2 4 TIMEOUT 60
                 STEP_USES "2:1" "3:1,2" "4:1,2,3" "5:1,2,3,4" "6:1,2,3,4,5"
                 OPTIONAL_STEPS 5 6)  # the core (steps 1-4) fits 90 minutes: README.md
# tp (= the number of ranks) must divide the heads, the MLP width and the vocabulary: tiny has 2
# heads, so 4 ranks are a usage error, exit 2 on every rank (checked before any data is read).
if(SCALELAB_BUILD_TESTS)
  set(lab07_cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MPIEXEC_PREFLAGS}
      $<TARGET_FILE:lab07_tensor_parallel_solution> ${MPIEXEC_POSTFLAGS} --model tiny)
  list(JOIN lab07_cmd "|" lab07_cmd)
  add_test(NAME lab07.cli.tp_not_dividing_heads.np4
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${lab07_cmd}" -DEXPECT_CODE=2
                   "-DEXPECT_REGEX=error: tensor parallel size 4 must divide the heads \\(2\\)"
                   -DMAX_SECONDS=20 -P ${PROJECT_SOURCE_DIR}/tests/common/expect_exit.cmake)
  set_tests_properties(lab07.cli.tp_not_dividing_heads.np4 PROPERTIES PROCESSORS 4 TIMEOUT 40
                       LABELS "reference;lab07" ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
  # A batch too large for this machine (issue 22): exit 2 on every rank, naming the option, the
  # bytes needed and the bytes available, before anything is allocated or read.
  scalelab_expect_usage_error(lab07.cli.batch_too_large_for_memory lab07_tensor_parallel_solution
    RANKS 2 LABELS reference lab07
    MATCH "^error: --batch 1000000000: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank [01].*. the node has [0-9.]+GiB available"
    ARGS --model tiny --batch 1000000000 --data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)
  # A mixture-of-experts --model (the library's MoE block has no tensor-parallel cut): one line
  # naming the model and the dense ones, on 1 rank too, not "check failed" from the model (exit 1).
  scalelab_expect_usage_errors(lab07.cli lab07_tensor_parallel_solution LABELS reference lab07
      ARGS --data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt
      CASES
      "2|moe_model|^error: --model tiny-moe: lab 07's tensor parallelism cuts dense blocks only. its mixture-of-experts blocks are lab 12's \\(dense models: tiny, |--model|tiny-moe|--steps|2|--reps|1|--twin-steps|1"
      "1|moe_model_one_rank|^error: --model small-moe: lab 07's tensor parallelism cuts dense blocks only|--model|small-moe")
endif()
# On a GPU (label gpu; skipped without one): the reference with CUDA tensors against the CPU
# (tests/07_tensor_parallel/test_gpu.cpp), not a graded step.
scalelab_add_lab_gpu_tests(07)
# Planted submissions (solutions/07_tensor_parallel/planted/cheats.plant): the reference with one
# cheat each that gives the right numbers by the wrong technique; the step it cheats must fail.
scalelab_add_planted_submissions(07
  CASES "private_sum:1:2:Step1_Operators.GForwardSumsThePartialOutputsOverRanks on rank [0-9]: .*traffic outside the exact budget.*all_reduce\\(max\\)"
        "twice:2:2:Step2_ColumnParallel.EqualsTheSingleDeviceLinear on rank [0-9]: .*matmuls did"
        "vector_logits:4_CrossEntropy:2:Step4_CrossEntropy.EqualsTheFullCrossEntropyWithoutTheFullLogits on rank [0-9]: .*process heap grew"
        "static_logits:4_CrossEntropy:2:Step4_CrossEntropy.EqualsTheFullCrossEntropyWithoutTheFullLogits on rank [0-9]: .*MPI_Allgather on raw MPI outside the Communicator"
        "static_logits:4_Memory:1:Step4_Memory.TheFullLogitsNeverExistOnOneRank on rank 0: .*static storage"
        # the region's first dimension cut in place of the token rows: right while tp divides B
        "batch_split:5:2:Step5_Operators.ABatchSmallerThanTpIsSplitByTokenRows on rank [0-9]: scatter_sequence of a \\(B, T, C\\) = \\(1, 4, 3\\) tensor at tp 2 .*a rank's rows are its N/tp = 2 of the N = B.T = 4 tokens"
        # step 3's head shards wrong: step 4's model check names where it shows first
        "wrong_heads:4_GPT.Trains:2:Step4_GPT.TrainsLikeTheSingleDeviceGPTForFiveAdamWSteps on rank [0-9]: .*first divergence: blocks\\.0\\.attn\\.att, forward, ranks 0, 1"
        # what a rank holds: a copy in an identity, a second output, a copy at a region's edge
        "f_forward_clone:1:2:Step1_Operators.FForwardIsTheIdentityAndSendsNothing on rank [0-9]: .*the operator allocated [0-9]+ bytes at its peak"
        "g_backward_clone:1:2:Step1_Operators.GBackwardIsTheIdentityAndSendsNothing on rank [0-9]: .*the operator allocated [0-9]+ bytes at its peak"
        "column_forward_full_buffer:2:2:Step2_ColumnParallel.EqualsTheSingleDeviceLinear on rank [0-9]: .*allocated [0-9]+ bytes at its peak.*y_local it returns"
        "enter_backward_clone:3:2:Step3_Block.TheMappingsAllocateNothing on rank [0-9]: .*enter_backward allocated [0-9]+ bytes at its peak"
        # step 4's embedding and cross-entropy, by suite: in this planted binary Step4_Memory
        # always fails on static_logits' array
        "embedding_forward_scratch:4_Embedding:2:Step4_Embedding.EqualsTheSingleDeviceEmbedding on rank [0-9]: .*the embedding's forward allocated 1920 bytes"
        "embedding_grad_whole_vocab:4_Embedding:2:Step4_Embedding.EqualsTheSingleDeviceEmbedding on rank [0-9]: .*the embedding's backward allocated [0-9]+ bytes"
        "embedding_wire_f32:4_Embedding:2:Step4_Embedding.Bf16ActivationsSendBf16 on rank [0-9]: .*all_reduce.sum. on world .0 1.: 1 call.s., 480 bytes .the budget: 1 call.s., 240 bytes"
        "no_max_shift:4_CrossEntropy:2:Step4_CrossEntropy.LargeLogitsGiveAFiniteLoss on rank [0-9]: the mean loss is (inf|nan)"
        "no_max_shift:4_CrossEntropy.LargeBf16:1:Step4_CrossEntropy.LargeBf16LogitsGiveAFiniteLoss on rank 0: .*the mean loss is (inf|nan)")
# Right on the host, stopped on the simulated GPU (the run there ends the job at the rank's first
# such line: a verdict "error", tests/support/on_sim.hpp): a tensor made without the device, a
# loop through data<T>().
if(SCALELAB_BUILD_TESTS)
  scalelab_add_sim_plant(07 output_on_host RANKS 2 FILTER Step2*
      TEST Step2_ColumnThenRow.RunsOnTheSimulatedGpuAsOnTheHost STOP mixed)
  scalelab_add_sim_plant(07 gathered_rows_on_host RANKS 2 FILTER Step5*
      TEST Step5_Block.RunsOnTheSimulatedGpuAsOnTheHost STOP mixed)
  scalelab_add_sim_plant(07 lookup_loop RANKS 2 FILTER "Step4*-Step4_Memory.*"
      TEST Step4_VocabParallel.RunsOnTheSimulatedGpuAsOnTheHost STOP host_read)
endif()
# A cross-entropy backward without its 1/N, graded on the whole of step 4 but its memory check:
# the unit tests run before the GPT twin checks, so the verdict names the unit test that points
# at the function, not the model's first divergence (ln_f.bias). A CASE runs every Step4 test,
# and in this planted binary the memory check always fails on static_logits' array.
if(SCALELAB_BUILD_TESTS)
  scalelab_add_planted_run(lab07.planted.sum_not_mean.np2 test_lab07_planted RANKS 2 LAB 07
    PLANT sum_not_mean FILTER "Step4*-Step4_Memory.*"
    REGEX "Step4_CrossEntropy.BackwardIsProbsMinusOneHotOnOurColumns on rank [0-9]: every element is 15 times the single-device gradient's")
endif()
# The program with only the core written (cmake/plant_steps.cmake: the reference with every
# function of the optional steps 5 and 6 throwing its starter's NotImplemented): it trains beside
# its twin, leaves the sequence-parallel rows and the formula columns out of its table with a note
# naming the step, and exits 0 on the core's twin check. About 1 s on 2 cores.
scalelab_add_core_only_program(07 STEPS 5 6 RANKS 2 EXPECT_CODE 0
  MATCH "largest \\|loss - single-device loss\\| over the first 2 steps: [-+.e0-9]+ \\(within"
        "not in the table: the sequence-parallel rows: lab 07 step 5: .*README.md#step-5.* \\(an optional step: \\./scalelab grade 07 lists them\\)"
        "formula columns: - until step 6 \\(optional\\) is written"
  ARGS --model tiny --steps 2 --batch 4 --twin-steps 2 --reps 1)
# The attendee's object's symbols beside the test binaries (cmake/ScalelabOwnWork.cmake): its
# static storage is bounded by the memory steps (tests/support/own_work.hpp).
scalelab_attendee_symbols(07 tensor_parallel tensor_parallel.cpp)
