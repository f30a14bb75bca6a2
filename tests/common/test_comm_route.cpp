// Which transport moves each operation (common/comm/route.hpp), and whether NCCL takes ranks that
// share a GPU (common/comm/gpu_sharing.hpp): pure functions, the whole table on a CPU. Every op
// kind x where its tensors live x backend x (NCCL built, NCCL refusing the ranks) x (a message to
// oneself), against the rule written out independently below.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/comm/gpu_sharing.hpp"
#include "common/comm/route.hpp"

using namespace scalelab::comm::detail;

namespace {

const std::vector<OpKind> kKinds = {
    OpKind::all_reduce, OpKind::reduce,  OpKind::broadcast, OpKind::all_gather,
    OpKind::reduce_scatter, OpKind::scatter, OpKind::gather, OpKind::barrier,
    OpKind::send,       OpKind::recv,    OpKind::split,     OpKind::all_to_all};
const std::vector<Residence> kWhere = {Residence::none, Residence::host, Residence::cuda,
                                       Residence::mixed};

std::string str(const Route& r) {
  static const char* errors[] = {"", " error no_nccl", " error gpu_shared", " error mixed_devices"};
  return std::string(transport_name(r.transport)) + errors[static_cast<int>(r.error)] +
         (r.staged_for_sharing ? " (staged: GPU shared)" : "");
}

// The rule, case by case as the issue states it: "on a group whose backend is nccl, CUDA
// tensors go to NCCL and host tensors to the group's MPI communicator".
std::string expected(const RouteQuery& q) {
  const bool tensors = q.kind != OpKind::barrier && q.kind != OpKind::split;
  if (q.backend == "self") return "self";
  if (q.backend == "mpi") return "mpi";  // CUDA tensors staged by the mpi backend
  if (!tensors || q.where == Residence::host || q.where == Residence::none) return "mpi";
  if (q.backend == "nccl") {
    if (!q.nccl_built) return "mpi error no_nccl";
    if (q.where == Residence::mixed) return "mpi error mixed_devices";
    if ((q.kind == OpKind::send || q.kind == OpKind::recv) && q.to_self) return "self";
    if (q.nccl_refused) return "mpi error gpu_shared";
    return "nccl";
  }
  // auto: NCCL where it can, staging through MPI where it cannot
  if (!q.nccl_built || q.where == Residence::mixed) return "mpi";
  if ((q.kind == OpKind::send || q.kind == OpKind::recv) && q.to_self) return "self";
  if (q.nccl_refused) return "mpi (staged: GPU shared)";
  return "nccl";
}

}  // namespace

TEST(Route, EveryKindDeviceAndBackend) {
  int cases = 0;
  for (const char* backend : {"self", "mpi", "nccl", "auto"})
    for (OpKind kind : kKinds)
      for (Residence where : kWhere)
        for (bool built : {false, true})
          for (bool refused : {false, true})
            for (bool to_self : {false, true}) {
              const RouteQuery q{backend, kind, where, to_self, built, refused};
              EXPECT_EQ(str(route(q)), expected(q))
                  << backend << " " << op_kind_name(kind) << " residence "
                  << static_cast<int>(where) << " built " << built << " refused " << refused
                  << " to_self " << to_self;
              ++cases;
            }
  EXPECT_EQ(cases, 4 * 12 * 4 * 8);
}

// The two halves of the anchor, spelled out: a loss (host f64) on an nccl group goes to
// MPI, a gradient (CUDA) to NCCL; a pipeline stage's message to itself (one rank, interleaved
// chunks) is a copy, never a lone ncclSend/ncclRecv to self.
TEST(Route, HostValuesOnNcclGroupsGoToMpi) {
  EXPECT_EQ(route({"nccl", OpKind::all_reduce, Residence::host, false, true, false}).transport,
            Transport::mpi);
  EXPECT_EQ(route({"nccl", OpKind::all_reduce, Residence::cuda, false, true, false}).transport,
            Transport::nccl);
  EXPECT_EQ(route({"nccl", OpKind::recv, Residence::cuda, true, true, false}).transport,
            Transport::self);
  EXPECT_EQ(route({"nccl", OpKind::send, Residence::cuda, false, true, false}).transport,
            Transport::nccl);
  EXPECT_EQ(route({"auto", OpKind::all_gather, Residence::host, false, true, false}).transport,
            Transport::mpi);
}

TEST(GpuSharing, RanksPerGpu) {
  EXPECT_EQ(ranks_per_gpu(1, 1), 1);
  EXPECT_EQ(ranks_per_gpu(2, 1), 2);
  EXPECT_EQ(ranks_per_gpu(4, 8), 1);
  EXPECT_EQ(ranks_per_gpu(8, 8), 1);
  EXPECT_EQ(ranks_per_gpu(9, 8), 2);
  EXPECT_EQ(ranks_per_gpu(4, 0), 0);  // no GPU: nothing for NCCL to refuse
}

