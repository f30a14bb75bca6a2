// Collective semantics of the Communicator on the mpi and self backends, at 1, 2, 3 and 4 ranks
// (3 catches chunking that assumes a power of two or a divisible size).
//
// Tolerance: every value is an integer-valued float below 2^24, so sums, max, min and
// broadcasts are exact in any reduction order: the tests compare with ==. avg is the exact sum
// divided once by the group size, computed the same way here, so it is compared with == too.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/comm/communicator.hpp"
#include "common/comm/stats.hpp"
#include "common/errors.hpp"
#include "common/runtime.hpp"

using namespace scalelab;
using comm::Communicator;
using comm::ReduceOp;

namespace {

// Sizes: empty, one, small, not divisible by 2, 3 or 4, and large (4 MiB of f32).
const std::vector<int64_t> kSizes = {0, 1, 7, 1001, 1 << 20};

// Rank r's i-th value: small integers, different on every rank.
double value(int r, int64_t i) { return static_cast<double>((r + 1) * (i % 97) + r); }

Tensor filled(int64_t n, int r, DType dtype) {
  Tensor t = Tensor::empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::f32) t.data<float>()[i] = static_cast<float>(value(r, i));
    else t.data<double>()[i] = value(r, i);
  }
  return t;
}

double at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::f32 ? static_cast<double>(t.data<float>()[i]) : t.data<double>()[i];
}

// Reduction over ranks of value(r, i), as the backend computes it in dtype.
double expected(ReduceOp op, int n, int64_t i, DType dtype) {
  double acc = value(0, i);
  for (int r = 1; r < n; ++r) {
    if (op == ReduceOp::max) acc = std::max(acc, value(r, i));
    else if (op == ReduceOp::min) acc = std::min(acc, value(r, i));
    else acc += value(r, i);
  }
  if (op == ReduceOp::avg)
    return dtype == DType::f32 ? static_cast<double>(static_cast<float>(acc) / static_cast<float>(n))
                               : acc / n;
  return acc;
}

// First index where `t` differs from f(i), or -1.
template <class F>
int64_t first_mismatch(const Tensor& t, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i)
    if (at(t, i) != f(i)) return i;
  return -1;
}

struct Param {
  std::string backend;
  DType dtype;
};

std::string param_name(const testing::TestParamInfo<Param>& p) {
  return p.param.backend + "_" + dtype_name(p.param.dtype);
}

class Collectives : public testing::TestWithParam<Param> {
 protected:
  void SetUp() override { c = Communicator::world(GetParam().backend); }
  DType dt() const { return GetParam().dtype; }
  Communicator c;
};

}  // namespace

TEST_P(Collectives, AllReduceEveryOpAndSize) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
    for (int64_t n : kSizes) {
      Tensor t = filled(n, c.rank(), dt());
      c.all_reduce(t, op);
      int64_t bad = first_mismatch(t, n, [&](int64_t i) { return expected(op, c.size(), i, dt()); });
      ASSERT_EQ(bad, -1) << comm::reduce_op_name(op) << " n=" << n << " at " << bad << ": got "
                         << at(t, bad) << " want " << expected(op, c.size(), bad, dt());
    }
  }
}

TEST_P(Collectives, AllReduceAnyShape) {
  Tensor t = Tensor::empty({3, 4, 5}, dt());
  for (int64_t i = 0; i < 60; ++i) t.flat(i, 1).copy_from(filled(i + 1, c.rank(), dt()).flat(i, 1));
  c.all_reduce(t);
  EXPECT_EQ(first_mismatch(t, 60, [&](int64_t i) { return expected(ReduceOp::sum, c.size(), i, dt()); }), -1);
  // A view of rows 1..2 reduces only those rows.
  Tensor u = filled(60, c.rank(), dt()).view({3, 20});
  c.all_reduce(u.rows(1, 3));
  for (int64_t i = 0; i < 60; ++i) {
    double want = i < 20 ? value(c.rank(), i) : expected(ReduceOp::sum, c.size(), i, dt());
    ASSERT_EQ(at(u, i), want) << i;
  }
}

TEST_P(Collectives, ReduceToLastRank) {
  const int root = c.size() - 1;
  for (int64_t n : kSizes) {
    Tensor t = filled(n, c.rank(), dt());
    c.reduce(t, root, ReduceOp::sum);
    if (c.rank() == root)
      ASSERT_EQ(first_mismatch(t, n, [&](int64_t i) { return expected(ReduceOp::sum, c.size(), i, dt()); }), -1)
          << "n=" << n;
  }
}

