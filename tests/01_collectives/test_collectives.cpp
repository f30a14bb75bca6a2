// Lab 01 graders. Suites are named Step<K>_... so each step runs (and is graded) on its own.
// Tolerances: integer-valued floats make every sum exact in any order, so ring and library
// results are compared with ==; random floats are summed in a different order by the ring and the
// library, so they are compared at 1e-5 relative + 1e-6 absolute (the all-reduce tolerance of
// tests/support/lab_fixture.hpp).
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "collectives.hpp"
#include "common/comm/stats.hpp"
#include "common/runtime.hpp"
#include "tests/support/lab_fixture.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/traffic_budget.hpp"
#include "tests/support/what_it_did.hpp"

using namespace scalelab;
using namespace scalelab::lab01;

namespace {

// Sizes: empty, one, fewer than the ranks, not divisible by 2, 3 or 4, and large (in f64, more
// than the reference's 1 MiB segments per chunk, with chunks of unequal length).
const std::vector<int64_t> kSizes = {0, 1, 2, 7, 1001, 300007};

Tensor integers(int64_t n, int rank, DType dtype = DType::f32) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>((i % 113) * (rank + 1) - rank);
  return Tensor::from_vector(v, {n}, dtype);
}

// The chunk of a buffer of `numel` elements cut into `n` (chunk_begin) that element i falls in.
int chunk_of(int64_t numel, int n, int64_t i) {
  int k = 0;
  while (k + 1 < n && chunk_begin(numel, n, k + 1) <= i) ++k;
  return k;
}

// What a ring function may put on the wire (steps 2 and 3), checked on the library's ledger
// (labtest::traffic_of: every communicator, raw MPI counted): sends only to the right neighbour
// and receives only from the left one, on the communicator it is given, no collective, and in
// all one of the byte totals `sent` / `received` lists. The calls are free (segments, empty
// messages), the bytes are not. `ring_sends` says what the ring sends, for the message.
struct RingWire {
  std::string fn;
  int64_t buffer_bytes = 0;
  std::set<int64_t> sent, received;
  std::string ring_sends;
};

testing::AssertionResult only_the_ring(const comm::Traffic& did, const Communicator& c,
                                       const RingWire& want) {
  const int n = c.size(), rank = c.rank();
  const int right = c.world_ranks()[(rank + 1) % n], left = c.world_ranks()[(rank - 1 + n) % n];
  int64_t sent = 0, received = 0;
  for (const auto& [key, count] : did) {
    const bool p2p = key.op == "send" || key.op == "recv";
    if (!p2p && key.members.empty())  // labtest::traffic_of's row for MPI called directly
      return testing::AssertionFailure() << want.fn << " called MPI directly (" << key.op
                                         << "): build it from the communicator's send/recv";
    if (!p2p)
      return testing::AssertionFailure() << want.fn << " called " << key.op << " on group "
                                         << key.group << ": build it from send/recv";
    if (key.group != c.name() || key.members != c.world_ranks())
      return testing::AssertionFailure()
             << want.fn << ": " << comm::traffic_key_str(key)
             << ": the ring's messages go over the communicator it is given, " << c.name()
             << fmt::format(" [{}]", fmt::join(c.world_ranks(), " "));
    if (key.op == "send" && key.peer != right)
      return testing::AssertionFailure()
             << want.fn << " sent to world rank " << key.peer << " (from world rank "
             << c.world_ranks()[rank] << "): on the ring a rank sends only to its right "
             << "neighbour, world rank " << right;
    if (key.op == "recv" && key.peer != left)
      return testing::AssertionFailure()
             << want.fn << " received from world rank " << key.peer << " (on world rank "
             << c.world_ranks()[rank] << "): on the ring a rank receives only from its left "
             << "neighbour, world rank " << left;
    (key.op == "send" ? sent : received) += count.bytes;
  }
  auto times = [&](int64_t bytes) {
    return want.buffer_bytes ? fmt::format("{:.3g} x the buffer ({} of {} bytes)",
                                           static_cast<double>(bytes) / want.buffer_bytes, bytes,
                                           want.buffer_bytes)
                             : fmt::format("{} bytes", bytes);
  };
  if (!want.sent.count(sent))
    return testing::AssertionFailure() << want.fn << " sent " << times(sent) << ": "
                                       << want.ring_sends << fmt::format(
                                              " ({} bytes here)", fmt::join(want.sent, " or "));
  if (!want.received.count(received))
    return testing::AssertionFailure()
           << want.fn << " received " << times(received) << ": " << want.ring_sends
           << fmt::format(" ({} bytes here)", fmt::join(want.received, " or "));
  return testing::AssertionSuccess();
}

