// Lab 11 step 1: the zig-zag split. Pure index math and copies: exact. The positions against
// the grader's own layout (chunk r then chunk 2cp-1-r), the owner as their inverse, the shard of a
// tensor (f32 rows and i32 tokens) and its inverse bitwise, copied on the tensors' device (fewer
// bytes through the host doors, host_value_bytes, than a shard holds), and the causal balance:
// every rank's queries need the same number of score blocks (within one). Planted into a copy of
// the reference (solutions/11_context_parallel/planted/cheats.plant;
// labs/11_context_parallel/lab.cmake): the contiguous split (rank r keeps tokens
// [r T/cp, (r+1) T/cp)) fails the balance check; the shard made by a loop on the host
// (to_vector, from_vector) fails the host bytes; one through data<T>() fails on the simulated
// GPU (Device::sim: host memory that code outside the ops cannot reach, as a GPU's), where the
// shards are made a second time.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include "common/errors.hpp"
#include "tests/11_context_parallel/cp_checks.hpp"
#include "tests/support/drawn.hpp"
#include "tests/support/host_values.hpp"

using namespace scalelab;

namespace {

using PositionsFn = std::function<std::vector<int64_t>(int64_t T, int cp, int rank)>;

// Causal balance: the ranks' score-block counts differ by at most one block, and add up to the
// single device's 2cp(2cp+1)/2.
testing::AssertionResult balanced(const PositionsFn& positions, int64_t T, int cp) {
  int64_t lo = INT64_MAX, hi = 0, total = 0;
  std::string per_rank;
  for (int r = 0; r < cp; ++r) {
    const int64_t b = lab11::causal_blocks(positions(T, cp, r), T, cp);
    lo = std::min(lo, b), hi = std::max(hi, b), total += b;
    per_rank += fmt::format(" {}", b);
  }
  if (hi - lo <= 1 && total == cp * (2 * cp + 1)) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "T " << T << ", cp " << cp << ": score blocks per rank"
                                     << per_rank << " (want equal within one, "
                                     << cp * (2 * cp + 1) << " in all)";
}

}  // namespace

namespace {

// What is wrong with zigzag_positions(T, cp, r), said as the rule it breaks and what came back,
// never the grader's positions ("" when nothing).
std::string positions_problem(const std::vector<int64_t>& got, int64_t T, int cp, int r) {
  const std::vector<int64_t> want = cptest::zigzag_positions(T, cp, r);
  if (got == want) return "";
  const int64_t c = T / (2 * cp);
  std::size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const std::string where =
      got.size() != want.size()
          ? fmt::format("{} positions, not T / cp", got.size())
          : fmt::format("row {} holds token {}, which is not the {} chunk's row {}", i, got[i],
                        i < static_cast<std::size_t>(c) ? "early" : "late",
                        i % static_cast<std::size_t>(c));
  return fmt::format("zigzag_positions(T {}, cp {}, rank {}): {}; rank r holds the T / (2 cp) "
                     "tokens of chunk r, then those of chunk 2 cp - 1 - r, in order",
                     T, cp, r, where);
}

// The values of row t of batch row b of x (B, T, ...): one token's.
std::vector<double> token_row(const std::vector<double>& x, int64_t T, int64_t w, int64_t b,
                              int64_t t) {
  const auto at = x.begin() + (b * T + t) * w;
  return {at, at + w};
}

// Which token of batch row b of x holds `values` ("" when none): names what a wrong row copied.
std::string which_token(const std::vector<double>& x, int64_t T, int64_t w, int64_t b,
                        const std::vector<double>& values) {
  for (int64_t t = 0; t < T; ++t)
    if (token_row(x, T, w, b, t) == values) return fmt::format("token {}'s", t);
  return "no token's";
}

// "" when `got` is rank r's zig-zag shard of x, else the first (batch, row) that is not, the token
// it should hold and the one it holds.
std::string shard_problem(const Tensor& got, const Tensor& x, int cp, int r) {
  const int64_t B = x.size(0), T = x.size(1), w = x.numel() / (B * T);
  if (got.shape() != cptest::zigzag_rows(x, cp, r).shape())
    return fmt::format("shard_sequence({}, cp {}, rank {}) is {}: want (B, T/cp, ...)", x.str(),
                       cp, r, got.str());
  const std::vector<double> g = got.to_vector(), all = x.to_vector();
  const std::vector<int64_t> p = cptest::zigzag_positions(T, cp, r);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t row = 0; row < T / cp; ++row) {
      const std::vector<double> have = token_row(g, T / cp, w, b, row);
      if (have == token_row(all, T, w, b, p[row])) continue;
      return fmt::format("shard_sequence of {}, cp {}, rank {}: batch {}, row {} holds {} "
                         "values; it should hold token {} (the rank's rows are chunk r, then "
                         "chunk 2 cp - 1 - r, of every batch row)",
                         x.str(), cp, r, b, row,
                         which_token(all, T, w, b, have), p[row]);
    }
  return "";
}

// "" when `got` is x, put back together from every rank's shard; else the first wrong token.
std::string unshard_problem(const Tensor& got, const Tensor& x, int cp) {
  const int64_t B = x.size(0), T = x.size(1), w = x.numel() / (B * T);
  if (got.shape() != x.shape())
    return fmt::format("unshard_sequence of cp {} shards of {} is {}", cp, x.str(), got.str());
  const std::vector<double> g = got.to_vector(), all = x.to_vector();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<double> have = token_row(g, T, w, b, t);
      if (have == token_row(all, T, w, b, t)) continue;
      const int64_t c = T / (2 * cp), k = t / c;
      return fmt::format("unshard_sequence of {}, cp {}: batch {}, token {} holds {} values; "
                         "token {} is in chunk {}, which rank {} holds",
                         x.str(), cp, b, t,
                         which_token(all, T, w, b, have), t, k, k < cp ? k : 2 * cp - 1 - k);
    }
  return "";
}

}  // namespace

