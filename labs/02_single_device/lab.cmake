scalelab_add_lab(02 single_device SOURCES single_device.cpp STEPS 5 RANKS 1 TIMEOUT 120)
# Bad training options: exit 2 and one "error: ..." line naming the option, before the corpus is
# read (the text given as --data is never read) and before any allocation. --warmup, --clip (0 is
# off), --peak-tflops and --sample negative (trained before, with a wrong schedule or silently);
# a --batch too large for this machine (the kernel's OOM killer, mid-step, before). Each as
# "ranks|name|regex|args...".
if(SCALELAB_BUILD_TESTS)
  scalelab_expect_usage_errors(lab02.cli lab02_single_device_solution LABELS reference lab02
      ARGS --model tiny --steps 2 --data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt
           --checkpoint ${CMAKE_CURRENT_BINARY_DIR}/lab02_cli.ckpt
      CASES
      "1|warmup_negative|^error: --warmup must not be negative, got -1$|--warmup|-1"
      "1|clip_negative|^error: --clip must not be negative \\(0: off\\), got -1$|--clip|-1"
      "1|peak_tflops_negative|^error: --peak-tflops must not be negative, got -1$|--peak-tflops|-1"
      "1|sample_negative|^error: --sample must not be negative \\(0: none\\), got -1$|--sample|-1"
      "1|batch_too_large_for_memory|^error: --batch 100000000: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank 0.*. the node has|--batch|100000000")
endif()
