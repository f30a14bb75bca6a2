# Lab 11: context parallelism. Step 1 (the zig-zag split) is pure index math and copies: one rank
# checks the layouts of cp = 1..8. Steps 2-4 run real rings and all-to-alls on 2 and 4 ranks (cp =
# world); the rings of steps 2-3 also on 1 rank (nothing travels) and 3 (a ring that is not a
# power of two: its Step*_Model tests skip there, the test model's context does not cut in 6).
scalelab_add_lab(11 context_parallel SOURCES context_parallel.cpp
                 GIVEN layout.cpp cp_model.cpp
                 STEPS 4 RANKS 2 4
                 STEP_RANKS "1:1" "2:1,2,3,4" "3:1,2,3,4"
                 OPTIONAL_STEPS 4  # the core (steps 1-3) fits 90 minutes: README.md
                 TIMEOUT 60)
# Bad input: one "error:" line and exit 2 on every rank, before any data is read.
if(SCALELAB_BUILD_TESTS)
  set(lab11_data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)  # never read: checks come first
  scalelab_expect_usage_errors(lab11.cli lab11_context_parallel_solution LABELS reference lab11
      ARGS --model tiny --data ${lab11_data}
      CASES
      "4|cp_not_the_world|^error: --cp 2: context parallelism here runs on every rank|--cp|2"
      "4|context_not_divisible|^error: --context 100: the zig-zag split cuts the sequence into 2 cp = 8|--context|100"
      "4|heads_not_divisible|^error: --attention all-to-all: the model's 2 heads do not split over cp = 4|--attention|all-to-all"
      "1|attention_unknown|^error: --attention star: ring or all-to-all|--attention|star"
      "2|batch_too_large_for_memory|^error: --batch 1000000000: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank [01].*. the node has|--batch|1000000000"
      # a sequence too long for this machine names --context (it blamed --batch 2); --reps
      # outside --overlap (read there only: --reps 0 trained)
      "2|context_too_large_for_memory|^error: --context 100000000000: a training step of one sequence needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank [01].*. the node has|--steps|1|--context|100000000000"
      "2|reps_not_positive|^error: --reps must be at least 1, got 0|--steps|1|--twin-steps|1|--reps|0"
      "2|reps_without_overlap|^error: --reps is for --overlap|--steps|1|--reps|5")
  # A mixture-of-experts --model: each rank routes its zig-zag rows as their own group (capacity,
  # the balancing loss), the twin whole sequences, so the losses parted (exit 1 on the twin check).
  scalelab_expect_usage_errors(lab11.cli lab11_context_parallel_solution LABELS reference lab11
      ARGS --data ${lab11_data}
      CASES
      "2|moe_model|^error: --model tiny-moe: lab 11's context parallelism trains dense blocks only. its mixture-of-experts blocks are lab 12's|--model|tiny-moe|--steps|2")
