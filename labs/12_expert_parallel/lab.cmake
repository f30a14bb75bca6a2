# Lab 12: expert parallelism. Steps 1-2 (the router; dispatch and combine) are one device: one
# rank. Steps 3-4 exchange tokens over 2 and 4 ranks (step 3 on 1 rank too: ep = 1 is the
# single device and must give it exactly).
# STEP_USES: which earlier steps' code each step's graders run (measured: ctest labNN.step_uses)
scalelab_add_lab(12 expert_parallel SOURCES expert_parallel.cpp
                 GIVEN ep_model.cpp
                 STEPS 4 RANKS 1 2 4
                 STEP_RANKS "1:1" "2:1" "4:4"
                 STEP_USES "4:3"
                 OPTIONAL_STEPS 4  # the core (steps 1-3) fits 80 minutes: README.md
                 TIMEOUT 60)
# The .bss / .data of the attendee's object (step 3's memory check bounds them: 4 KiB).
scalelab_attendee_symbols(12 expert_parallel expert_parallel.cpp)
# Bad input: one "error:" line and exit 2 on every rank, before any data is read.
if(SCALELAB_BUILD_TESTS)
  set(lab12_data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)  # never read: checks come first
  scalelab_expect_usage_errors(lab12.cli lab12_expert_parallel_solution LABELS reference lab12
      ARGS --model tiny-moe --data ${lab12_data}
      CASES
      "2|top_k_above_experts|^error: --top-k 5: choose 1 to the 4 experts|--top-k|5"
      "3|experts_not_divisible|^error: --ep 3: the 4 experts do not split evenly|--ep|3"
      # no --ep: ep is every rank, and the message says so (it used to name an --ep not given)
      "3|experts_not_divisible_default_ep|^error: 3 ranks: the 4 experts do not split evenly over them .without --ep, ep is every rank.: give --ep 1"
      "2|capacity_not_positive|^error: --capacity-factor 0: must be a finite number above 0|--capacity-factor|0"
      "2|capacity_nan|^error: --capacity-factor nan: expected a finite number|--capacity-factor|nan"
      "2|capacity_inf|^error: --capacity-factor inf: expected a finite number|--capacity-factor|inf"
      # --sweep-factors: each item whole a finite number above 0, every one checked up front
      # (a bad later factor used to be found after the first factor's runs)
      "2|sweep_factor_nan|^error: --sweep-factors 'nan': 'nan' is not a capacity factor|--sweep|--sweep-factors|nan"
      "2|sweep_factor_inf|^error: --sweep-factors 'inf': 'inf' is not a capacity factor|--sweep|--sweep-factors|inf"
      "2|sweep_factor_late_negative|^error: --sweep-factors '1,-1': '-1' is not a capacity factor|--sweep|--sweep-factors|1,-1"
      "2|sweep_factor_trailing_text|^error: --sweep-factors '1abc': '1abc' is not a capacity factor|--sweep|--sweep-factors|1abc"
      "2|sweep_factors_empty|^error: --sweep-factors '': '' is not a capacity factor|--sweep|--sweep-factors="
      "2|sweep_factors_without_sweep|^error: --sweep-factors is for --sweep|--sweep-factors|abc"
      # with --sweep a --capacity-factor was silently not used
      "2|capacity_with_sweep|^error: --capacity-factor and --sweep: |--sweep|--capacity-factor|2"
      "4|ep_not_dividing_world|^error: --ep 3: the expert-parallel group must divide the 4 ranks|--ep|3"
      "1|dense_model|^error: --model: lab 12 needs a mixture-of-experts model|--model|tiny"
      "2|sweep_and_diverge|^error: --sweep and --diverge: choose one|--sweep|--diverge")
