# STEP_USES: which earlier steps' code each step's graders run (measured: ctest labNN.step_uses)
scalelab_add_lab(06 activation_checkpointing SOURCES activation_checkpointing.cpp GIVEN policy_text.cpp held_bytes.cpp STEPS 4 RANKS 1 2 4 LIBS lab03_ddp_solution_impl TIMEOUT 60
                 STEP_USES "3:1,2" "4:1,3")
# Bad input (found by the bad-input audit): one distinct "error: ..." line naming the option, exit 2
# on every rank, before any training. A mixture-of-experts model (lab 06's forward runs dense
# blocks: it stopped after a step on "gelu_forward: undefined tensor"); a batch too large for
# this machine.
if(SCALELAB_BUILD_TESTS)
  set(lab06_data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)  # never read: checks come first
  scalelab_expect_usage_errors(lab06.cli lab06_activation_checkpointing_solution LABELS reference lab06
      ARGS --steps 2 --data ${lab06_data}
      CASES
      "2|batch_too_large_for_memory|^error: --batch 100000000: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank [01].*. the node has|--model|tiny|--batch|100000000"
      "2|moe_model|^error: --model tiny-moe: lab 06's forward runs dense blocks.*\\(dense models: tiny, |--model|tiny-moe")
endif()
# Planted submissions (solutions/06_*/planted/cheats.plant): a backward that frees each block's
# activations only at the end (right gradients, nothing held after) fails step 2's peak check; a
# forward that never drops a selective block's pieces fails step 3's forward check.
set(lab06_plants ${PROJECT_SOURCE_DIR}/solutions/06_activation_checkpointing/planted)
scalelab_add_planted_submissions(06 PLANTS ${lab06_plants}/cheats.plant
  CASES "frees_at_the_end:2:1:Step2_Backward.FreesEachBlockAfterItsBackward on rank 0: .*held at once"
        "never_drops:3:1:Step3_Policies.TheForwardDropsTheSelectivePieces on rank 0: block 0 is selective")