TEST_P(Collectives, BroadcastFromMiddleRank) {
  const int root = c.size() / 2;
  for (int64_t n : kSizes) {
    Tensor t = filled(n, c.rank(), dt());
    c.broadcast(t, root);
    ASSERT_EQ(first_mismatch(t, n, [&](int64_t i) { return value(root, i); }), -1) << "n=" << n;
  }
}

TEST_P(Collectives, AllGatherInRankOrder) {
  for (int64_t n : kSizes) {
    Tensor in = filled(n, c.rank(), dt());
    Tensor out = Tensor::zeros({n * c.size()}, dt());
    c.all_gather(in, out);
    ASSERT_EQ(first_mismatch(out, n * c.size(), [&](int64_t j) { return value(static_cast<int>(j / std::max<int64_t>(n, 1)), j % std::max<int64_t>(n, 1)); }), -1)
        << "n=" << n;
  }
  // Shapes do not matter, only counts: (2, 3) pieces into a (size*2, 3) tensor.
  Tensor in = filled(6, c.rank(), dt()).view({2, 3});
  Tensor out = Tensor::zeros({2 * c.size(), 3}, dt());
  c.all_gather(in, out);
  for (int r = 0; r < c.size(); ++r)
    for (int64_t i = 0; i < 6; ++i) ASSERT_EQ(at(out, r * 6 + i), value(r, i));
}

// all_to_all (lab 11's Ulysses): chunk s of my output is chunk `my rank` of rank s's input; the
// byte counters count the input's bytes; the two tensors must be of one size.
TEST_P(Collectives, AllToAllTransposesTheRanksChunks) {
  for (int64_t n : kSizes) {
    const int64_t N = n * c.size();
    Tensor in = filled(N, c.rank(), dt());
    Tensor out = Tensor::zeros({N}, dt());
    const comm::CommStats before = comm::comm_stats();
    c.all_to_all(in, out);
    EXPECT_EQ(comm::comm_total(comm::comm_stats() - before, "", "all_to_all").bytes,
              static_cast<std::int64_t>(in.nbytes()));
    const int64_t w = std::max<int64_t>(n, 1);
    ASSERT_EQ(first_mismatch(out, N, [&](int64_t j) {
                return value(static_cast<int>(j / w), c.rank() * n + j % w);
              }), -1) << "n=" << n;
  }
  EXPECT_THROW(c.all_to_all(Tensor::zeros({4 * c.size()}, dt()), Tensor::zeros({4 * c.size() + 1}, dt())),
               CheckFailed);
}

// all_to_all with per-peer counts (lab 12's token exchange): rank r sends rank d (r + 2d) % 3
// elements (some chunks empty), each naming (r, d, i); every rank gets each source's chunk in
// rank order; the ledger counts the bytes this rank sent (they differ by rank); wrong totals are
// refused.
TEST_P(Collectives, AllToAllWithCountsDeliversEachPeersChunk) {
  const int n = c.size(), me = c.rank();
  const auto count = [](int from, int to) { return static_cast<int64_t>((from + 2 * to) % 3); };
  const auto code = [](int from, int to, int64_t i) {
    return static_cast<double>(from * 100 + to * 10 + i);
  };
  std::vector<int64_t> send(n), recv(n);
  std::vector<double> values;
  for (int d = 0; d < n; ++d) {
    send[d] = count(me, d);
    recv[d] = count(d, me);
    for (int64_t i = 0; i < send[d]; ++i) values.push_back(code(me, d, i));
  }
  int64_t total_in = 0, total_out = 0;
  for (int d = 0; d < n; ++d) total_in += send[d], total_out += recv[d];
  const Tensor in = Tensor::from_vector(values, {total_in}, dt());
  Tensor out = Tensor::zeros({total_out}, dt());
  const comm::CommStats before = comm::comm_stats();
  c.all_to_all(in, send, out, recv);
  EXPECT_EQ(comm::comm_total(comm::comm_stats() - before, "", "all_to_all").bytes,
            static_cast<std::int64_t>(in.nbytes()));
  int64_t at_out = 0;
  for (int s = 0; s < n; ++s)
    for (int64_t i = 0; i < recv[s]; ++i, ++at_out)
      ASSERT_EQ(at(out, at_out), code(s, me, i)) << "from rank " << s << " element " << i;
  std::vector<int64_t> too_many = send;
  too_many[0] += 1;
  EXPECT_THROW(c.all_to_all(in, too_many, out, recv), CheckFailed);
  EXPECT_THROW(c.all_to_all(in, std::vector<int64_t>(n + 1, 0), out, recv), CheckFailed);
}