endif()
# Planted submissions (solutions/12_expert_parallel/planted/cheats.plant): one copy of the reference
# with every wrong technique the graders must stop, each switched on by SCALELAB_PLANT; the
# step's graders run on it and must fail at the check named (right numbers, wrong technique,
# where the technique is what is wrong).
scalelab_add_planted_submissions(12
  CASES "capacity_ignored:1_Router.Counts:1:Step1_Router.CountsGatesAndLossAgainstAHandCountAtADrawnShape on rank 0: .*dropped pairs"
        "capacity_unset:1_Router.Counts:1:Step1_Router.CountsGatesAndLossAgainstAHandCountAtADrawnShape on rank 0: .*Routing::capacity"
        "dest_unset:1_Router.Counts:1:Step1_Router.CountsGatesAndLossAgainstAHandCountAtADrawnShape on rank 0: .*Routing::dest was left unset"
        "aux_without_gradient:1_Router.Top2:1:Step1_Router.Top2BackwardAgainstFiniteDifferences on rank 0: .*dlogits"
        "aux_scale_ignored:1:1:Step1_Router.Top1BackwardAgainstFiniteDifferences on rank 0: .*dlogits of sum.gates R. . 0.37 aux"
        "dye_not_set:2:1:Step2_DispatchCombine.BackwardAgainstFiniteDifferences on rank 0: .*gradients off the finite differences: dye .combine_backward."
        "gather_tokens:3_Exchange:2:Step3_Exchange.RowsReachTheirExpertsAndComeBackInTheFormulasBytes on rank [0-9]: .*all_gather"
        "rank_major:3_Exchange:2:Step3_Exchange.RowsReachTheirExpertsAndComeBackInTheFormulasBytes on rank [0-9]: .*every row arrived, rank by rank: not grouped by expert"
        "counts_again:3:2:Step3_Layer.ForwardAndBackwardExchangeTheFormulasBytes on rank [0-9]: .*one more exchange of the counts"
        "every_expert_here:3_Layer.Each:2:Step3_Layer.EachRankComputesOnlyItsExpertsTokens on rank [0-9]: .*FLOPs"
        "every_expert_here:3_Memory:4:Step3_Memory.NoRankHoldsEveryExpert on rank [0-9]: .*other ranks' experts"
        "experts_in_vector:3:2:Step3_Memory.NoRankHoldsEveryExpert on rank [0-9]: .*bytes of the heap at once, as much as the other ranks' experts"
        # the planting audit's (each on the fewest ranks that show it: CI time)
        "library_route:1_Router.Counts:1:Step1_Router.CountsGatesAndLossAgainstAHandCountAtADrawnShape on rank 0: route.. did [0-9]+ matrix multiply FLOPs"
        "top1_renormalised:1_Router.Counts:1:Step1_Router.CountsGatesAndLossAgainstAHandCountAtADrawnShape on rank 0: .*Routing::gates: token [0-9]+ choice 0 is 1, not"
        "aux_per_token:1_Router.Counts:1:Step1_Router.CountsGatesAndLossAgainstAHandCountAtADrawnShape on rank 0: .*Routing::aux, the balancing loss"
        "capacity_unclamped:1_Router.Counts:1:Step1_Router.CountsGatesAndLossAgainstAHandCountAtADrawnShape on rank 0: .*Routing::capacity: [0-9]+, but an expert may take"
        "dlogits_accumulated:1_Router.Top1:1:Step1_Router.Top1BackwardAgainstFiniteDifferences on rank 0: .*dlogits came in holding 1.0: it is set"
        "one_hot_dispatch:2_DispatchCombine.Equals:1:Step2_DispatchCombine.EqualsTheMaskedDenseReferenceAtADrawnShape on rank 0: dispatch did [0-9]+ matrix multiply FLOPs"
        "host_loop_dispatch:2_DispatchCombine.Equals:1:Step2_DispatchCombine.EqualsTheMaskedDenseReferenceAtADrawnShape on rank 0: dispatch passed [0-9]+ bytes of tensor values through the host"
        "data_loop_dispatch:2_DispatchCombine.RunsOn:1:Step2_DispatchCombine.RunsOnTheSimulatedGpuAsOnTheHost on rank 0: on the simulated GPU .--device sim.: host code reached the elements of .* f64 sim through data<T>.., outside an op"
        "sim_scope_opened:2_DispatchCombine.RunsOn:1:Step2_DispatchCombine.RunsOnTheSimulatedGpuAsOnTheHost on rank 0: the attendee.s file calls SimKernelScope .*which only the ops may"
        "dx_overwritten:2_DispatchCombine.Backward:1:Step2_DispatchCombine.BackwardAgainstFiniteDifferences on rank 0: gradients off the finite differences: dx .dispatch_backward"
        "top1_no_dgates:2_DispatchCombine.Top1:1:Step2_DispatchCombine.Top1BackwardAgainstFiniteDifferences on rank 0: gradients off the finite differences: dgates .combine_backward."
        "exchange_f32:3_Exchange:1:Step3_Exchange.RowsReachTheirExpertsAndComeBackInTheFormulasBytes on rank 0: the same exchange of bf16 rows: .*bf16 rows sent as 4-byte numbers"
        "recompute_experts:3_Layer.Each:1:Step3_Layer.EachRankComputesOnlyItsExpertsTokens on rank 0: .*the MoE backward's GEMMs did"
        "kept_clones:3_Memory:1:Step3_Memory.NoRankHoldsEveryExpert on rank 0: .*not copies of the rows"
        "aux_sums_on_host:1_Router.RunsOn:1:Step1_Router.RunsOnTheSimulatedGpuAsOnTheHost on rank 0: on the simulated GPU .--device sim.: .*(cpu.* sim|sim.* cpu)"
        "global_plan:3_Layer.Two:1:Step3_Layer.TwoForwardsThenTwoBackwardsKeepTheirOwnPlans on rank 0: forward A, forward B, backward A, backward B: A's dx")
