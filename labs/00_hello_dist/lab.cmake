scalelab_add_lab(00 hello_dist SOURCES hello_dist.cpp STEPS 3 RANKS 1 2 4 TIMEOUT 60)
# Planted submissions (solutions/00_*/planted/cheats.plant), each with the right sums: an
# all_reduce_rank_ids that returns the closed form without communicating fails step 3's traffic
# check; one that all-reduces an i32 (exact at 1, 2 and 4 ranks, not past 2^31) fails its bytes.
# A placement_from_env that reads hydra's variable before SLURM's, leaves `source` empty for the
# last two launchers, or takes a local size of abc or -2 without a usage error fails step 1, and
# a placement_from_comm that ignores the node split (node 0, local rank = rank in comm: right on
# one machine) fails step 1's faked two-node splits (4 ranks: two nodes of two).
scalelab_add_planted_submissions(00
  CASES "no_all_reduce:3:2:Step3_AllReduce.EveryRankGetsTheSum on rank [0-9]: all_reduce_rank_ids sent nothing on [a-z0-9_]+: every rank must contribute its id"
        "i32_sum:3:2:Step3_AllReduce.EveryRankGetsTheSum on rank [0-9]: all_reduce_rank_ids all-reduced 4 bytes on [a-z0-9_]+: .*an i32/f32 sum is not exact for large worlds"
        "hydra_before_slurm:1_PlacementFromEnv:1:Step1_PlacementFromEnv.SlurmWinsOverHydra on rank 0: .*SLURM_LOCALID and MPI_LOCALRANKID both set: read the variables in the contract's order"
        "no_late_source:1_PlacementFromEnv:1:Step1_PlacementFromEnv.HydraAndOthers on rank 0: .*source: the variable the local rank came from"
        "size_unchecked:1_PlacementFromEnv:1:Step1_PlacementFromEnv.GarbageIsAUsageError on rank 0: OMPI_COMM_WORLD_LOCAL_SIZE='abc' was accepted: a value that is not a non-negative integer is a UsageError naming the variable"
        "one_node:1_PlacementFromComm:4:Step1_PlacementFromComm.SeveralNodesFromTheSplit on rank [0-9]: .*nodes .0,1. .2,3. from the split given")
# The driver's usage errors: exit 2 and one "error: ..." line, before the table. The self
# backend on more than one rank is refused (each rank alone would sum its own id and print OK);
# --backend nccl in a build without NCCL is said before the table is printed.
if(SCALELAB_BUILD_TESTS)
  scalelab_expect_usage_errors(lab00.cli lab00_hello_dist_solution LABELS reference lab00
      CASES
      "2|self_on_two_ranks|^error: --backend self is a world of one rank: run it with -n 1, not -n 2$|--backend|self")
  if(NOT SCALELAB_WITH_NCCL)
    scalelab_expect_usage_errors(lab00.cli lab00_hello_dist_solution LABELS reference lab00
        CASES "1|nccl_without_nccl|^error: backend nccl: this build has no NCCL|--backend|nccl")
  endif()
endif()