// Inputs: ranks per node, GPUs per node, NCCL's version, NCCL_MULTI_RANK_GPU_ENABLE.
TEST(GpuSharing, WhenNcclAcceptsRanksOnOneGpu) {
  struct Case {
    int ranks, gpus, version;
    const char* env;
    bool accepts;
  };
  const Case cases[] = {
      {1, 1, 22803, "", true},     // one rank, one GPU
      {8, 8, 22803, "", true},     // one rank per GPU
      {4, 0, 22803, "", true},     // no GPU at all (a CPU node)
      {2, 1, 22803, "", false},    // the H100 box of the issue: 2.28.3 refuses
      {2, 1, 22803, "1", false},   // ... even with the variable (it is 2.30's)
      {2, 1, 23000, "", false},    // 2.30 without the variable
      {2, 1, 23000, "0", false},
      {2, 1, 23000, "1", true},    // 2.30 with it: 2 ranks on one GPU
      {2, 1, 23105, "1", true},
      {3, 1, 23000, "1", false},   // more than 2 on one GPU
      {9, 8, 23000, "1", true},    // one GPU holds 2
      {9, 8, 22803, "", false},
      {2, 1, 2906, "1", false},    // an old code (2.9.6)
  };
  for (const Case& c : cases)
    EXPECT_EQ(nccl_accepts(ranks_per_gpu(c.ranks, c.gpus), c.version, c.env), c.accepts)
        << c.ranks << " ranks, " << c.gpus << " GPUs, NCCL " << c.version << ", env '" << c.env
        << "'";
}

TEST(GpuSharing, NamesTheRanksTheGpuAndTheWaysOut) {
  // Two nodes: node 0 (ranks 0-2, 2 GPUs: ranks 0 and 2 on GPU 0), node 3 (ranks 3, 4 on GPU 0).
  const std::vector<GpuSlot> slots = {{0, 0, "a"}, {0, 1, "a"}, {0, 0, "a"}, {3, 0, "b"},
                                      {3, 0, "b"}};
  const SharedGpus all = shared_gpus(slots, {0, 1, 2, 3, 4});
  EXPECT_EQ(all.most, 2);
  EXPECT_EQ(all.text, "ranks 0,2 share GPU 0 of node a; ranks 3,4 share GPU 0 of node b");
  // A group whose members are on different GPUs shares nothing (a world of one never does).
  EXPECT_EQ(shared_gpus(slots, {0, 1, 3}).most, 1);
  EXPECT_EQ(shared_gpus(slots, {1}).text, "");
  EXPECT_EQ(shared_gpus({{0, -1, "cpu"}, {0, -1, "cpu"}}, {0, 1}).most, 0);
  const std::string line = sharing_refused_message(shared_gpus(slots, {3, 4}), 22803);
  EXPECT_EQ(line, "ranks 3,4 share GPU 0 of node b, and NCCL 2.28.3 refuses ranks that share a "
                  "GPU: run one rank per GPU, or --backend mpi (CUDA tensors staged through host "
                  "memory), or NCCL >= 2.30.0 with NCCL_MULTI_RANK_GPU_ENABLE=1 (at most 2 ranks "
                  "per GPU)");
  EXPECT_EQ(nccl_version_string(22803), "2.28.3");
  EXPECT_EQ(nccl_version_string(2906), "2.9.6");
}

// Where each rank sees only its own GPU (SLURM's --gpus-per-task=1: CUDA_VISIBLE_DEVICES set per
// rank), every rank's GPU is device 0: the UUIDs say they are four GPUs, shared by none. And two
// ranks whose indexes differ (one sees every GPU, one only the second) on the same UUID share it.
TEST(GpuSharing, TheUuidSaysWhichGpuNotTheIndex) {
  const std::vector<GpuSlot> one_each = {{0, 0, "a", "GPU-0a"}, {0, 0, "a", "GPU-0b"},
                                         {0, 0, "a", "GPU-0c"}, {0, 0, "a", "GPU-0d"}};
  EXPECT_EQ(shared_gpus(one_each, {0, 1, 2, 3}).most, 1);
  EXPECT_EQ(shared_gpus(one_each, {0, 1, 2, 3}).text, "");
  const std::vector<GpuSlot> same = {{0, 1, "a", "GPU-1b"}, {0, 0, "a", "GPU-1b"},
                                     {0, 0, "a", "GPU-0a"}};
  const SharedGpus shared = shared_gpus(same, {0, 1, 2});
  EXPECT_EQ(shared.most, 2);
  EXPECT_EQ(shared.text, "ranks 0,1 share GPU 1 (GPU-1b) of node a");
}