// "" when every operation `run` starts on this rank is waited for before it returns (the
// execution log: each submission and the waits on it). A send_async whose Work is dropped may
// still be reading its tensor when the caller writes it (DDP reuses its gradient buffer at
// once): right numbers in a test that looks once, wrong ones in a loop (measured: millions of
// wrong elements over 100 calls of a 1M-float ring).
std::string unwaited_operations(const std::string& fn, const std::function<void()>& run) {
  const labtest::Waits w = labtest::waits_in(labtest::log_of(run));
  if (w.unwaited.empty()) return "";
  std::vector<std::string> missing;
  for (const exec_log::Event& e : w.unwaited)
    missing.push_back(fmt::format("{} #{} ({} bytes, {} world rank {})", e.what, e.seq, e.bytes,
                                  e.what == "send" ? "to" : "from", e.peer));
  const std::size_t shown = std::min<std::size_t>(missing.size(), 3);
  return fmt::format(
      "{} returned with {} of the {} operations it started never waited for: {}{}. Until its "
      "Work is waited for, an operation may still read or write its tensor, which the caller "
      "owns again once you return: keep each Work (send_async's too) and wait for it",
      fn, missing.size(), w.started,
      fmt::join(missing.begin(), missing.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
      missing.size() > shown ? ", ..." : "");
}

}  // namespace

// ---- Step 1 -----------------------------------------------------------------------------------

TEST(Step1_EachCollective, ResultsOnEveryRank) {
  Communicator c = labtest::new_world();
  const int r = c.rank(), n = c.size();
  const auto results = run_each_collective(c);
  ASSERT_EQ(results.size(), step1_collectives().size());
  double sum = 0;
  for (int k = 0; k < n; ++k) sum += k + 1;
  std::vector<double> ranks(n), reduce_scatter_mine = {0};
  for (int k = 0; k < n; ++k) {
    ranks[k] = k;
    reduce_scatter_mine[0] += 10.0 * k + r;
  }
  for (const auto& res : results) {
    SCOPED_TRACE(res.name);
    EXPECT_EQ(res.before, step1_input(res.name, r, n)) << "before must be this rank's input";
    if (res.name == "all_reduce") EXPECT_EQ(res.after, (std::vector<double>{sum, 10 * sum}));
    if (res.name == "broadcast") EXPECT_EQ(res.after, (std::vector<double>{1, 10}));
    if (res.name == "reduce") {
      if (r == 0) EXPECT_EQ(res.after, (std::vector<double>{sum, 10 * sum}));
      else EXPECT_TRUE(res.after.empty()) << "off the root (rank 0) reduce gives nothing: "
                                          << "leave `after` empty there";
    }
    if (res.name == "all_gather") EXPECT_EQ(res.after, ranks);
    if (res.name == "reduce_scatter") EXPECT_EQ(res.after, reduce_scatter_mine);
    if (res.name == "scatter") EXPECT_EQ(res.after, (std::vector<double>{100.0 + r}));
    if (res.name == "gather") {
      if (r == 0) EXPECT_EQ(res.after, ranks);
      else EXPECT_TRUE(res.after.empty()) << "off the root (rank 0) gather gives nothing: "
                                          << "leave `after` empty there";
    }
  }
  for (std::size_t i = 0; i < results.size(); ++i)
    EXPECT_EQ(results[i].name, step1_collectives()[i]) << "results in step1_collectives() order";
}

// Step 1 with `device` the simulated GPU (host memory only the ops may touch, as a GPU's): the
// host's results, every tensor made there (an output left on the host is refused by the
// collective, as NCCL would refuse it; inputs made on the host put nothing on the device).
TEST(Step1_EachCollective, RunsOnTheSimulatedGpu) {
  Communicator c = labtest::new_world();
  const int r = c.rank(), n = c.size();
  const auto want = run_each_collective(c);
  std::vector<CollectiveResult> got;
  HostDeviceCopies moved;
  labtest::collective_run_on_sim([&] {
    const HostDeviceCopies before = host_device_copies();
    got = run_each_collective(c, Device::sim());
    moved = {host_device_copies().to_host - before.to_host,
             host_device_copies().to_device - before.to_device};
  });
  int64_t inputs = 0;  // the bytes of the inputs alone (f32)
  for (const std::string& name : step1_collectives())
    inputs += static_cast<int64_t>(step1_input(name, r, n).size()) * 4;
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].before, want[i].before) << got[i].name << " on the simulated GPU";
    EXPECT_EQ(got[i].after, want[i].after) << got[i].name << " on the simulated GPU";
  }
  if (moved.to_device < inputs)
    ADD_FAILURE() << "run_each_collective(comm, Device::sim()) copied " << moved.to_device
                  << " bytes to the device; the inputs alone are " << inputs << ": make each "
                  << "tensor on `device` (tensor_of(values, device)), outputs too";
}