endif()
# Planted submissions (solutions/11_context_parallel/planted/cheats.plant): one copy of the reference
# with every wrong technique the graders must stop, each switched on by SCALELAB_PLANT; the step's
# graders run on it and must fail at the check named (the earlier checks of the step pass: right
# numbers, wrong technique). The contiguous split runs the balance suite alone (the positions
# check, which comes first, would catch it too), the all-gather's memory peak at 4 ranks.
scalelab_add_planted_submissions(11
  CASES "contiguous_split:1_Balance:1:Step1_Balance.EveryRankComputesTheSameCausalWork on rank 0: .*score blocks per rank"
        "host_loop_shard:1_Split.Shard:1:Step1_Split.ShardAndUnshardAreExactCopies on rank 0: .*shard_sequence passed [0-9]+ bytes of tensor values through the host"
        "data_loop_shard:1_Split.Shard:1:Step1_Split.ShardAndUnshardAreExactCopies on rank 0: .*on the simulated GPU .--device sim.: host code reached the elements of .* f32 sim through data<T>.., outside an op"
        "all_gather:2_Ring.Sends:2:Step2_Ring.SendsCpMinusOneBlocks on rank [0-9]: .*and 1 other operations"
        "raw_allgather:2_Ring.Sends:2:Step2_Ring.SendsCpMinusOneBlocks on rank [0-9]: .*MPI_Allgather on raw MPI outside the Communicator"
        "all_gather:2_Ring.Holds:4:Step2_Ring.HoldsAtMostTwoRemoteBlocks on rank [0-9]: .*remote K/V blocks"
        "no_causal_skip:2:2:Step2_Ring.SkipsMaskedBlocksAndIsBalanced on rank [0-9]: .*fully masked blocks computed"
        "masked_batched_forward:2_Ring.Skips:2:Step2_Ring.SkipsMaskedBlocksAndIsBalanced on rank [0-9]: .*fully masked blocks computed"
        "masked_batched_backward:3_Ring.Skips:2:Step3_Ring.SkipsMaskedBlocksAndIsBalanced on rank [0-9]: .*fully masked blocks computed"
        "send_not_waited:2_Ring.Waits:2:Step2_Ring.WaitsForEverySend on rank [0-9]: .*never waited for before the call returned"
        "lone_send_recv:2_Ring.Posts:2:Step2_Ring.PostsEachStepAsOneBatch on rank [0-9]: .*not posted in one batch with a send"
        "dkdv_posted_early:3_Ring.Next:2:Step3_Ring.NextBlockInFlightWhileABlockComputes on rank [0-9]: .*0 of 1 K/V block receives .not counting the dK/dV."
        "dkdv_posted_early:3_Ring.Next:4:Step3_Ring.NextBlockInFlightWhileABlockComputes on rank [0-9]: .*0 of 3 K/V block receives .not counting the dK/dV."
        "waits_first:2:2:Step2_Ring.NextBlockInFlightWhileABlockComputes on rank [0-9]: .*waited for before any block computed"
        "parked_blocks:2_Ring.Holds:2:Step2_Ring.HoldsAtMostTwoRemoteBlocks on rank [0-9]: .*held outside the Tensor allocator"
        "cached_blocks:2:2:Step2_Ring.HoldsAtMostTwoRemoteBlocks on rank [0-9]: .*held outside the Tensor allocator"
        "parked_backward:3_Ring.Holds:2:Step3_Ring.HoldsAtMostTwoRemoteBlocksAndTwoGradientBlocks on rank [0-9]: .*held outside the Tensor allocator"
        "dkdv_stay:3:2:Step3_Ring.GradientsEqualFullAttentionF32 on rank [0-9]: .*close_chunks.g.dkv, g.want.dkv.*dkv not within.*the worst element is d[KV], key chunk"
        "arrival_order:4:2:Step4_AllToAll.EqualsFullAttentionF32 on rank [0-9]: .*close_on_every_rank.u.y, u.want_y"
        # the model with step 2's ring names the first tensor the reversed ring changes
        "ring_reversed:2_Model:4:Step2_Model.LossEqualsSingleDeviceF32 on rank [0-9]: .*first divergence: blocks\\.0\\.attn\\.y, forward, ranks 1, 2 "
        "partial_overlap:2_Ring.Next:2:Step2_Ring.NextBlockInFlightWhileABlockComputes on rank [0-9]: .*waited for while a block was still computing"
        # bf16 K/V widened to f32 on the wire: the bf16 run's bytes
        "upcast_kv:2_Ring.Sends:2:Step2_Ring.SendsCpMinusOneBlocks on rank [0-9]: ring forward: sent [0-9]+ bytes.*bf16 K/V blocks"
        # cp = 1: the last hop home sent to itself; a ring of one rank sends nothing
        "cp1_self_send:3_Ring.Sends:1:Step3_Ring.SendsEachBlockAndItsGradient on rank 0: .*a ring of one rank sends nothing"
        # the K/V stream is the tag of the call's first send, not "a tag with cp-1 receives"
        "tags_kv_waited:3_Ring.Next:2:Step3_Ring.NextBlockInFlightWhileABlockComputes on rank [0-9]: .*0 of 1 K/V block receives .not counting the dK/dV."
        # the whole step: said by the batch test, not a hang in Step3_PlantedFault's baseline
        "dkdv_in_kv_batch:3:2:Step3_Ring.PostsEachStepAsOneBatch on rank [0-9]: .*ring backward: 1 of 2 dK/dV receives posted before"
        "written_attention:4_AllToAll.Flash:2:Step4_AllToAll.FlashAttentionOnItsHeadsOnly on rank [0-9]: .*forward: [0-9]+ FLOPs of matrix multiplies")