TEST_P(Collectives, ReduceScatterGivesEachRankItsChunk) {
  for (int64_t n : kSizes) {
    Tensor in = filled(n * c.size(), c.rank(), dt());
    Tensor out = Tensor::zeros({n}, dt());
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      c.reduce_scatter(in, out, op);
      const int64_t base = n * c.rank();
      ASSERT_EQ(first_mismatch(out, n, [&](int64_t i) { return expected(op, c.size(), base + i, dt()); }), -1)
          << "n=" << n << " " << comm::reduce_op_name(op);
    }
  }
}

TEST_P(Collectives, ScatterAndGather) {
  const int root = c.size() - 1;
  for (int64_t n : kSizes) {
    // Root scatters value(root, .) over size*n elements: rank r gets elements [r*n, (r+1)*n).
    Tensor whole = filled(n * c.size(), root, dt());
    Tensor mine = Tensor::zeros({n}, dt());
    c.scatter(c.rank() == root ? whole : Tensor(), mine, root);
    ASSERT_EQ(first_mismatch(mine, n, [&](int64_t i) { return value(root, n * c.rank() + i); }), -1)
        << "scatter n=" << n;
    // Gather every rank's own values back to rank 0.
    Tensor in = filled(n, c.rank(), dt());
    Tensor out = c.rank() == 0 ? Tensor::zeros({n * c.size()}, dt()) : Tensor();
    c.gather(in, out, 0);
    if (c.rank() == 0)
      ASSERT_EQ(first_mismatch(out, n * c.size(), [&](int64_t j) { return value(static_cast<int>(j / n), j % n); }), -1)
          << "gather n=" << n;
  }
}

TEST_P(Collectives, SendRecvAroundTheRing) {
  const int right = (c.rank() + 1) % c.size(), left = (c.rank() + c.size() - 1) % c.size();
  for (int64_t n : kSizes) {
    Tensor out = filled(n, c.rank(), dt());
    Tensor in = Tensor::zeros({n}, dt());
    // recv first, then send, then wait: the order that cannot deadlock at any size.
    comm::Work r = c.recv_async(in, left);
    c.send(out, right);
    r.wait();
    ASSERT_EQ(first_mismatch(in, n, [&](int64_t i) { return value(left, i); }), -1) << "n=" << n;
  }
  // Tags keep two messages apart even when they are received in the other order.
  Tensor a = filled(5, c.rank(), dt()), b = filled(5, c.rank() + 10, dt());
  Tensor ra = Tensor::zeros({5}, dt()), rb = Tensor::zeros({5}, dt());
  comm::Work wb = c.recv_async(rb, left, /*tag=*/2);
  comm::Work wa = c.recv_async(ra, left, /*tag=*/1);
  comm::Work sa = c.send_async(a, right, 1);
  comm::Work sb = c.send_async(b, right, 2);
  wa.wait();
  wb.wait();
  sa.wait();
  sb.wait();
  EXPECT_EQ(first_mismatch(ra, 5, [&](int64_t i) { return value(left, i); }), -1);
  EXPECT_EQ(first_mismatch(rb, 5, [&](int64_t i) { return value(left + 10, i); }), -1);
}