// ---- Step 2 -----------------------------------------------------------------------------------

// Every size runs on every rank, a rank's first mismatch reported after the last: a rank that
// stopped at its own mismatch would leave the others waiting in the next size's ring.
TEST(Step2_RingAllReduce, EqualsLibraryExactlyOnIntegers) {
  Communicator c = labtest::new_world();
  std::string first_mismatch;
  // and chunk 0 one element past a whole number of 1 MiB (and 64 KiB, ...) segments, the others
  // exactly that: a segmented ring must walk the same segments on every rank
  std::vector<int64_t> sizes = kSizes;
  sizes.push_back(static_cast<int64_t>(c.size()) * 262144 + 1);
  for (DType dtype : {DType::f32, DType::f64}) {
    for (int64_t n : sizes) {
      Tensor mine = integers(n, c.rank(), dtype), lib = integers(n, c.rank(), dtype);
      ring_all_reduce(c, mine);
      c.all_reduce(lib);
      const auto a = mine.to_vector(), b = lib.to_vector();
      for (int64_t i = 0; i < n && first_mismatch.empty(); ++i) {
        if (a[i] == b[i]) continue;
        const int k = chunk_of(n, c.size(), i);
        first_mismatch = fmt::format(
            "numel {} {}, element {}: ring {}, library {}; the element is in chunk {} of {} "
            "(elements [{}, {})): a wrong chunk moved or added at some step, the chunk "
            "boundaries, or a chunk used before the receive that brings it was waited for",
            n, dtype_name(dtype), i, a[i], b[i], k, c.size(), chunk_begin(n, c.size(), k),
            chunk_begin(n, c.size(), k + 1));
      }
    }
  }
  EXPECT_TRUE(first_mismatch.empty()) << first_mismatch;
}

// The technique, from the ledger: 2(n-1) steps of one chunk each, to the right neighbour only,
// no collective. A rank sends every chunk but one in each phase, and the one it skips in the
// all-gather follows the one it skips in the reduce-scatter, whichever chunk a ring starts
// with: 2 numel - len(k) - len(k+1) elements for some k, 2(n-1)/n of the buffer when n divides
// it. Sizes: one (chunks empty), fewer than the ranks, divisible by 1 to 4 (1200), divisible by
// none, and in f64 more than the reference's 1 MiB segments per chunk.
TEST(Step2_RingAllReduce, SendsOneChunkAStepToTheRightNeighbourOnly) {
  Communicator c = labtest::new_world();
  const int n = c.size();
  // Every size runs on every rank (a rank that stopped would leave the others in the next ring);
  // the first problem and its size are reported after the last.
  testing::AssertionResult first_problem = testing::AssertionSuccess();
  std::string where;
  for (const auto& size : std::vector<std::pair<int64_t, DType>>{
           {1, DType::f32}, {7, DType::f32}, {1200, DType::f32}, {1001, DType::f32},
           {300007, DType::f64}}) {
    const int64_t numel = size.first;
    const DType dtype = size.second;
    const int64_t e = static_cast<int64_t>(dtype_size(dtype));
    RingWire want{"ring_all_reduce", numel * e, {}, {},
                  "a ring sends 2(n-1)/n of it, one chunk a step, and receives as much"};
    auto len = [&](int k) {
      return chunk_begin(numel, n, k % n + 1) - chunk_begin(numel, n, k % n);
    };
    for (int k = 0; k < n; ++k) want.sent.insert((2 * numel - len(k) - len(k + 1)) * e);
    want.received = want.sent;
    Tensor x = integers(numel, c.rank(), dtype);
    const comm::Traffic did = labtest::traffic_of([&] { ring_all_reduce(c, x); });
    if (first_problem && !(first_problem = only_the_ring(did, c, want)))
      where = fmt::format("numel {} {}", numel, dtype_name(dtype));
  }
  EXPECT_TRUE(first_problem) << where;
}