# Messages between the wrong ranks stop the ring at its next compute (cptest::RingWatch ends the
# job with the failed verdict). star: each rank's own block sent straight to rank
# r+s+1 (a ring only at 2 ranks: 3); pow2_ring: neighbours by a power-of-two mask, which at 3
# ranks would hang (rank 2 sends to itself); stopped in the step's first test, the memory check.
if(SCALELAB_BUILD_TESTS)
  foreach(case "star|2|Step2_Ring.Sends*|Step2_Ring.SendsCpMinusOneBlocks"
               "star|3|Step3_Ring.Holds*|Step3_Ring.HoldsAtMostTwoRemoteBlocksAndTwoGradientBlocks"
               "pow2_ring|2|Step2_Ring.Holds*|Step2_Ring.HoldsAtMostTwoRemoteBlocks")
    string(REPLACE "|" ";" case "${case}")
    list(POP_FRONT case plant step filter test)
    scalelab_add_planted_run(lab11.planted.${plant}.step${step}.np3 test_lab11_planted RANKS 3
        FILTER ${filter} PLANT ${plant} LAB 11
        REGEX "${test} on rank [0-9]: ring [a-z]+: .*not between ring neighbours")
  endforeach()
  # Right on the host, stopped on the simulated GPU (the run there ends the job at the first op
  # given host and sim tensors: a verdict "error", tests/support/on_sim.hpp): a buffer made
  # without the device it is used beside, in each step's whole model.
  foreach(case "block_scratch_on_host|2|Step2_Model|flash_attention_forward"
               "dkv_on_host|3|Step3_Model|add"
               "heads_output_on_host|4|Step4_Model|flash_attention_forward")
    string(REPLACE "|" ";" case "${case}")
    list(POP_FRONT case plant step suite op)
    scalelab_add_sim_plant(11 ${plant} RANKS 2 FILTER Step${step}*
        TEST ${suite}.RunsOnTheSimulatedGpuAsOnTheHost STOP ".*${op}.* (cpu.* sim|sim.* cpu)")
  endforeach()
  # upcast_kv in step 3 (step 2's entry is a CASE above): the backward's bf16 bytes
  scalelab_add_planted_run(lab11.planted.upcast_kv.step3.np2 test_lab11_planted RANKS 2
      FILTER Step3_Ring.Sends* PLANT upcast_kv LAB 11
      REGEX "Step3_Ring.SendsEachBlockAndItsGradient on rank [0-9]: .*ring backward .bf16.")
endif()
# A control that must PASS: step 3's graders on the planted copy with step 2 not written
# (SCALELAB_PLANT=step2_not_written): they use the grader's own forward, not the attendee's.
if(SCALELAB_BUILD_TESTS)
  scalelab_add_mpi_test(lab11.planted.step3_without_step2.np2 test_lab11_planted RANKS 2
                        TIMEOUT 60 LABELS reference lab11 ARGS --gtest_filter=Step3*)
  set_tests_properties(lab11.planted.step3_without_step2.np2 PROPERTIES
                       ENVIRONMENT "${SCALELAB_MPI_TEST_ENV};SCALELAB_PLANT=step2_not_written")
  # A control that must PASS: two dK/dV buffers allocated once (README step 3's design), whose
  # peak of tensors is held while flash attention's backward runs: the kernel's own host scratch
  # on top of it is the library's, allowed beside the tensors (cptest::heap_allowance). Failed on
  # 4 ranks at a fixed 24 KiB of bookkeeping (an attendee's walk-through).
  # A control that must PASS: the reference ring with other tags (K/V 1, dK/dV 0, home 2),
  # overlapped: the K/V stream is told by the call's first send's tag (it failed when the stream
  # was "the tag with cp-1 receives": the dK/dV's has as many when home goes on its own tag).
  scalelab_add_mpi_test(lab11.planted.tags_other_ok.np2 test_lab11_planted RANKS 2
                        TIMEOUT 60 LABELS reference lab11 ARGS --gtest_filter=Step3_Ring.*)
  set_tests_properties(lab11.planted.tags_other_ok.np2 PROPERTIES
                       ENVIRONMENT "${SCALELAB_MPI_TEST_ENV};SCALELAB_PLANT=tags_other_ok")
  foreach(ranks 2 4)
    scalelab_add_mpi_test(lab11.planted.dkdv_buffers_once.np${ranks} test_lab11_planted
                          RANKS ${ranks} TIMEOUT 60 LABELS reference lab11
                          ARGS --gtest_filter=Step3_Ring.*)
    set_tests_properties(lab11.planted.dkdv_buffers_once.np${ranks} PROPERTIES
                         ENVIRONMENT "${SCALELAB_MPI_TEST_ENV};SCALELAB_PLANT=dkdv_buffers_once")
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
  # cp = 1: a ring of one rank sends nothing, and the printed formula says so (it said 2 MiB)
  scalelab_add_mpi_test(lab11.program.ring_cp1_sends_nothing.np1 lab11_context_parallel_solution
                        RANKS 1 TIMEOUT 60 LABELS reference lab11
                        ARGS --model tiny --steps 1 --batch 2 --twin-steps 1
                             --data ${PROJECT_BINARY_DIR}/tests/common/bf16_corpus)
  set(lab11_cp1_line "attention sent \\(ring\\): 0\\.000 MiB; formula 0\\.000 MiB")
  set_tests_properties(lab11.program.ring_cp1_sends_nothing.np1 PROPERTIES
                       FIXTURES_REQUIRED bf16_corpus PASS_REGULAR_EXPRESSION "${lab11_cp1_line}")
endif()
# The attendee's object's symbols beside the test binaries (cmake/ScalelabOwnWork.cmake): its
# static storage is bounded by the memory steps (tests/support/own_work.hpp).
scalelab_attendee_symbols(11 context_parallel context_parallel.cpp)
