# Mixed precision (bf16) on the CPU: the conversion and the ops' rules R1-R8 (common/ops/ops.hpp).
scalelab_add_test(NAME test_bf16_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_bf16_ops.cpp RANKS 1)
# the mixed-precision model against fp32 from the same seed, and the loss band (~5 s)
scalelab_add_test(NAME test_bf16_model SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_bf16_model.cpp
                  RANKS 1 TIMEOUT 60)
target_compile_definitions(test_bf16_model PRIVATE
                           SCALELAB_TEST_DATA="${PROJECT_SOURCE_DIR}/tests/data")
# bf16 reductions over MPI (user-defined MPI_Ops): activations all-reduced in tensor parallel
scalelab_add_test(NAME test_comm_bf16 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm_bf16.cpp
                  RANKS 1 2 TIMEOUT 60)

# --precision: a bad value is a usage error (1 and 2 ranks); programs without a bf16 mode (labs
# 00-01) refuse bf16 with one line naming the program.
set(bf16_text ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)
scalelab_expect_usage_error(lab02.cli.bad_precision lab02_single_device_solution
                            --precision fp16 --data ${bf16_text})
scalelab_expect_usage_error(common.cli.lab03_bad_precision.np2 lab03_ddp_solution RANKS 2
                            ARGS --precision bf17)
scalelab_expect_usage_error(lab00.cli.precision_bf16_refused lab00_hello_dist_solution
                            --precision bf16)
# lab 02 interrupted and resumed in bf16: the compute copy is refreshed from the loaded master
add_test(NAME lab02.program.resume_bf16
         COMMAND sh ${PROJECT_SOURCE_DIR}/tests/02_single_device/resume_test.sh
                 $<TARGET_FILE:lab02_single_device_solution> ${bf16_text} --precision bf16)