// send_recv_async (a batch of send/recvs posted together): the same messages arrive as from the
// same calls unbatched (round the ring both ways, two tags, two sizes; with one rank, to itself),
// its Works are the ops' in order, and the ledger counts the same calls, peers and bytes.
TEST_P(Collectives, BatchedSendRecvEqualsTheSameCallsUnbatched) {
  const int n = c.size(), r = c.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const Tensor to_right = filled(1001, r, dt()), to_left = filled(7, r + 10, dt());
  const auto exchange = [&](bool batched) {
    std::vector<Tensor> got = {Tensor::zeros({1001}, dt()), Tensor::zeros({7}, dt())};
    c.barrier();
    const comm::Traffic before = comm::traffic();
    std::vector<comm::Work> works;
    if (batched) {
      works = c.send_recv_async({comm::P2POp::recv(got[0], left, 1), comm::P2POp::recv(got[1], right, 2),
                                 comm::P2POp::send(to_right, right, 1), comm::P2POp::send(to_left, left, 2)});
    } else {
      works = {c.recv_async(got[0], left, 1), c.recv_async(got[1], right, 2),
               c.send_async(to_right, right, 1), c.send_async(to_left, left, 2)};
    }
    EXPECT_EQ(works.size(), 4u);
    comm::wait_all(works);
    for (comm::Work& w : works) EXPECT_TRUE(w.test());
    return std::pair{got, comm::traffic() - before};
  };
  const auto [plain, plain_traffic] = exchange(false);
  const auto [batch, batch_traffic] = exchange(true);
  EXPECT_EQ(first_mismatch(batch[0], 1001, [&](int64_t i) { return value(left, i); }), -1);
  EXPECT_EQ(first_mismatch(batch[1], 7, [&](int64_t i) { return value(right + 10, i); }), -1);
  EXPECT_EQ(batch[0].to_vector(), plain[0].to_vector());
  EXPECT_EQ(batch[1].to_vector(), plain[1].to_vector());
  EXPECT_TRUE(batch_traffic == plain_traffic);
  std::int64_t sent = 0, received = 0;
  for (const auto& [key, count] : batch_traffic) {
    if (key.op == "send") sent += count.bytes;
    if (key.op == "recv") received += count.bytes;
  }
  const std::int64_t bytes = (1001 + 7) * static_cast<std::int64_t>(dtype_size(dt()));
  EXPECT_EQ(sent, bytes);
  EXPECT_EQ(received, bytes);
  // An empty batch posts nothing; a bad op anywhere in a batch posts none of it.
  EXPECT_TRUE(c.send_recv_async({}).empty());
  const comm::Traffic before = comm::traffic();
  Tensor spare = Tensor::zeros({3}, dt());
  EXPECT_THROW(c.send_recv_async({comm::P2POp::recv(spare, left), comm::P2POp::send(spare, n)}),
               CheckFailed);
  EXPECT_THROW(c.send_recv_async({comm::P2POp::recv(spare, left), comm::P2POp::send(Tensor(), right)}),
               CheckFailed);
  EXPECT_TRUE((comm::traffic() - before).empty());
}

TEST_P(Collectives, TwoOutstandingWorksCompleteInEitherWaitOrder) {
  for (bool reverse : {false, true}) {
    Tensor a = filled(1001, c.rank(), dt()), b = filled(1 << 16, c.rank(), dt());
    comm::Work wa = c.all_reduce_async(a);
    comm::Work wb = c.all_reduce_async(b, ReduceOp::max);
    if (reverse) {
      wb.wait();
      wa.wait();
    } else {
      wa.wait();
      wb.wait();
    }
    EXPECT_TRUE(wa.test());
    EXPECT_TRUE(wb.test());
    EXPECT_EQ(first_mismatch(a, 1001, [&](int64_t i) { return expected(ReduceOp::sum, c.size(), i, dt()); }), -1);
    EXPECT_EQ(first_mismatch(b, 1 << 16, [&](int64_t i) { return expected(ReduceOp::max, c.size(), i, dt()); }), -1);
  }
  // test() never blocks and eventually says done.
  Tensor t = filled(7, c.rank(), dt());
  comm::Work w = c.all_reduce_async(t);
  while (!w.test()) {
  }
  w.wait();
  c.barrier();
}

TEST_P(Collectives, LocalMisuseIsACheckFailure) {
  Tensor in = filled(4, c.rank(), dt());
  Tensor wrong = Tensor::zeros({4 * c.size() + 1}, dt());
  EXPECT_THROW(c.all_gather(in, wrong), CheckFailed);
  EXPECT_THROW(c.broadcast(in, c.size()), CheckFailed);
  EXPECT_THROW(c.send(in, -1), CheckFailed);
  EXPECT_THROW(c.all_reduce(Tensor()), CheckFailed);
  EXPECT_THROW(Communicator().barrier(), CheckFailed);
  EXPECT_THROW(Communicator::world("tcp"), UsageError);
}

INSTANTIATE_TEST_SUITE_P(Backends, Collectives,
                         testing::Values(Param{"mpi", DType::f32}, Param{"mpi", DType::f64},
                                         Param{"self", DType::f32}, Param{"self", DType::f64}),
                         param_name);

// ---- the matching check ------------------------------------------------------------------------

TEST(MatchingCheck, AllToAllCountsThatDisagreeAreAnErrorOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto c = Communicator::world("mpi");
  const int n = c.size();
  // every rank sends 1 element to every rank, but rank 0 expects 2 from rank 1
  std::vector<int64_t> send(n, 1), recv(n, 1);
  if (c.rank() == 0) recv[1] = 2;
  Tensor in = Tensor::zeros({n}), out = Tensor::zeros({n + (c.rank() == 0 ? 1 : 0)});
  try {
    c.all_to_all(in, send, out, recv);
    ADD_FAILURE() << "no error";
  } catch (const CheckFailed& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0's receive count from rank 1"), std::string::npos)
        << e.what();
  }
}

