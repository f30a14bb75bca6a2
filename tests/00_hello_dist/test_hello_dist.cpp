// Lab 00 graders. Suites are named Step<K>_... so each step runs (and is graded) on its own.
#include <algorithm>
#include <functional>
#include <map>
#include <ostream>
#include <stdexcept>

#include <gtest/gtest.h>

#include "common/comm/stats.hpp"
#include "common/errors.hpp"
#include "common/runtime.hpp"
#include "hello_dist.hpp"
#include "tests/support/lab_fixture.hpp"
#include "tests/support/traffic_budget.hpp"

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

// A bad value must be a UsageError that names its variable: the job script's typo is then found
// by name (a silent 0 would put every rank on slot 0).
testing::AssertionResult usage_error_naming(std::map<std::string, std::string> vars,
                                            const std::string& name) {
  try {
    placement_from_env(env_of(vars));
  } catch (const UsageError& e) {
    if (std::string(e.what()).find(name) != std::string::npos) return testing::AssertionSuccess();
    return testing::AssertionFailure() << "the UsageError for " << name << "='" << vars[name]
                                       << "' does not name " << name << ": '" << e.what() << "'";
  } catch (const std::exception& e) {
    return testing::AssertionFailure() << name << "='" << vars[name] << "' threw '" << e.what()
                                       << "', not a scalelab::UsageError";
  }
  return testing::AssertionFailure() << name << "='" << vars[name]
                                     << "' was accepted: a value that is not a non-negative "
                                     << "integer is a UsageError naming the variable";
}

// Step 3's technique, from the ledger (labtest::traffic_of): the ranks talk. A closed-form
// answer gives every value check the right sum without a byte sent, so the test also holds the
// step to one all-reduce (sum) on the communicator it is given, of one 64-bit number, and nothing
// else on any communicator.
testing::AssertionResult one_all_reduce_on(const comm::Traffic& did, const comm::Communicator& c) {
  int64_t calls = 0, bytes = 0;
  for (const auto& [key, count] : did) {
    if (key.op == "all_reduce" && key.reduce == "sum" && key.group == c.name() &&
        key.members == c.world_ranks()) {
      calls = count.calls;
      bytes = count.bytes;
      continue;
    }
    return testing::AssertionFailure()
           << "all_reduce_rank_ids sent " << comm::traffic_key_str(key) << " (" << count.calls
           << " call(s)): the sum needs one all-reduce (sum) on the communicator it is given, "
           << c.name() << ", and nothing else";
  }
  if (calls == 0)
    return testing::AssertionFailure()
           << "all_reduce_rank_ids sent nothing on " << c.name()
           << ": every rank must contribute its id through one all-reduce (sum) on the "
           << "communicator it is given, not compute the sum alone";
  if (calls != 1)
    return testing::AssertionFailure() << "all_reduce_rank_ids ran " << calls
                                       << " all-reduces on " << c.name() << ": one is enough";
  if (bytes != 8)
    return testing::AssertionFailure()
           << "all_reduce_rank_ids all-reduced " << bytes << " bytes on " << c.name()
           << ": the sum is one 64-bit number, 8 bytes (an i32/f32 sum is not exact for large "
           << "worlds)";
  return testing::AssertionSuccess();
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
  auto pmi = placement_from_env(env_of({{"PMI_LOCAL_RANK", "6"}}));
  EXPECT_EQ(pmi.local_rank, 6);
  EXPECT_EQ(pmi.source, "PMI_LOCAL_RANK") << "source: the variable the local rank came from";
  auto mv2 = placement_from_env(env_of({{"MV2_COMM_WORLD_LOCAL_RANK", "7"}}));
  EXPECT_EQ(mv2.local_rank, 7);
  EXPECT_EQ(mv2.source, "MV2_COMM_WORLD_LOCAL_RANK")
      << "source: the variable the local rank came from";
}

