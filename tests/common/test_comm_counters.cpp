// Communication accounting (common/comm/stats.hpp) at 1, 2 and 4 ranks, on the mpi and self
// backends: a known sequence of every collective, blocking and async, send/recv and a split
// sub-group must give exactly the expected calls and payload bytes per (group, op); rejected calls,
// split and the matching check (on in tests) count nothing; reset, difference and the table; the
// finer ledger the graders budget (group members, reduction, peer) and the execution log.
#include <algorithm>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/comm/communicator.hpp"
#include "common/comm/op.hpp"
#include "common/comm/process_grid.hpp"
#include "common/comm/stats.hpp"
#include "common/comm/transports.hpp"
#include "common/errors.hpp"
#include "common/exec_log.hpp"
#include "common/ops/flash_attention.hpp"
#include "common/trace.hpp"
#include "common/runtime.hpp"

using namespace scalelab;
using comm::CommCount;
using comm::CommStats;
using comm::Communicator;

namespace {

// Exact comparison with a readable failure: both tables, then the maps themselves.
void expect_stats(const CommStats& got, const CommStats& want) {
  EXPECT_EQ(comm::format_comm_stats(got), comm::format_comm_stats(want));
  EXPECT_TRUE(got == want);
}

class Counters : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { c = Communicator::world(GetParam()); }
  Communicator c;
};

}  // namespace

TEST_P(Counters, KnownSequenceGivesExactCallsAndBytes) {
  const int n = c.size(), r = c.rank();
  const std::int64_t N = n;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  comm::reset_comm_stats();

  // all_reduce: the tensor's bytes. Blocking, then async (counted at submission, before wait).
  c.all_reduce(Tensor::zeros({10}));                            // 40 B
  Tensor d = Tensor::zeros({3}, DType::f64);
  comm::Work w = c.all_reduce_async(d, comm::ReduceOp::max);    // 24 B
  EXPECT_EQ((comm::comm_stats()[{"world", "all_reduce"}]), (CommCount{2, 64}));
  w.wait();
  c.reduce(Tensor::zeros({5}), /*root=*/n - 1);                  // 20 B
  c.broadcast(Tensor::zeros({7}, DType::i32), /*root=*/0);      // 28 B
  // all_gather: the output (n x 4 floats); reduce_scatter: the input (n x 6 floats).
  c.all_gather(Tensor::zeros({4}), Tensor::zeros({4 * N}));
  c.reduce_scatter_async(Tensor::zeros({6 * N}), Tensor::zeros({6})).wait();
  // scatter and gather: n x the chunk, on every rank (root or not).
  c.scatter(Tensor::zeros({2 * N}, DType::f64), Tensor::zeros({2}, DType::f64), /*root=*/0);
  c.gather(Tensor::zeros({3}), Tensor::zeros({3 * N}), /*root=*/n - 1);
  c.barrier();
  c.barrier_async().wait();
  // send/recv: the message's bytes, around the ring, twice (32 B then 800 B).
  for (std::int64_t len : {8, 100}) {
    const DType dt = len == 8 ? DType::f32 : DType::f64;
    Tensor in = Tensor::zeros({len}, dt);
    comm::Work rw = c.recv_async(in, left);
    comm::Work sw = c.send_async(Tensor::zeros({len}, dt), right);
    sw.wait();
    rw.wait();
  }
  // A sub-group: counted under its own name; the split itself is not counted.
  Communicator half = c.split(r % 2, r, "half");
  const std::int64_t H = half.size();
  half.all_reduce(Tensor::zeros({16}));
  half.all_reduce_async(Tensor::zeros({16})).wait();
  half.all_gather(Tensor::zeros({1}), Tensor::zeros({H}));
  // Rejected calls count nothing: an undefined tensor, a root outside the group, a bad peer.
  EXPECT_THROW(c.all_reduce(Tensor()), CheckFailed);
  EXPECT_THROW(c.broadcast(Tensor::zeros({1}), n), CheckFailed);
  EXPECT_THROW(c.send(Tensor::zeros({1}), -1), CheckFailed);

  const CommStats want = {
      {{"world", "all_reduce"}, {2, 40 + 24}},
      {{"world", "reduce"}, {1, 20}},
      {{"world", "broadcast"}, {1, 28}},
      {{"world", "all_gather"}, {1, 16 * N}},
      {{"world", "reduce_scatter"}, {1, 24 * N}},
      {{"world", "scatter"}, {1, 16 * N}},
      {{"world", "gather"}, {1, 12 * N}},
      {{"world", "barrier"}, {2, 0}},
      {{"world", "send"}, {2, 32 + 800}},
      {{"world", "recv"}, {2, 32 + 800}},
      {{"half", "all_reduce"}, {2, 128}},
      {{"half", "all_gather"}, {1, 4 * H}},
  };
  const CommStats got = comm::comm_stats();
  expect_stats(got, want);
  EXPECT_EQ(comm::comm_total(got, "half"), (CommCount{3, 128 + 4 * H}));
  EXPECT_EQ(comm::comm_total(got, "", "all_reduce"), (CommCount{4, 64 + 128}));
  EXPECT_EQ(comm::comm_total(got).calls, 17);

  // Reset: empty, then counting starts again from zero.
  comm::reset_comm_stats();
  EXPECT_TRUE(comm::comm_stats().empty());
  c.barrier();
  expect_stats(comm::comm_stats(), {{{"world", "barrier"}, {1, 0}}});

  // The traffic between two snapshots.
  const CommStats before = comm::comm_stats();
  c.all_reduce(Tensor::zeros({10}));
  expect_stats(comm::comm_stats() - before, {{{"world", "all_reduce"}, {1, 40}}});
}

