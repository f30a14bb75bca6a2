# Lab 11: context parallelism. Step 1 (the zig-zag split) is pure index math and copies: one rank
# checks the layouts of cp = 1..8. Steps 2-4 run real rings and all-to-alls on 2 and 4 ranks (cp = world).
scalelab_add_lab(11 context_parallel SOURCES context_parallel.cpp
                 GIVEN layout.cpp cp_model.cpp
                 STEPS 4 RANKS 2 4
                 STEP_RANKS "1:1"
                 OPTIONAL_STEPS 4  # the core (steps 1-3) fits 90 minutes: README.md
                 TIMEOUT 60)
# Bad input: one "error:" line and exit 2 on every rank, before any data is read.
if(SCALELAB_BUILD_TESTS)
  set(lab11_data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)  # never read: checks come first
  foreach(case
      "4|cp_not_the_world|^error: --cp 2: context parallelism here runs on every rank|--cp|2"
      "4|context_not_divisible|^error: --context 100: the zig-zag split cuts the sequence into 2 cp = 8|--context|100"
      "4|heads_not_divisible|^error: --attention all-to-all: the model's 2 heads do not split over cp = 4|--attention|all-to-all"
      "1|attention_unknown|^error: --attention star: ring or all-to-all|--attention|star"
      "2|batch_too_large_for_memory|^error: --batch 1000000000: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank [01], which has|--batch|1000000000")
    string(REPLACE "|" ";" case "${case}")
    list(POP_FRONT case ranks name regex)
    scalelab_expect_usage_error(lab11.cli.${name} lab11_context_parallel_solution
                                RANKS ${ranks} LABELS reference lab11 MATCH "${regex}"
                                ARGS --model tiny --data ${lab11_data} ${case})
  endforeach()
endif()
# On a GPU (label gpu; skipped without one): the reference's step with CUDA tensors against the
# CPU (tests/11_context_parallel/test_gpu.cpp), not a graded step.
scalelab_add_lab_gpu_tests(11)
# The program on 2 ranks, ring and all-to-all, fp32 and bf16: exit 0 only when its losses follow
# the single-device twin's (fp32 1e-5, bf16 1e-3 relative). On tests/common's corpus (a fixture).
if(SCALELAB_BUILD_TESTS)
  foreach(case "ring_f32|ring|fp32" "all_to_all_bf16|all-to-all|bf16")
    string(REPLACE "|" ";" case "${case}")
    list(POP_FRONT case name attention precision)
    scalelab_add_mpi_test(lab11.program.${name}.np2 lab11_context_parallel_solution RANKS 2
                          TIMEOUT 60 LABELS reference lab11
                          ARGS --model tiny --steps 2 --batch 2 --twin-steps 2
                               --attention ${attention} --precision ${precision}
                               --data ${PROJECT_BINARY_DIR}/tests/common/bf16_corpus)
    set_tests_properties(lab11.program.${name}.np2 PROPERTIES FIXTURES_REQUIRED bf16_corpus)
  endforeach()
endif()