TEST(MatchingCheck, MismatchedSizesAreAClearErrorOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  ASSERT_TRUE(comm::check_matching()) << "the test main turns the check on";
  auto c = Communicator::world("mpi");
  Tensor t = Tensor::zeros({c.rank() == 1 ? 12 : 10});
  try {
    c.all_reduce(t);
    FAIL() << "no error";
  } catch (const CheckFailed& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("all_reduce #1"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 0: all_reduce of 10 f32"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1: all_reduce of 12 f32"), std::string::npos) << what;
  }
  // A different collective, or a different root, is caught the same way.
  Tensor u = Tensor::zeros({4});
  if (c.rank() == 0) EXPECT_THROW(c.broadcast(u, 0), CheckFailed);
  else EXPECT_THROW(c.all_reduce(u), CheckFailed);
  EXPECT_THROW(c.broadcast(u, c.rank() == 0 ? 0 : 1), CheckFailed);
  // The communicator is still usable afterwards.
  Tensor ok = Tensor::from_vector({1.0}, {1});
  c.all_reduce(ok);
  EXPECT_EQ(ok.item(0), c.size());
}

TEST(MatchingCheck, RecvOfTheWrongSizeIsAnError) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto c = Communicator::world("mpi");
  if (c.rank() == 0) c.send(Tensor::zeros({3}), 1);
  if (c.rank() == 1) {
    try {
      c.recv(Tensor::zeros({5}), 0);
      FAIL() << "no error";
    } catch (const CheckFailed& e) {
      EXPECT_NE(std::string(e.what()).find("received 12 bytes from rank 0 (3 f32 elements), "
                                           "expected 5 f32 elements (20 bytes)"),
                std::string::npos)
          << e.what();
    }
  }
  c.barrier();
}

TEST(MatchingCheck, RecvInAnotherDtypeIsNamedAsOne) {
  // The same shape in bf16 against an f32 buffer: half the bytes, named as such.
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto c = Communicator::world("mpi");
  if (c.rank() == 0) c.send(Tensor::zeros({4}, DType::bf16), 1);
  if (c.rank() == 1) {
    try {
      c.recv(Tensor::zeros({4}), 0);
      FAIL() << "no error";
    } catch (const CheckFailed& e) {
      EXPECT_NE(std::string(e.what()).find("received 8 bytes from rank 0 (2 f32 elements), "
                                           "expected 4 f32 elements (16 bytes): the bytes of 4 "
                                           "bf16 elements"),
                std::string::npos)
          << e.what();
    }
  }
  c.barrier();
}

// ---- split ---------------------------------------------------------------------------------

TEST(Split, TwoByTwoGroupsReduceWithinTheirGroupOnly) {
  if (world_size() != 4) GTEST_SKIP() << "needs exactly 4 ranks";
  auto world = Communicator::world("mpi");
  const int r = world.rank();
  // Rows {0,1} {2,3} and columns {0,2} {1,3} of a 2x2 grid.
  auto row = world.split(r / 2, r, "row");
  auto col = world.split(r % 2, r, "col");
  EXPECT_EQ(row.size(), 2);
  EXPECT_EQ(col.size(), 2);
  EXPECT_EQ(row.rank(), r % 2);
  EXPECT_EQ(col.rank(), r / 2);
  EXPECT_EQ(row.name(), "row");
  EXPECT_EQ(row.world_ranks(), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(col.world_ranks(), (std::vector<int>{r % 2, r % 2 + 2}));

  Tensor a = Tensor::from_vector({static_cast<double>(r)}, {1});
  Tensor b = Tensor::from_vector({static_cast<double>(r)}, {1});
  // Both groups in flight at once: they progress independently.
  comm::Work wa = row.all_reduce_async(a);
  comm::Work wb = col.all_reduce_async(b);
  wa.wait();
  wb.wait();
  EXPECT_EQ(a.item(0), r / 2 == 0 ? 0 + 1 : 2 + 3);
  EXPECT_EQ(b.item(0), r % 2 == 0 ? 0 + 2 : 1 + 3);

  // A key reverses the order inside a group.
  auto reversed = world.split(0, -r, "reversed");
  EXPECT_EQ(reversed.rank(), 3 - r);
  EXPECT_EQ(reversed.world_ranks(), (std::vector<int>{3, 2, 1, 0}));
}

TEST(Split, SelfBackendSplitsIntoItself) {
  auto self = Communicator::world("self");
  auto sub = self.split(3, 0, "sub");
  EXPECT_EQ(sub.size(), 1);
  EXPECT_EQ(sub.rank(), 0);
  Tensor t = Tensor::from_vector({5.0}, {1});
  sub.all_reduce(t);
  EXPECT_EQ(t.item(0), 5.0);
}
