// Lab 01 graders. Suites are named Step<K>_... so each step runs (and is graded) on its own.
// Tolerances: integer-valued floats make every sum exact in any order, so ring and library
// results are compared with ==; random floats are summed in a different order by the ring and the
// library, so they are compared at 1e-5 relative + 1e-6 absolute (the all-reduce tolerance of
// tests/support/lab_fixture.hpp).
#include <cmath>
#include <random>
#include <stdexcept>

#include <gtest/gtest.h>

#include "collectives.hpp"
#include "common/runtime.hpp"
#include "tests/support/lab_fixture.hpp"

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
      else EXPECT_TRUE(res.after.empty());
    }
    if (res.name == "all_gather") EXPECT_EQ(res.after, ranks);
    if (res.name == "reduce_scatter") EXPECT_EQ(res.after, reduce_scatter_mine);
    if (res.name == "scatter") EXPECT_EQ(res.after, (std::vector<double>{100.0 + r}));
    if (res.name == "gather") {
      if (r == 0) EXPECT_EQ(res.after, ranks);
      else EXPECT_TRUE(res.after.empty());
    }
  }
  for (std::size_t i = 0; i < results.size(); ++i)
    EXPECT_EQ(results[i].name, step1_collectives()[i]) << "results in step1_collectives() order";
}

// ---- Step 2 -----------------------------------------------------------------------------------

TEST(Step2_RingAllReduce, EqualsLibraryExactlyOnIntegers) {
  Communicator c = labtest::new_world();
  for (DType dtype : {DType::f32, DType::f64}) {
    for (int64_t n : kSizes) {
      Tensor mine = integers(n, c.rank(), dtype), lib = integers(n, c.rank(), dtype);
      ring_all_reduce(c, mine);
      c.all_reduce(lib);
      const auto a = mine.to_vector(), b = lib.to_vector();
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(a[i], b[i]) << "numel " << n << " " << dtype_name(dtype) << ", element " << i
                              << " (chunk boundaries: chunk_begin)";
    }
  }
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
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], b[i], atol + rtol * std::abs(b[i])) << i;
}

TEST(Step2_RingAllReduce, AnyShapeAndViews) {
  Communicator c = labtest::new_world();
  Tensor x = integers(3 * 5 * 7, c.rank()).view({3, 5, 7});
  Tensor lib = integers(3 * 5 * 7, c.rank()).view({3, 5, 7});
  ring_all_reduce(c, x.rows(1, 3));  // only rows 1 and 2
  c.all_reduce(lib.rows(1, 3));
  EXPECT_EQ(x.to_vector(), lib.to_vector());
}

// ---- Step 3 -----------------------------------------------------------------------------------

TEST(Step3_RingBroadcast, EveryRootEverySize) {
  Communicator c = labtest::new_world();
  for (int root = 0; root < c.size(); ++root)
    for (int64_t n : kSizes) {
      Tensor x = integers(n, c.rank());
      ring_broadcast(c, x, root);
      ASSERT_EQ(x.to_vector(), integers(n, root).to_vector()) << "root " << root << " numel " << n;
    }
  EXPECT_THROW(ring_broadcast(c, integers(1, 0), c.size()), std::invalid_argument);
}

TEST(Step3_RingAllGather, RankOrderEverySize) {
  Communicator c = labtest::new_world();
  for (int64_t n : kSizes) {
    if (n > 4096) continue;  // the gathered buffer is size times larger
    Tensor in = integers(n, c.rank());
    Tensor out = Tensor::zeros({n * c.size()});
    ring_all_gather(c, in, out);
    const auto got = out.to_vector();
    for (int r = 0; r < c.size(); ++r) {
      const auto want = integers(n, r).to_vector();
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[r * n + i], want[i]) << "numel " << n << ": chunk of rank " << r;
    }
  }
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
  EXPECT_NEAR(r.time_us, 2000, 1e-6);
  EXPECT_NEAR(r.algbw, 4.0, 1e-9);   // 8e6 B / 2e-3 s = 4e9 B/s = 4 GB/s
  EXPECT_NEAR(r.busbw, 6.0, 1e-9);   // x 2(4-1)/4
  EXPECT_EQ(r.wrong, 0);
  // Even count: mean of the two middle ones.
  BenchRow e = make_bench_row(1000, 250, 2, {4e-6, 1e-6, 2e-6, 3e-6}, 7);
  EXPECT_NEAR(e.time_us, 2.5, 1e-9);
  EXPECT_NEAR(e.algbw, 1000 / 2.5e-6 / 1e9, 1e-9);
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
