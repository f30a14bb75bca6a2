# Lab 10 links the reference solutions of lab 07 (the tensor-parallel block's operators), lab 08
# (stages, 1F1B, the executor, the tied gradient) and lab 09 (its ZeRO memory formulas, which step
# 4's planner is checked against): the attendee composes them. Step 4 is pure functions: one rank.
# Step 1 (the grid) is pure index math: one rank. Steps 2-3 run real grids: 4 ranks (dp x tp x pp
# = 1x2x2, 2x1x2, 2x2x1, and 2x1x2 in picotron's order) and, for step 3, 8 ranks (2x2x2, 1x2x4,
# 2x4x1, 4x1x2, and 2x2x2 in picotron's order).
scalelab_add_lab(10 3d_parallel SOURCES 3d_parallel.cpp
                 GIVEN checkpoint.cpp grid_setup.cpp trainer3d.cpp planner_machine.cpp plan_search.cpp
                 STEPS 4 RANKS 4
                 STEP_RANKS "1:1" "3:4,8" "4:1"
                 LIBS lab07_tensor_parallel_solution_impl lab08_pipeline_parallel_solution_impl
                      lab09_zero_solution_impl
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
# On a GPU (label gpu; skipped without one): the reference run with CUDA tensors against the CPU
# (tests/10_3d_parallel/test_gpu.cpp). Not a graded step: the attendee's code is graded on the CPU.
if(SCALELAB_BUILD_TESTS)
  foreach(k 1 2)
    scalelab_add_mpi_test(lab10.gpu.np${k} test_lab10_solution RANKS ${k} TIMEOUT 120
                          LABELS gpu reference lab10 ARGS --gtest_filter=Gpu_*)
  endforeach()
endif()
