scalelab_add_lab(09 zero SOURCES zero.cpp STEPS 5 RANKS 1 2 4 LIBS lab03_ddp_solution_impl TIMEOUT 60)
# Bad input: one "error:" line and exit 2 (checked before any data is read).
if(SCALELAB_BUILD_TESTS)
  scalelab_expect_usage_error(lab09.cli.bad_stage lab09_zero_solution LABELS reference lab09 ARGS --stage 4)
  # stage 3 has no bf16 compute copy: refused on every rank before any collective
  scalelab_expect_usage_error(lab09.cli.stage3_bf16.np2 lab09_zero_solution RANKS 2
                              LABELS reference lab09 ARGS --stage 3 --precision bf16)
endif()
