scalelab_add_lab(09 zero SOURCES zero.cpp STEPS 5 RANKS 1 2 4 LIBS lab03_ddp_solution_impl TIMEOUT 60)
# Bad input: one "error:" line and exit 2 (checked before any data is read).
if(SCALELAB_BUILD_TESTS)
  scalelab_expect_usage_error(lab09.cli.bad_stage lab09_zero_solution LABELS reference lab09 ARGS --stage 4)
endif()