INSTANTIATE_TEST_SUITE_P(Backends, Counters, testing::Values("mpi", "self"),
                         [](const testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(CountersGrid, GridGroupsAreCountedUnderTheirNames) {
  auto world = Communicator::world("mpi");
  const int n = world.size();
  // dp x tp = n x 1 at 1 or 2 ranks, 2 x 2 at 4.
  const int tp = n == 4 ? 2 : 1, dp = n / tp;
  comm::reset_comm_stats();
  comm::ProcessGrid grid(world, dp, tp, 1);
  EXPECT_TRUE(comm::comm_stats().empty()) << "building the grid (splits) counts nothing";

  grid.tp().all_reduce(Tensor::zeros({8}));            // 32 B
  grid.dp().all_reduce(Tensor::zeros({8}, DType::f64));  // 64 B
  grid.dp().all_reduce(Tensor::zeros({8}, DType::f64));
  grid.tp_dp().reduce_scatter(Tensor::zeros({2 * static_cast<std::int64_t>(n)}), Tensor::zeros({2}));
  const CommStats want = {
      {{grid.tp().name(), "all_reduce"}, {1, 32}},
      {{grid.dp().name(), "all_reduce"}, {2, 128}},
      {{grid.tp_dp().name(), "reduce_scatter"}, {1, 8 * static_cast<std::int64_t>(n)}},
  };
  expect_stats(comm::comm_stats(), want);
  EXPECT_EQ(grid.tp().name(), fmt::format("tp{}", comm::tp_group_index(grid.shape(), grid.rank())));
}

TEST(CountersTable, FormatsOneLinePerGroupAndOpAndATotal) {
  const CommStats stats = {
      {{"world", "barrier"}, {1, 0}},
      {{"tp0", "all_reduce"}, {24, 3145728}},
  };
  EXPECT_EQ(comm::format_comm_stats(stats),
            "group  op          calls    bytes   MiB\n"
            "tp0    all_reduce     24  3145728  3.00\n"
            "world  barrier         1        0  0.00\n"
            "total                 25  3145728  3.00\n");
  EXPECT_EQ(comm::format_comm_stats({}), "(no communication)\n");
}

TEST(CountersThreads, ConcurrentCountingLosesNothing) {
  comm::reset_comm_stats();
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([] {
      for (int i = 0; i < 10000; ++i)
        comm::detail::count_op("threads", {0, 1}, comm::detail::OpKind::send, "", 1, 3, "mpi");
    });
  for (auto& t : threads) t.join();
  expect_stats(comm::comm_stats(), {{{"threads", "send"}, {40000, 120000}}});
  EXPECT_EQ((comm::traffic()[{"threads", {0, 1}, "send", "", 1}]), (CommCount{40000, 120000}));
  comm::reset_comm_stats();
  EXPECT_TRUE(comm::traffic().empty()) << "reset clears the ledger too";
}

// The ledger (comm::traffic()): per group name AND members, op, reduction and peer (world
// ranks). A duplicate of the world under another name is its own row; one under the same name
// and members shares the world's; a max all-reduce is not a sum; send/recv and rooted
// collectives name their peer or root; the execution log sees the same operations in order.
TEST(CountersLedger, GroupsReductionsAndPeersAreTold) {
  auto c = Communicator::world("mpi");
  const int n = c.size(), r = c.rank();
  std::vector<int> all(n);
  for (int k = 0; k < n; ++k) all[k] = k;
  comm::reset_comm_stats();
  exec_log::Recording recording;
  c.all_reduce(Tensor::zeros({4}));                                   // sum, 16 B
  c.all_reduce(Tensor::zeros({4}), comm::ReduceOp::max);              // max, 16 B
  c.reduce_scatter(Tensor::zeros({2 * static_cast<std::int64_t>(n)}), Tensor::zeros({2}),
                   comm::ReduceOp::avg);
  c.broadcast(Tensor::zeros({1}), n - 1);
  Communicator twin = c.split(0, r, "world");    // same name, same members: the world's row
  Communicator mine = c.split(0, r, "private");  // same members, its own name: its own row
  twin.all_reduce(Tensor::zeros({4}));
  mine.all_gather(Tensor::zeros({1}), Tensor::zeros({static_cast<std::int64_t>(n)}));
  if (n > 1) {
    Tensor in = Tensor::zeros({3});
    comm::Work rw = c.recv_async(in, (r + n - 1) % n, 5);
    c.send(Tensor::zeros({3}), (r + 1) % n, 5);
    rw.wait();
  }
  comm::Traffic want = {
      {{"world", all, "all_reduce", "sum", -1}, {2, 32}},
      {{"world", all, "all_reduce", "max", -1}, {1, 16}},
      {{"world", all, "reduce_scatter", "avg", -1}, {1, 8 * n}},
      {{"world", all, "broadcast", "", n - 1}, {1, 4}},
      {{"private", all, "all_gather", "", -1}, {1, 4 * n}},
  };
  if (n > 1) {
    want[{"world", all, "send", "", (r + 1) % n}] = {1, 12};
    want[{"world", all, "recv", "", (r + n - 1) % n}] = {1, 12};
  }
  EXPECT_TRUE(comm::traffic() == want);
  // The same rows by transport: a host tensor on an mpi group, each over MPI.
  comm::TransportTraffic by = comm::traffic_by_transport();
  ASSERT_EQ(by.size(), want.size());
  for (const auto& [key, count] : want) EXPECT_EQ((by[{key, "mpi"}]), count);
  EXPECT_EQ(comm::transport_key_str({{"world", all, "all_reduce", "max", -1}, "mpi"}),
            fmt::format("all_reduce(max) on world [{}] over mpi", fmt::join(all, " ")));
  EXPECT_EQ(comm::traffic_key_str({"world", all, "all_reduce", "max", -1}),
            fmt::format("all_reduce(max) on world [{}]", fmt::join(all, " ")));
  // The submissions in order; the waits (every blocking call waits on its own Work) apart.
  std::vector<exec_log::Event> log, waits;
  for (const exec_log::Event& e : recording.events()) (e.what == "wait" ? waits : log).push_back(e);
  ASSERT_GE(log.size(), 6u);
  for (const exec_log::Event& e : log)  // every call here is waited for: a wait names each
    EXPECT_TRUE(std::any_of(waits.begin(), waits.end(), [&](const exec_log::Event& w) {
      return w.op == e.what && w.group == e.group && w.seq == e.seq;
    })) << e.what << " #" << e.seq << " on " << e.group << " has no wait";
  EXPECT_EQ(log[0].what, "all_reduce");
  for (const exec_log::Event& e : recording.events()) EXPECT_EQ(e.transport, "mpi") << e.what;
  EXPECT_EQ(log[3].what, "broadcast");
  EXPECT_EQ(log[3].peer, n - 1);
  EXPECT_EQ(log[5].group, "private");
  if (n > 1) {
    EXPECT_EQ(log[6].what, "recv");
    EXPECT_EQ(log[6].tag, 5);
    EXPECT_EQ(log[7].what, "send");
    EXPECT_EQ(log[7].peer, (r + 1) % n);
    // The recv posted before the send and waited for after it: the wait names the recv.
    const exec_log::Event& last = waits.back();
    EXPECT_EQ(last.op, "recv");
    EXPECT_EQ(last.seq, log[6].seq);
    EXPECT_EQ(last.peer, log[6].peer);
    EXPECT_EQ(last.tag, 5);
  }
  comm::reset_comm_stats();
}

// The overlap the execution log shows (lab 11's graders read it): a recv posted, a compute
// kernel, then the wait; and the no-overlap baseline (comm::set_overlap(false)) moves the waits
// before the next compute kernel. Order only, no timings. Also the trace's comm lanes: an
// operation in flight takes the lowest free lane, so overlapping operations never share a track.
TEST(CountersLedger, WaitsAreLoggedInOrderWithComputeAndTheBaselineWaitsFirst) {
  auto c = Communicator::world("mpi");
  const int n = c.size(), r = c.rank();
  if (n == 1) GTEST_SKIP() << "a ring needs two ranks";
  Tensor q = Tensor::zeros({1, 4, 8}), y = Tensor::zeros({1, 4, 8}), lse = Tensor::zeros({1, 4});
  const auto ring_step = [&] {
    exec_log::Recording recording;
    Tensor in = Tensor::zeros({3});
    comm::Work got = c.recv_async(in, (r + n - 1) % n, 7);
    comm::Work sent = c.send_async(Tensor::zeros({3}), (r + 1) % n, 7);
    ops::flash_attention_forward(y, lse, q, q, q, 1.0);
    got.wait();
    sent.wait();
    std::vector<std::string> order;  // "recv", "send", "wait recv", "flash_attention_forward"
    for (const exec_log::Event& e : recording.events())
      order.push_back(e.what == "wait" ? "wait " + e.op : e.what);
    return fmt::format("{}", fmt::join(order, ", "));
  };
  const double waited = comm::wait_seconds();
  EXPECT_EQ(ring_step(), "recv, send, flash_attention_forward, wait recv, wait send");
  EXPECT_GE(comm::wait_seconds(), waited);
  comm::set_overlap(false);
  EXPECT_FALSE(comm::overlap());
  const std::string baseline = ring_step();
  comm::set_overlap(true);
  EXPECT_EQ(baseline, "recv, send, wait recv, wait send, flash_attention_forward, wait recv, wait send");

  EXPECT_EQ(trace::acquire_comm_lane(), 0);
  EXPECT_EQ(trace::acquire_comm_lane(), 1);
  trace::release_comm_lane(0);
  EXPECT_EQ(trace::acquire_comm_lane(), 0);  // the lowest free one
  trace::release_comm_lane(0);
  trace::release_comm_lane(1);
}