TEST(Step2_RingAllReduce, RandomFloatsWithinTolerance) {
  Communicator c = labtest::new_world();
  std::mt19937 rng(1234 + c.rank());
  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t n = 30011;
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  Tensor mine = Tensor::from_vector(v, {n}), lib = Tensor::from_vector(v, {n});
  ring_all_reduce(c, mine);
  c.all_reduce(lib);
  const auto a = mine.to_vector(), b = lib.to_vector();
  constexpr double rtol = labtest::kAllReduceRtol, atol = labtest::kAllReduceAtol;  // 1e-5, 1e-6
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(a[i], b[i], atol + rtol * std::abs(b[i])) << "element " << i << " of " << n;
}

TEST(Step2_RingAllReduce, AnyShapeAndViews) {
  Communicator c = labtest::new_world();
  Tensor x = integers(3 * 5 * 7, c.rank()).view({3, 5, 7});
  Tensor lib = integers(3 * 5 * 7, c.rank()).view({3, 5, 7});
  ring_all_reduce(c, x.rows(1, 3));  // only rows 1 and 2
  c.all_reduce(lib.rows(1, 3));
  EXPECT_TRUE(labtest::close_on_every_rank(x, lib, 0, 0))
      << "rows 1 and 2 of a (3, 5, 7) tensor all-reduced in place, row 0 untouched";
}

// Every operation the ring starts is waited for before it returns (the sizes of
// SendsOneChunkAStepToTheRightNeighbourOnly's sizes that carry data on every rank).
TEST(Step2_RingAllReduce, WaitsForEveryOperationItStarts) {
  Communicator c = labtest::new_world();
  std::string first;
  for (const auto& [numel, dtype] : std::vector<std::pair<int64_t, DType>>{
           {1001, DType::f32}, {300007, DType::f64}}) {
    Tensor x = integers(numel, c.rank(), dtype);
    const std::string p = unwaited_operations("ring_all_reduce", [&] { ring_all_reduce(c, x); });
    if (first.empty() && !p.empty()) first = fmt::format("numel {} {}: {}", numel, dtype_name(dtype), p);
  }
  if (!first.empty()) ADD_FAILURE() << first;
}

// On the simulated GPU (Device::sim: host memory that code outside the ops cannot reach, as a
// GPU's; the messages staged through the host, as CUDA tensors are): the same sums. A ring that
// adds its chunks by a loop through data<T>(), not with add_into (an op on a device), is right on
// the CPU and fails here with the tensor's line, as it would crash on a GPU (--device cuda).
TEST(Step2_RingAllReduce, RunsOnTheSimulatedGpu) {
  Communicator c = labtest::new_world();
  std::string problem;
  for (int64_t n : {int64_t{7}, int64_t{1001}}) {
    Tensor mine = integers(n, c.rank()).to(Device::sim()), lib = integers(n, c.rank());
    const std::string stopped = labtest::runs_on_sim([&] { ring_all_reduce(c, mine); });
    if (!stopped.empty()) {
      problem = fmt::format("numel {}, {}", n, stopped);
      break;  // every rank runs the same code: each stops here at the same size
    }
    c.all_reduce(lib);
    if (mine.device() != Device::sim() || mine.to_vector() != lib.to_vector()) {
      problem = fmt::format("numel {}: the ring on the simulated GPU is not the library's sum", n);
      break;
    }
  }
  if (!problem.empty()) ADD_FAILURE() << problem;
}

// ---- Step 3 -----------------------------------------------------------------------------------

// Every root and size runs on every rank, the first mismatch reported after the last (a rank that
// stopped at its own would leave the others waiting in the next broadcast).
TEST(Step3_RingBroadcast, EveryRootEverySize) {
  Communicator c = labtest::new_world();
  std::string first_mismatch;
  for (int root = 0; root < c.size(); ++root)
    for (int64_t n : kSizes) {
      Tensor x = integers(n, c.rank());
      ring_broadcast(c, x, root);
      const std::vector<double> got = x.to_vector(), want = integers(n, root).to_vector();
      for (int64_t i = 0; i < n && first_mismatch.empty(); ++i)
        if (got[i] != want[i])
          first_mismatch = fmt::format("root {}, numel {}: element {} is {}, the root's is {}",
                                       root, n, i, got[i], want[i]);
    }
  EXPECT_TRUE(first_mismatch.empty()) << first_mismatch;
  EXPECT_THROW(ring_broadcast(c, integers(1, 0), c.size()), std::invalid_argument);
}