set_tests_properties(lab02.program.resume_bf16 PROPERTIES LABELS "reference;lab02" TIMEOUT 60
                     ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")

# Labs 03-10's programs in bf16 on 2 ranks, each exiting 0 only if its own check holds:
# lab 03 and 04 identical replicas, lab 05 one batch vs micro-batches within one bf16 rounding of
# the largest gradient, lab 06 the activation estimate (bf16 data, fp32 statistics) equal to the
# allocator's count, lab 07 the losses within 1e-3 of the bf16 twin's and its activation and byte
# formulas (bf16 activations, fp32 statistics) equal to the counters, lab 08 the pipeline's losses
# within 1e-3 of the bf16 twin's (its stages send bf16 activations: receiving fp32 fails on the
# message size), lab 09 ZeRO-2 within 1e-3 of its twin with the held bytes equal to the
# allocator's, lab 10 (tp 2: the vocabulary-parallel ends in bf16) within 1e-3 of its twin.
# On a corpus made from the test text at test time (a fixture).
set(bf16_corpus ${CMAKE_CURRENT_BINARY_DIR}/bf16_corpus)
add_test(NAME common.bf16.corpus COMMAND $<TARGET_FILE:scalelab_data> ${bf16_text}
                                         --out ${bf16_corpus})
set_tests_properties(common.bf16.corpus PROPERTIES FIXTURES_SETUP bf16_corpus
                     LABELS "reference;common" ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
foreach(case "lab03_ddp;--verify-steps;2"
             "lab04_ddp_overlap;--reps;1;--sweep;0.0625"
             "lab05_grad_accumulation;--accum;4;--batch;32"
             "lab06_activation_checkpointing;--reps;1"
             "lab07_tensor_parallel;--twin-steps;3;--reps;1"
             "lab08_pipeline_parallel;--micro-batches;4;--reps;1"
             "lab09_zero;--stage;2;--verify-steps;2"
             "lab10_3d_parallel;--dp;1;--tp;2;--pp;1;--twin-steps;3")
  list(POP_FRONT case program)
  string(SUBSTRING ${program} 0 5 nn)
  scalelab_add_mpi_test(${nn}.program.bf16.np2 ${program}_solution RANKS 2 TIMEOUT 60
                        LABELS reference ${nn}
                        ARGS --model tiny --steps 3 --batch 8 --precision bf16
                             --data ${bf16_corpus} ${case})  # a later --batch wins
  set_tests_properties(${nn}.program.bf16.np2 PROPERTIES FIXTURES_REQUIRED bf16_corpus)
endforeach()
# lab 10 with ZeRO-3 over dp in bf16 (lab 09's ZeRO-3 gathers 2-byte weights unit by unit)
scalelab_add_mpi_test(lab10.program.bf16_zero3.np2 lab10_3d_parallel_solution RANKS 2 TIMEOUT 60
                      LABELS reference lab10
                      ARGS --model tiny --steps 3 --batch 8 --precision bf16 --data ${bf16_corpus}
                           --dp 2 --tp 1 --pp 1 --zero 3 --micro-batches 1 --twin-steps 3)
set_tests_properties(lab10.program.bf16_zero3.np2 PROPERTIES FIXTURES_REQUIRED bf16_corpus)
# --attention picks lab 02's attention path (written out or flash); anything else is a usage error
scalelab_expect_usage_error(lab02.cli.bad_attention lab02_single_device_solution
                            --attention fast --data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)
# --diverge (train::Session): one step of each program against its single-device twin, every
# activation and gradient compared (common/train/divergence.hpp); the reference reports none and
# exits 0. About 0.6 s each on 2 cores. Lab 12 on its MoE model (a later --model wins), ep = 2:
# each rank's experts' gradients against the twin's rows of those experts.
foreach(case "lab03_ddp" "lab04_ddp_overlap" "lab05_grad_accumulation;--accum;2"
             "lab06_activation_checkpointing" "lab07_tensor_parallel;--sequence-parallel"
             "lab08_pipeline_parallel;--micro-batches;2" "lab09_zero;--stage;2"
             "lab10_3d_parallel;--dp;1;--tp;1;--pp;2;--micro-batches;2" "lab11_context_parallel"
             "lab12_expert_parallel;--model;tiny-moe")
  list(POP_FRONT case program)
  string(SUBSTRING ${program} 0 5 nn)
  set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
          $<TARGET_FILE:${program}_solution> ${MPIEXEC_POSTFLAGS} --model tiny --batch 4
          --peak-tflops 1 --data ${bf16_corpus} --diverge ${case})
  list(JOIN cmd "|" cmd)
  add_test(NAME ${nn}.program.diverge.np2
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${cmd}" -DEXPECT_CODE=0
                   "-DEXPECT_REGEX=no divergence: [0-9]+ tensors \\(([0-9]+ on each of 2 ranks|[0-9]+ on rank 0, [0-9]+ on rank 1)\\) within tolerance" -DMAX_SECONDS=40
                   -P ${CMAKE_CURRENT_LIST_DIR}/expect_exit.cmake)
  set_tests_properties(${nn}.program.diverge.np2 PROPERTIES PROCESSORS 2 TIMEOUT 60
                       LABELS "reference;${nn}" ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}"
                       FIXTURES_REQUIRED bf16_corpus)
endforeach()
# A flag given =false is off: `--diverge=false` trains (cxxopts counts the option as given, so a
# program must read a flag's value, not whether it appears).
set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
        $<TARGET_FILE:lab03_ddp_solution> ${MPIEXEC_POSTFLAGS} --model tiny --batch 4 --steps 2
        --verify-steps 0 --peak-tflops 1 --data ${bf16_corpus} --diverge=false)
list(JOIN cmd "|" cmd)
add_test(NAME lab03.cli.flag_set_false.np2
         COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${cmd}" -DEXPECT_CODE=0 "-DEXPECT_REGEX=step=1 loss="
                 -P ${CMAKE_CURRENT_LIST_DIR}/expect_exit.cmake)
set_tests_properties(lab03.cli.flag_set_false.np2 PROPERTIES PROCESSORS 2 TIMEOUT 60
                     LABELS "reference;lab03" ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}"
                     FAIL_REGULAR_EXPRESSION "divergence" FIXTURES_REQUIRED bf16_corpus)
