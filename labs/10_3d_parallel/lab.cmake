# Lab 10 composes labs 07 (the tensor-parallel mappings), 08 (stages, 1F1B, the executor, the
# tied gradient) and 09 (ZeRO, and its memory formulas, which step 4's planner is checked
# against): the attendee's program runs the attendee's own labs 07-09 (--reference AA,BB in
# ./scalelab run takes the references of labs AA and BB instead), its graders the references. Step 4 is pure functions: one rank.
# Step 1 (the grid) is pure index math: one rank. Steps 2-3 run real grids: 4 ranks (dp x tp x pp
# = 1x2x2, 2x1x2, 2x2x1, and 2x1x2 in picotron's order) and, for step 3, 8 ranks (2x2x2, 1x2x4,
# 2x4x1, 4x1x2, and 2x2x2 in picotron's order).
scalelab_add_lab(10 3d_parallel SOURCES 3d_parallel.cpp GIVEN checkpoint.cpp STEPS 4 RANKS 4
                 STEP_RANKS "1:1" "3:4,8" "4:1"
                 COMPOSES 07 08 09
                 TIMEOUT 60)
# Bad grids (and a bad --memory size, --zero stage (ZeRO-2/3 with pp > 1), or --check-plan option): exit 2 and one distinct "error: ..." line on every rank (mpiexec adds its own notice
# about the exit code), never a hang; checked before any data is read.
if(SCALELAB_BUILD_TESTS)
  set(lab10_data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)  # never read: checks come first
  foreach(case "2;grid_not_world;--dp;2;--tp;2;--pp;1"
               "4;tp_not_dividing_heads;--dp;1;--tp;4;--pp;1"
               "4;more_stages_than_layers;--dp;1;--tp;1;--pp;4"
               "1;plan_without_memory;--plan;--memory;0GiB"
               "1;plan_memory_bad_unit;--plan;--memory;80GB"
               "1;plan_memory_not_a_size;--plan;--memory;lots"
               "1;zero_stage_unsupported;--zero;4"
               "2;zero2_with_pipeline;--dp;1;--tp;1;--pp;2;--zero;2"
               "1;check_plan_without_steps;--check-plan;--check-steps;0"
               "1;check_plan_and_plan;--check-plan;--plan")
    list(POP_FRONT case ranks name)
    scalelab_expect_usage_error(lab10.cli.${name} lab10_3d_parallel_solution
                                RANKS ${ranks} LABELS reference lab10 ARGS --model tiny ${case}
                                --data ${lab10_data})
  endforeach()
endif()
# On a GPU (label gpu; skipped without one): the reference with CUDA tensors against the CPU
# (tests/10_3d_parallel/test_gpu.cpp), not a graded step.
scalelab_add_lab_gpu_tests(10)

# The program runs the lab 07 it links (not a copy of it): lab 10's reference program linked with a
# lab 07 whose g forgets its all-reduce (made from the reference at build time) trains, and its
# twin check fails: exit 1 on every rank. (The attendee's program, lab10_3d_parallel, links the
# attendee's labs 07-09 the same way.)
if(SCALELAB_BUILD_TESTS)
  set(planted_dir ${CMAKE_CURRENT_BINARY_DIR}/planted_lab07)
  set(planted_src ${planted_dir}/tensor_parallel.cpp)
  set(lab07_reference ${PROJECT_SOURCE_DIR}/solutions/07_tensor_parallel/tensor_parallel.cpp)
  add_custom_command(OUTPUT ${planted_src}
                     COMMAND ${CMAKE_COMMAND} -E make_directory ${planted_dir}
                     COMMAND ${CMAKE_COMMAND} -DIN=${lab07_reference} -DOUT=${planted_src}
                             "-DFROM=tp.all_reduce(y)" "-DTO=(void)tp, (void)y"
                             -P ${PROJECT_SOURCE_DIR}/cmake/plant.cmake
                     DEPENDS ${lab07_reference} ${PROJECT_SOURCE_DIR}/cmake/plant.cmake
                     COMMENT "planting a g without its all-reduce into a copy of lab 07's reference"
                     VERBATIM)
  add_library(lab07_planted_impl STATIC ${planted_src}
              ${PROJECT_SOURCE_DIR}/labs/07_tensor_parallel/tp_model.cpp)
  target_link_libraries(lab07_planted_impl PUBLIC lab07_headers)
  add_executable(lab10_3d_parallel_planted07 ${CMAKE_CURRENT_LIST_DIR}/main.cpp)
  target_link_libraries(lab10_3d_parallel_planted07 PRIVATE lab10_3d_parallel_solution_impl
                        lab07_planted_impl lab08_pipeline_parallel_solution_impl
                        lab09_zero_solution_impl)
  add_dependencies(reference lab10_3d_parallel_planted07)
  set(planted_cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MPIEXEC_PREFLAGS}
      $<TARGET_FILE:lab10_3d_parallel_planted07> ${MPIEXEC_POSTFLAGS} --model tiny --steps 2
      --batch 8 --dp 1 --tp 2 --pp 2 --twin-steps 2 --data ${CMAKE_BINARY_DIR}/tests/common/bf16_corpus)
  list(JOIN planted_cmd "|" planted_cmd)
  add_test(NAME lab10.program.planted_lab07_fails_its_twin.np4
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${planted_cmd}" -DEXPECT_CODE=1
                   "-DEXPECT_REGEX=differs from the twin's by more than" -DMAX_SECONDS=60
                   -P ${PROJECT_SOURCE_DIR}/tests/common/expect_exit.cmake)
  set_tests_properties(lab10.program.planted_lab07_fails_its_twin.np4 PROPERTIES PROCESSORS 4
                       TIMEOUT 90 LABELS "reference;lab10" FIXTURES_REQUIRED bf16_corpus
                       ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
endif()