// Every operation either step 3 ring starts is waited for before it returns, every root.
TEST(Step3_RingBroadcast, WaitsForEveryOperationItStarts) {
  Communicator c = labtest::new_world();
  std::string first;
  for (int root = 0; root < c.size(); ++root) {
    Tensor x = integers(1001, c.rank());
    const std::string p =
        unwaited_operations("ring_broadcast", [&] { ring_broadcast(c, x, root); });
    if (first.empty() && !p.empty()) first = fmt::format("root {}, numel 1001: {}", root, p);
  }
  if (!first.empty()) ADD_FAILURE() << first;
}

// From the ledger, every root: each rank but the root receives the buffer once from its left,
// each rank but the one before the root passes it on once to its right (in one message or in
// pieces), nothing else.
TEST(Step3_RingBroadcast, EachRankReceivesOnceFromTheLeftAndPassesItOn) {
  Communicator c = labtest::new_world();
  const int n = c.size(), rank = c.rank();
  const int64_t numel = 1001, bytes = numel * 4;
  testing::AssertionResult first_problem = testing::AssertionSuccess();  // every root runs
  std::string where;
  for (int root = 0; root < n; ++root) {
    RingWire want{"ring_broadcast", bytes, {(rank + 1) % n != root ? bytes : 0},
                  {rank != root ? bytes : 0},
                  "on the ring every rank but the root receives the buffer once, and every rank "
                  "whose right neighbour is not the root passes it on once"};
    Tensor x = integers(numel, rank);
    const comm::Traffic did = labtest::traffic_of([&] { ring_broadcast(c, x, root); });
    if (first_problem && !(first_problem = only_the_ring(did, c, want)))
      where = fmt::format("root {}, numel {} f32", root, numel);
  }
  EXPECT_TRUE(first_problem) << where;
}

// Every size runs on every rank, the first mismatch reported after the last.
TEST(Step3_RingAllGather, RankOrderEverySize) {
  Communicator c = labtest::new_world();
  std::string first_mismatch;
  for (int64_t n : kSizes) {
    if (n > 4096) continue;  // the gathered buffer is size times larger
    Tensor in = integers(n, c.rank());
    Tensor out = Tensor::zeros({n * c.size()});
    ring_all_gather(c, in, out);
    const auto got = out.to_vector();
    for (int r = 0; r < c.size(); ++r) {
      const auto want = integers(n, r).to_vector();
      for (int64_t i = 0; i < n && first_mismatch.empty(); ++i)
        if (got[r * n + i] != want[i])
          first_mismatch = fmt::format("numel {}: element {} of rank {}'s chunk (element {} of "
                                       "out) is {}, rank {}'s input has {}",
                                       n, i, r, r * n + i, got[r * n + i], r, want[i]);
    }
  }
  EXPECT_TRUE(first_mismatch.empty()) << first_mismatch;
}

TEST(Step3_RingAllGather, WaitsForEveryOperationItStarts) {
  Communicator c = labtest::new_world();
  Tensor in = integers(1001, c.rank()), out = Tensor::zeros({1001 * c.size()});
  const std::string p =
      unwaited_operations("ring_all_gather", [&] { ring_all_gather(c, in, out); });
  if (!p.empty()) ADD_FAILURE() << "numel 1001: " << p;
}

// Both step 3 rings on the simulated GPU (tests/support/on_sim.hpp), every root: the library's
// results exactly. A chunk copied by a loop through data<T>() stops there with the tensor's line,
// as it would crash on a GPU; the root's code and the others' differ, so the first such line ends
// the job (a rank that went on would wait in the ring for the stopped one).
TEST(Step3_RingAllGather, BothRingsRunOnTheSimulatedGpu) {
  Communicator c = labtest::new_world();
  const Device sim = Device::sim();
  std::string problem;
  labtest::collective_run_on_sim([&] {
    for (int64_t n : {int64_t{7}, int64_t{1001}}) {
      for (int root = 0; root < c.size() && problem.empty(); ++root) {
        Tensor x = integers(n, c.rank()).to(sim);
        ring_broadcast(c, x, root);
        if (x.device() != sim || x.to_vector() != integers(n, root).to_vector())
          problem = fmt::format("numel {}, root {}: the broadcast on the simulated GPU is not the "
                                "root's buffer", n, root);
      }
      Tensor in = integers(n, c.rank()).to(sim), out = Tensor::zeros({n * c.size()}, DType::f32, sim);
      ring_all_gather(c, in, out);
      Tensor lib = Tensor::zeros({n * c.size()});
      c.all_gather(integers(n, c.rank()), lib);
      if (problem.empty() && (out.device() != sim || out.to_vector() != lib.to_vector()))
        problem = fmt::format("numel {}: the all-gather on the simulated GPU is not the library's", n);
    }
  });
  if (!problem.empty()) ADD_FAILURE() << problem;
}

