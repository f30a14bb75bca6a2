# STEP_USES: which earlier steps' code each step's graders run (measured: ctest labNN.step_uses)
scalelab_add_lab(03 ddp SOURCES ddp.cpp STEPS 4 RANKS 1 2 4 TIMEOUT 60
                 STEP_USES "4:2,3")
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