# The exchange's receive buffer made on the host: the collective stages it, the grouping by expert
# then refuses it on the simulated GPU (the run there ends the job: a verdict "error",
# tests/support/on_sim.hpp).
if(SCALELAB_BUILD_TESTS)
  scalelab_add_sim_plant(12 received_rows_on_host RANKS 2 FILTER Step3*
      TEST Step3_Model.RunsOnTheSimulatedGpuAsOnTheHost STOP mixed)
endif()
# The program on the planted submission whose backward exchanges the counts again (counts_again):
# its all-to-all bytes differ from the formula on every rank, it exits 1, and its last line says
# what failed.
if(SCALELAB_BUILD_TESTS)
  add_executable(lab12_expert_parallel_planted $<TARGET_OBJECTS:lab12_main>)
  target_link_libraries(lab12_expert_parallel_planted PRIVATE lab12_planted_submission_impl)
  add_dependencies(lab12_reference lab12_expert_parallel_planted)
  set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
      $<TARGET_FILE:lab12_expert_parallel_planted> ${MPIEXEC_POSTFLAGS} --model tiny-moe --steps 1
      --batch 4 --twin-steps 1 --data ${PROJECT_BINARY_DIR}/tests/common/bf16_corpus)
  list(JOIN cmd "|" cmd)
  add_test(NAME lab12.program.planted_counts_again.np2
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${cmd}" -DEXPECT_CODE=1
                   "-DEXPECT_REGEX=rank 0: [0-9]+ bytes, formula [0-9]+  .DIFFERENT.@@FAILED: the all-to-all bytes of rank.s. 0, 1 differ from the formula: step 3's exchange"
                   -DMAX_SECONDS=60 -P ${PROJECT_SOURCE_DIR}/tests/common/expect_exit.cmake)
  set_tests_properties(lab12.program.planted_counts_again.np2 PROPERTIES PROCESSORS 2 TIMEOUT 90
                       LABELS "reference;lab12" FIXTURES_REQUIRED bf16_corpus
                       ENVIRONMENT "${SCALELAB_MPI_TEST_ENV};SCALELAB_PLANT=counts_again")
endif()
# On a GPU (label gpu; skipped without one): the reference's step with CUDA tensors against the
# CPU (tests/12_expert_parallel/test_gpu.cpp), not a graded step.
scalelab_add_lab_gpu_tests(12)
# The program on 2 ranks (fp32) and 4 ranks (bf16, ep 2 x dp 2): exit 0 only when its losses
# follow the single-device twin's (fp32 1e-5, bf16 1e-3 relative) and the all-to-all bytes equal
# the formula. On tests/common's corpus (a fixture).
if(SCALELAB_BUILD_TESTS)
  foreach(case "f32|2|2|fp32" "bf16_ep2_dp2|4|2|bf16")
    string(REPLACE "|" ";" case "${case}")
    list(POP_FRONT case name ranks ep precision)
    scalelab_add_mpi_test(lab12.program.${name}.np${ranks} lab12_expert_parallel_solution
                          RANKS ${ranks} TIMEOUT 60 LABELS reference lab12
                          ARGS --model tiny-moe --steps 2 --batch 4 --twin-steps 2 --ep ${ep}
                               --precision ${precision}
                               --data ${PROJECT_BINARY_DIR}/tests/common/bf16_corpus)
    set_tests_properties(lab12.program.${name}.np${ranks} PROPERTIES FIXTURES_REQUIRED bf16_corpus)
  endforeach()
  # A capacity factor of 1e300 (finite, so valid) keeps every pair: the capacity is clamped at a
  # group's (token, choice) pairs instead of overflowing int64 into moe_route's check (exit 1).
  foreach(case "huge_capacity|--capacity-factor|1e300" "sweep_huge_capacity|--sweep|--sweep-factors|1e300")
    string(REPLACE "|" ";" case "${case}")
    list(POP_FRONT case name)
    scalelab_add_mpi_test(lab12.program.${name}.np2 lab12_expert_parallel_solution
                          RANKS 2 TIMEOUT 60 LABELS reference lab12
                          ARGS --model tiny-moe --steps 1 --batch 4 --twin-steps 1 ${case}
                               --data ${PROJECT_BINARY_DIR}/tests/common/bf16_corpus)
    set_tests_properties(lab12.program.${name}.np2 PROPERTIES FIXTURES_REQUIRED bf16_corpus)
  endforeach()
endif()
