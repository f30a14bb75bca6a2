// Lab 00 graders. Suites are named Step<K>_... so each step runs (and is graded) on its own.
#include <map>
#include <stdexcept>

#include <gtest/gtest.h>

#include "common/errors.hpp"
#include "common/runtime.hpp"
#include "hello_dist.hpp"
#include "tests/support/lab_fixture.hpp"

using namespace scalelab;
using namespace scalelab::lab00;

namespace {
EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}
}  // namespace

// ---- Step 1 -----------------------------------------------------------------------------------

TEST(Step1_PlacementFromEnv, OpenMpi) {
  auto p = placement_from_env(env_of({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"},
                                      {"OMPI_COMM_WORLD_SIZE", "16"}}));
  EXPECT_EQ(p.local_rank, 3);
  EXPECT_EQ(p.local_size, 8);
  EXPECT_EQ(p.node, -1) << "Open MPI does not say the node index: leave it to the fallback";
  EXPECT_EQ(p.source, "OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST(Step1_PlacementFromEnv, Slurm) {
  auto p = placement_from_env(env_of({{"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "5"},
                                      {"SLURM_JOB_ID", "42"}, {"SLURM_PROCID", "11"}}));
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.node, 5);
  EXPECT_EQ(p.local_size, -1);
  EXPECT_EQ(p.source, "SLURM_LOCALID");
}

TEST(Step1_PlacementFromEnv, HydraAndOthers) {
  auto hydra = placement_from_env(env_of({{"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "4"}}));
  EXPECT_EQ(hydra.local_rank, 2);
  EXPECT_EQ(hydra.local_size, 4);
  EXPECT_EQ(hydra.source, "MPI_LOCALRANKID");
  EXPECT_EQ(placement_from_env(env_of({{"PMI_LOCAL_RANK", "6"}})).local_rank, 6);
  EXPECT_EQ(placement_from_env(env_of({{"MV2_COMM_WORLD_LOCAL_RANK", "7"}})).local_rank, 7);
}

TEST(Step1_PlacementFromEnv, OpenMpiWinsOverSlurm) {
  // Open MPI started by srun sets both: the contract's order decides.
  auto p = placement_from_env(env_of({{"SLURM_LOCALID", "0"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}));
  EXPECT_EQ(p.local_rank, 2);
  EXPECT_EQ(p.source, "OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST(Step1_PlacementFromEnv, NothingKnown) {
  auto p = placement_from_env(env_of({{"HOME", "/root"}}));
  EXPECT_EQ(p.local_rank, -1);
  EXPECT_EQ(p.local_size, -1);
  EXPECT_EQ(p.node, -1);
}

TEST(Step1_PlacementFromEnv, GarbageIsAUsageError) {
  EXPECT_THROW(placement_from_env(env_of({{"SLURM_LOCALID", "abc"}})), UsageError);
  EXPECT_THROW(placement_from_env(env_of({{"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}})), UsageError);
  EXPECT_THROW(placement_from_env(env_of({{"SLURM_NODEID", "3x"}})), UsageError);
}

TEST(Step1_PlacementFromComm, OneNodeHoldsEveryRank) {
  // The tests run on one machine: every rank shares memory with every other.
  auto p = placement_from_comm(MPI_COMM_WORLD);
  EXPECT_EQ(p.local_rank, world_rank());
  EXPECT_EQ(p.local_size, world_size());
  EXPECT_EQ(p.node, 0);
  EXPECT_EQ(p.source, "MPI_Comm_split_type");
}

TEST(Step1_PlacementFromComm, WorksOnASubCommunicator) {
  // Pairs of ranks {0,1}, {2,3}, ...: the placement is relative to the communicator passed in,
  // not to MPI_COMM_WORLD. (One machine is one node, so the node index stays 0.)
  MPI_Comm pair;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() / 2, world_rank(), &pair);
  auto p = placement_from_comm(pair);
  int pair_rank = 0, pair_size = 0;
  MPI_Comm_rank(pair, &pair_rank);
  MPI_Comm_size(pair, &pair_size);
  EXPECT_EQ(p.local_rank, pair_rank);
  EXPECT_EQ(p.local_size, pair_size);
  EXPECT_EQ(p.node, 0);
  MPI_Comm_free(&pair);
}

TEST(Step1_FindPlacement, EnvFirstThenFallback) {
  auto p = find_placement(env_of({{"SLURM_LOCALID", "3"}}), MPI_COMM_WORLD);
  EXPECT_EQ(p.local_rank, 3);
  EXPECT_EQ(p.source, "SLURM_LOCALID");
  EXPECT_EQ(p.local_size, world_size()) << "the environment did not say: the fallback must";
  EXPECT_EQ(p.node, 0);

  auto q = find_placement(env_of({}), MPI_COMM_WORLD);
  EXPECT_EQ(q.local_rank, world_rank());
  EXPECT_EQ(q.source, "MPI_Comm_split_type");
}

// ---- Step 2 -----------------------------------------------------------------------------------

TEST(Step2_ChooseDevice, NoGpuMeansCpu) {
  EXPECT_EQ(choose_device(0, 0, true), "cpu");
  EXPECT_EQ(choose_device(5, 0, true), "cpu");
}

TEST(Step2_ChooseDevice, CpuWhenAsked) { EXPECT_EQ(choose_device(1, 8, false), "cpu"); }

TEST(Step2_ChooseDevice, OneGpuPerLocalRank) {
  EXPECT_EQ(choose_device(0, 4, true), "cuda:0");
  EXPECT_EQ(choose_device(3, 4, true), "cuda:3");
  EXPECT_EQ(choose_device(world_rank(), world_size(), true), fmt::format("cuda:{}", world_rank()));
}

TEST(Step2_ChooseDevice, MoreRanksThanGpusShareRoundRobin) {
  EXPECT_EQ(choose_device(4, 4, true), "cuda:0");
  EXPECT_EQ(choose_device(3, 2, true), "cuda:1");
  EXPECT_EQ(choose_device(2, 1, true), "cuda:0");
}

TEST(Step2_ChooseDevice, NegativeArgumentsAreRejected) {
  EXPECT_THROW(choose_device(-1, 2, true), std::invalid_argument);
  EXPECT_THROW(choose_device(0, -2, true), std::invalid_argument);
}

// ---- Step 3 -----------------------------------------------------------------------------------

TEST(Step3_AllReduce, ExpectedSum) {
  EXPECT_EQ(expected_rank_id_sum(1), 0);
  EXPECT_EQ(expected_rank_id_sum(2), 1);
  EXPECT_EQ(expected_rank_id_sum(4), 6);
  EXPECT_EQ(expected_rank_id_sum(100000), 4999950000LL) << "use 64-bit arithmetic";
}

TEST(Step3_AllReduce, EveryRankGetsTheSum) {
  auto world = labtest::new_world();
  EXPECT_EQ(all_reduce_rank_ids(world), expected_rank_id_sum(world_size()));
}

TEST(Step3_AllReduce, WorksOnASubCommunicator) {
  // Even and odd ranks: each group sums its own ranks (0,1,.. within the group).
  auto world = labtest::new_world();
  auto half = world.split(world.rank() % 2, world.rank(), "half");
  EXPECT_EQ(all_reduce_rank_ids(half), expected_rank_id_sum(half.size()));
  // A world of one (the self backend) sums just its own id, 0.
  auto self = comm::Communicator::world("self");
  EXPECT_EQ(all_reduce_rank_ids(self), 0);
}