// From the ledger: n-1 chunks of `in`'s size to the right neighbour, as many from the left, one
// a step, nothing else.
TEST(Step3_RingAllGather, PassesNMinusOneChunksToTheRightNeighbourOnly) {
  Communicator c = labtest::new_world();
  const int n = c.size();
  const int64_t numel = 1001, bytes = numel * 4 * (n - 1);
  RingWire want{"ring_all_gather", numel * 4 * n, {bytes}, {bytes},
                "a ring all-gather passes on n-1 chunks of `in`'s size, one a step, and receives "
                "as many"};
  Tensor in = integers(numel, c.rank()), out = Tensor::zeros({numel * n});
  const comm::Traffic did = labtest::traffic_of([&] { ring_all_gather(c, in, out); });
  EXPECT_TRUE(only_the_ring(did, c, want)) << "numel " << numel << " f32 per rank";
}

// ---- Step 4 -----------------------------------------------------------------------------------

TEST(Step4_Busbw, FactorAsNcclTestsDefinesIt) {
  EXPECT_DOUBLE_EQ(all_reduce_busbw_factor(1), 0.0);
  EXPECT_DOUBLE_EQ(all_reduce_busbw_factor(2), 1.0);
  EXPECT_DOUBLE_EQ(all_reduce_busbw_factor(4), 1.5);
  EXPECT_DOUBLE_EQ(all_reduce_busbw_factor(8), 1.75);
  EXPECT_THROW(all_reduce_busbw_factor(0), std::invalid_argument);
}

TEST(Step4_BenchRow, MedianAlgbwBusbw) {
  // Odd count: the middle time (2 ms), whatever the order and the outliers.
  BenchRow r = make_bench_row(8'000'000, 2'000'000, 4, {0.010, 0.002, 0.001, 0.0021, 0.0019}, 0);
  EXPECT_EQ(r.bytes, 8'000'000u);
  EXPECT_EQ(r.count, 2'000'000);
  EXPECT_NEAR(r.time_us, 2000, 1e-6) << "time_us: the median of the sorted times, in microseconds";
  EXPECT_NEAR(r.algbw, 4.0, 1e-9) << "algbw in GB/s (1e9 bytes/s)";  // 8e6 B / 2e-3 s = 4 GB/s
  EXPECT_NEAR(r.busbw, 6.0, 1e-9);   // x 2(4-1)/4
  EXPECT_EQ(r.wrong, 0);
  // Even count: mean of the two middle ones.
  BenchRow e = make_bench_row(1000, 250, 2, {4e-6, 1e-6, 2e-6, 3e-6}, 7);
  EXPECT_NEAR(e.time_us, 2.5, 1e-9)
      << "time_us: the median of the sorted times (an even count), in microseconds";
  EXPECT_NEAR(e.algbw, 1000 / 2.5e-6 / 1e9, 1e-9) << "algbw in GB/s (1e9 bytes/s)";
  EXPECT_NEAR(e.busbw, e.algbw, 1e-12);
  EXPECT_EQ(e.wrong, 7);
  EXPECT_THROW(make_bench_row(4, 1, 2, {}, 0), std::invalid_argument);
}

// The given bench loop with your make_bench_row, on the library's all-reduce (so step 4 is graded
// on its own: your ring is step 2's).
TEST(Step4_Bench, SmallRunHasNoWrongElements) {
  Communicator c = labtest::new_world();
  BenchConfig config;
  config.min_bytes = 4;
  config.max_bytes = 4096;
  config.iters = 3;
  config.warmup = 1;
  auto rows = run_bench(c, /*ring=*/false, config);
  ASSERT_EQ(rows.size(), 11u);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].bytes, 4u << i);
    EXPECT_EQ(rows[i].count, 1 << i);
    EXPECT_EQ(rows[i].wrong, 0) << "at " << rows[i].bytes << " B";
    EXPECT_GT(rows[i].time_us, 0);
    EXPECT_NEAR(rows[i].busbw, rows[i].algbw * all_reduce_busbw_factor(c.size()), 1e-12);
  }
}