TEST(Step1_Split, PositionsAreChunkRThenChunk2cpMinus1MinusR) {
  for (int cp = 1; cp <= 8; ++cp)
    for (int64_t c : {1, 3, 8}) {
      const int64_t T = 2 * cp * c;
      std::vector<int> seen(T, 0);
      for (int r = 0; r < cp; ++r) {
        const std::vector<int64_t> got = lab11::zigzag_positions(T, cp, r);
        const std::string p = positions_problem(got, T, cp, r);
        if (!p.empty()) ADD_FAILURE() << p;
        for (int64_t t : got)
          if (t >= 0 && t < T) ++seen[t];
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int k) { return k == 1; }))
          << "T " << T << ", cp " << cp << ": some token is on no rank or on two";
    }
  // and splits drawn at grading time (tests/support/drawn.hpp: the seed printed with a failure)
  labtest::Drawn draw;
  SCOPED_TRACE("splits " + draw.trace());
  for (int i = 0; i < 16; ++i) {
    const int cp = draw.in(1, 16);
    const int64_t T = 2 * cp * draw.in(1, 12);
    const int r = draw.in(0, cp - 1);
    const std::string p = positions_problem(lab11::zigzag_positions(T, cp, r), T, cp, r);
    if (!p.empty()) ADD_FAILURE() << p;
  }
}

TEST(Step1_Split, OwnerIsTheInverse) {
  for (int cp = 1; cp <= 8; ++cp) {
    const int64_t T = 2 * cp * 5;
    for (int64_t t = 0; t < T; ++t) {
      const lab11::Owner o = lab11::zigzag_owner(t, T, cp);
      const std::vector<int64_t> p = cptest::zigzag_positions(T, cp, o.rank < 0 || o.rank >= cp ? 0 : o.rank);
      ASSERT_TRUE(o.rank >= 0 && o.rank < cp && o.row >= 0 && o.row < T / cp)
          << "token " << t << " of " << T << ", cp " << cp << ": rank " << o.rank << ", row " << o.row;
      EXPECT_EQ(p[o.row], t) << "cp " << cp << ": zigzag_owner(" << t << ") = rank " << o.rank
                             << ", row " << o.row << ", which holds token " << p[o.row];
    }
  }
}

TEST(Step1_Split, ShardAndUnshardAreExactCopies) {
  const int cp = 3;
  const Tensor x = Tensor::uniform({2, 2 * cp * 4, 5}, 42, DType::f32);  // (B, T, C)
  std::vector<double> ids(2 * 2 * cp * 4);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<double>(i % 251);
  const Tensor tokens = Tensor::from_vector(ids, {2, 2 * cp * 4}, DType::i32);  // (B, T)
  // chunks move as device copies: a loop on the host passes them through to_vector/from_vector
  const auto on_device = [](const char* what, int64_t bytes, const Tensor& shard) {
    const std::string p = labtest::rows_through_host(
        what, bytes, shard, "Copy each chunk where it goes, on the tensors' device");
    if (!p.empty()) ADD_FAILURE() << p;
  };
  const auto stays = [](const char* what, const Tensor& got, Device device) {
    if (got.device() != device)
      ADD_FAILURE() << what << " of a tensor on " << device.str() << " came back on "
                    << got.device().str() << ": make it on its input's device";
  };
  // on the host, then on the simulated GPU: a loop through data<T>() throws there
  for (const Device device : {Device::cpu(), Device::sim()}) {
    SCOPED_TRACE("on " + device.str());
    const auto check = [&] {
      for (const Tensor* host_t : {&x, &tokens}) {
        const Tensor t = host_t->to(device);
        std::vector<Tensor> shards;
        for (int r = 0; r < cp; ++r) {
          const int64_t host = labtest::host_bytes_of(
              [&] { shards.push_back(lab11::shard_sequence(t, cp, r)); });
          on_device("shard_sequence", host, shards.back());
          stays("shard_sequence", shards.back(), device);
          const std::string p = shard_problem(shards.back(), t, cp, r);
          if (!p.empty()) ADD_FAILURE() << p;
        }
        Tensor whole;
        const int64_t host =
            labtest::host_bytes_of([&] { whole = lab11::unshard_sequence(shards); });
        on_device("unshard_sequence", host, shards[0]);
        stays("unshard_sequence", whole, device);
        const std::string p = unshard_problem(whole, t, cp);
        if (!p.empty()) ADD_FAILURE() << p;
      }
    };
    if (!device.is_sim()) {
      check();
    } else if (const std::string stopped = labtest::runs_on_sim(check); !stopped.empty()) {
      ADD_FAILURE() << stopped;
    }
  }
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

TEST(Step1_Split, RefusesWhatDoesNotCut) {
  EXPECT_THROW(lab11::zigzag_positions(10, 3, 0), UsageError);  // 10 tokens in 6 chunks
  EXPECT_THROW(lab11::zigzag_positions(12, 3, 3), UsageError);  // no rank 3 of 3
  EXPECT_THROW(lab11::zigzag_owner(12, 12, 3), UsageError);     // no token 12 of 12
}

TEST(Step1_Balance, EveryRankComputesTheSameCausalWork) {
  for (int cp = 1; cp <= 8; ++cp) EXPECT_TRUE(balanced(lab11::zigzag_positions, 2 * cp * 4, cp));
}
