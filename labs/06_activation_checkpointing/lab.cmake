# STEP_USES: which earlier steps' code each step's graders run (measured: ctest labNN.step_uses)
scalelab_add_lab(06 activation_checkpointing SOURCES activation_checkpointing.cpp GIVEN policy_text.cpp held_bytes.cpp STEPS 4 RANKS 1 2 4 LIBS lab03_ddp_solution_impl TIMEOUT 60
                 STEP_USES "3:1,2" "4:1,3")
# The functions the attendee's object calls: step 3's run on the simulated GPU checks it opens no
# SimKernelScope (the ops' own key to that memory).
scalelab_attendee_symbols(06 activation_checkpointing activation_checkpointing.cpp)
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
# Planted submissions (solutions/06_*/planted/cheats.plant), each with the right gradients and
# the right Saved, caught by what the allocator, the plans or a changed activation show: memory
# freed late or parked outside Saved (steps 1-3), kept activations recomputed, a selective block
# recomputed whole, every:K plans with selective blocks, the recomputed pieces' dtype in bf16,
# and step 4's count at another sequence length, at a GPT-3 size, and by building a model.
scalelab_add_planted_submissions(06
  CASES "frees_at_the_end:2:1:Step2_Backward.FreesEachBlockAfterItsBackward on rank 0: .*held at once"
        "never_drops:3:1:Step3_Policies.TheForwardDropsTheSelectivePieces on rank 0: block 0 is selective"
        "static_stash:1:1:Step1_Forward.NothingOutlivesTheModelAndItsSaved on rank 0: .*tensors outlive them"
        "recompute_twice:2_Backward.Recomputes:1:Step2_Backward.RecomputesEachCheckpointedBlockOnce on rank 0: .*recompute a block once"
        "gelu_on_host:3_Policies.RunsOn:1:Step3_Policies.RunsOnTheSimulatedGpuAsOnTheHost on rank 0: .*selective: a checkpointed step .* copied [0-9]+ bytes from the device to the host"
        "int_btc:4_Estimate.CountsAGpt3:1:Step4_Estimate.CountsAGpt3SizeModelWithoutOverflow on rank 0: .*does not fit in 32 bits"
        "free_after_loop:1:1:Step1_Forward.FreesEachCheckpointedBlockRightAfterItsForward on rank 0: .*your forward's peak"
        "library_forward:1:1:Step1_Forward.FreesEachCheckpointedBlockRightAfterItsForward on rank 0: .*your forward's peak"
        "stash_full_blocks:1:1:Step1_Forward.FreesEachCheckpointedBlockRightAfterItsForward on rank 0: .*still alive"
        "recompute_all:2:1:Step2_Backward.UsesKeptActivationsWithoutRecomputingThem on rank 0: blocks 1 and 3"
        "free_only_recomputed:2:1:Step2_Backward.FreesEachBlockAfterItsBackward on rank 0: with blocks .1,0,1,0.*held at once"
        "selective_recomputed_whole:3:1:Step3_Policies.SelectiveBlocksAreNotRecomputedWhole on rank 0: blocks 1 and 3 are selective"
        "everyk_others_selective:3:1:Step3_Policies.Plans on rank 0: every:2 on 4 layers"
        "stash_selective:3:1:Step3_Policies.SelectiveDropFreesAndRecomputeAllocates on rank 0: drop_selective"
        "default_dtype:3:1:Step3_Policies.SelectiveRecomputesInTheBlocksDtype on rank 0: in a bf16 model"
        "lecture_trunc:4:1:Step4_Estimate.LectureFormula on rank 0: L=1, s=100"
        "block_size_not_seq:4:1:Step4_Estimate.CountUsesTheSequenceAndAllocatesNothing on rank 0: none, batches of"
        "int32:4:1:Step4_Estimate.CountsAGpt3SizeModelWithoutOverflow on rank 0: 96 layers"
        "measure:4_Estimate.CountUses:1:Step4_Estimate.CountUsesTheSequenceAndAllocatesNothing on rank 0: none: model_activation_bytes allocated")
# Right on the host, stopped on the simulated GPU: the recomputed att and g made on the host beside
# q (the run there ends the job at the first kernel given both: a verdict "error",
# tests/support/on_sim.hpp).
if(SCALELAB_BUILD_TESTS)
  scalelab_add_sim_plant(06 recompute_on_host RANKS 1 FILTER Step3*
      TEST Step3_Policies.RunsOnTheSimulatedGpuAsOnTheHost STOP ".*batched_matmul: tensors on sim and cpu")
endif()