TEST(Step1_PlacementFromEnv, OpenMpiWinsOverSlurm) {
  // Open MPI started by srun sets both: the contract's order decides.
  auto p =
      placement_from_env(env_of({{"SLURM_LOCALID", "0"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}));
  EXPECT_EQ(p.local_rank, 2);
  EXPECT_EQ(p.source, "OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST(Step1_PlacementFromEnv, SlurmWinsOverHydra) {
  // srun starting an MPICH or Intel MPI program can leave both set: the contract's order decides.
  auto p = placement_from_env(env_of({{"MPI_LOCALRANKID", "1"}, {"SLURM_LOCALID", "3"}}));
  EXPECT_EQ(p.local_rank, 3) << "SLURM_LOCALID and MPI_LOCALRANKID both set: read the variables "
                             << "in the contract's order";
  EXPECT_EQ(p.source, "SLURM_LOCALID");
}

TEST(Step1_PlacementFromEnv, NothingKnown) {
  auto p = placement_from_env(env_of({{"HOME", "/root"}}));
  EXPECT_EQ(p.local_rank, -1);
  EXPECT_EQ(p.local_size, -1);
  EXPECT_EQ(p.node, -1);
}

TEST(Step1_PlacementFromEnv, GarbageIsAUsageError) {
  EXPECT_TRUE(usage_error_naming({{"SLURM_LOCALID", "abc"}}, "SLURM_LOCALID"));
  EXPECT_TRUE(usage_error_naming({{"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}},
                                 "OMPI_COMM_WORLD_LOCAL_RANK"));
  EXPECT_TRUE(usage_error_naming({{"SLURM_NODEID", "3x"}}, "SLURM_NODEID"));
  // The local size's variables are held to the same rule as the local rank's.
  EXPECT_TRUE(usage_error_naming(
      {{"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "abc"}},
      "OMPI_COMM_WORLD_LOCAL_SIZE"));
  EXPECT_TRUE(usage_error_naming({{"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "-2"}},
                                 "MPI_LOCALNRANKS"));
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
  EXPECT_EQ(p.local_rank, pair_rank)
      << "the placement is relative to the communicator passed in, not MPI_COMM_WORLD";
  EXPECT_EQ(p.local_size, pair_size)
      << "the placement is relative to the communicator passed in, not MPI_COMM_WORLD";
  EXPECT_EQ(p.node, 0);
  MPI_Comm_free(&pair);
}

namespace {
// A fake node split: the ranks of `comm` with equal node_of(rank) form one "node". On one
// machine the shared-memory split is always one node, so only a fake shows that the node index
// and the local rank come from the split.
NodeSplit fake_nodes(std::function<int(int rank)> node_of) {
  return [node_of](MPI_Comm comm) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm node;
    MPI_Comm_split(comm, node_of(rank), rank, &node);
    return node;
  };
}

struct FakePlacement {
  int local_rank, local_size, node;
};
std::ostream& operator<<(std::ostream& os, const FakePlacement& f) {
  return os << "local rank " << f.local_rank << ", local size " << f.local_size << ", node "
            << f.node;
}
bool operator==(const FakePlacement& a, const FakePlacement& b) {
  return a.local_rank == b.local_rank && a.local_size == b.local_size && a.node == b.node;
}
}  // namespace

TEST(Step1_PlacementFromComm, SeveralNodesFromTheSplit) {
  const int r = world_rank(), n = world_size();
  // Nodes of two ranks in a row, {0,1} {2,3}: node r/2, local rank r%2.
  const Placement blocks =
      placement_from_comm(MPI_COMM_WORLD, fake_nodes([](int k) { return k / 2; }));
  const FakePlacement got{blocks.local_rank, blocks.local_size, blocks.node};
  const FakePlacement want{r % 2, std::min(2, n - r / 2 * 2), r / 2};
  EXPECT_EQ(got, want)
      << "nodes {0,1} {2,3} from the split given: local rank and size are this rank's in its "
      << "node, node the index of its node (nodes ordered by their lowest rank)";
  // Nodes taken round-robin, {0,2} {1,3}: the node of rank r is r%2, its local rank r/2.
  const Placement strided =
      placement_from_comm(MPI_COMM_WORLD, fake_nodes([](int k) { return k % 2; }));
  const FakePlacement got_strided{strided.local_rank, strided.local_size, strided.node};
  const FakePlacement want_strided{r / 2, (n - r % 2 + 1) / 2, r % 2};
  EXPECT_EQ(got_strided, want_strided)
      << "nodes {0,2} {1,3} from the split given: local rank and size are this rank's in its "
      << "node, node the index of its node (nodes ordered by their lowest rank)";
  EXPECT_EQ(strided.source, "MPI_Comm_split_type");
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
  long long sum = -1;
  const comm::Traffic did = labtest::traffic_of([&] { sum = all_reduce_rank_ids(world); });
  EXPECT_EQ(sum, expected_rank_id_sum(world_size()));
  EXPECT_TRUE(one_all_reduce_on(did, world)) << "all_reduce_rank_ids(world)";
}

TEST(Step3_AllReduce, WorksOnASubCommunicator) {
  // Even and odd ranks: each group sums its own ranks (0,1,.. within the group).
  auto world = labtest::new_world();
  auto half = world.split(world.rank() % 2, world.rank(), "half");
  long long sum = -1;
  comm::Traffic did = labtest::traffic_of([&] { sum = all_reduce_rank_ids(half); });
  EXPECT_EQ(sum, expected_rank_id_sum(half.size()))
      << "comm.rank(): this group's rank, not the world's";
  EXPECT_TRUE(one_all_reduce_on(did, half)) << "all_reduce_rank_ids(half of the world)";
  // A world of one (the self backend) sums just its own id, 0.
  auto self = comm::Communicator::world("self");
  did = labtest::traffic_of([&] { sum = all_reduce_rank_ids(self); });
  EXPECT_EQ(sum, 0);
  EXPECT_TRUE(one_all_reduce_on(did, self)) << "all_reduce_rank_ids(a self world of one)";
}
