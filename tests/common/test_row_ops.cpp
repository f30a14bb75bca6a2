// The per-row softmax pieces and the masked indexing ops (ops.hpp) on the host: what lab 07's
// vocabulary-parallel embedding and cross-entropy are built from. Each is checked two ways:
//  - whole (lo = 0, every column / row held): against the library's single-device ops
//    (cross_entropy_forward/backward, embedding_forward/backward): f64 to 1e-12, the masked
//    lookup and index add bitwise;
//  - split over three "ranks" holding [0, 4), [4, 9), [9, 11) of V = 11: what each rank computes
//    combines (sum, max, side by side) to the whole, bitwise (a masked-out id contributes an exact
//    zero or nothing).
// The CUDA versions are compared with these in test_ops_cuda(_bf16).cpp (label gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "tests/common/gradcheck.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
constexpr int64_t kN = 13, kV = 11, kC = 6;
struct Range {
  int64_t lo, hi;
};
const std::vector<Range> kShards = {{0, 4}, {4, 9}, {9, 11}};

// columns [lo, hi) of x (N, V), contiguous
Tensor columns(const Tensor& x, int64_t lo, int64_t hi) {
  const std::vector<double> v = x.to_vector();
  std::vector<double> out;
  for (int64_t n = 0; n < x.size(0); ++n)
    for (int64_t c = lo; c < hi; ++c) out.push_back(v[n * x.size(1) + c]);
  return Tensor::from_vector(out, {x.size(0), hi - lo}, x.dtype());
}

void expect_equal(const Tensor& a, const Tensor& b, double tol, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  for (std::size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(x[i], y[i], tol * std::max(1.0, std::abs(y[i]))) << what << " element " << i;
}
}  // namespace

TEST(RowOps, WholeRowsGiveTheSingleDeviceCrossEntropy) {
  const Tensor logits = uniform({kN, kV}, 1, DType::f64, -5, 5);
  const Tensor targets = random_tokens({kN}, kV, 2);
  Tensor losses = Tensor::empty({kN}, DType::f64), probs = Tensor::empty({kN, kV}, DType::f64);
  ops::cross_entropy_forward(losses, probs, logits, targets);

  Tensor p = logits.clone(), mx = Tensor::empty({kN}, DType::f64),
         sum = Tensor::empty({kN}, DType::f64), picked = Tensor::empty({kN}, DType::f64);
  ops::row_max(mx, p);
  ops::pick_columns(picked, p, targets, 0);
  ops::exp_rows(p, sum, mx);
  ops::divide_rows(p, sum);
  ops::logarithm(sum, sum);
  const double loss = ops::sum(sum) + ops::sum(mx) - ops::sum(picked);
  expect_equal(p, probs, 1e-12, "probabilities");
  EXPECT_NEAR(loss, ops::sum(losses), 1e-12 * kN * 10);

  Tensor want = Tensor::empty({kN, kV}, DType::f64);
  ops::cross_entropy_backward(want, probs, targets, 0.3);
  ops::cross_entropy_backward(probs, probs, targets, 0.3, 0);  // in place, offset 0
  expect_equal(probs, want, 0, "cross_entropy_backward in place");
}

TEST(RowOps, ShardsCombineToTheWholeBitwise) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const DType stat = ops::stats_dtype(dt);
    const Tensor whole =
        Tensor::from_vector(uniform({kN, kV}, 3, DType::f64, -5, 5).to_vector(), {kN, kV}, dt);
    const Tensor ids = random_tokens({kN}, kV, 4);
    Tensor max_whole = Tensor::empty({kN}, stat), pick_whole = Tensor::empty({kN}, stat);
    ops::row_max(max_whole, whole);
    ops::pick_columns(pick_whole, whole, ids, 0);
    Tensor max_all = Tensor::from_vector(std::vector<double>(kN, -1e30), {kN}, stat);
    Tensor pick_all = Tensor::zeros({kN}, stat);
    Tensor grad_whole = whole.clone();
    ops::cross_entropy_backward(grad_whole, whole, ids, 0.5);
    std::vector<double> grads(kN * kV);
    for (const Range& r : kShards) {
      const Tensor mine = columns(whole, r.lo, r.hi);
      Tensor m = Tensor::empty({kN}, stat), t = Tensor::empty({kN}, stat);
      ops::row_max(m, mine);
      ops::pick_columns(t, mine, ids, r.lo);  // 0 unless this shard holds the id
      std::vector<double> a = max_all.to_vector(), b = m.to_vector(), s = pick_all.to_vector(),
                          u = t.to_vector();
      for (int64_t n = 0; n < kN; ++n) {
        a[n] = std::max(a[n], b[n]);  // what all_reduce(max) does
        s[n] += u[n];                 // all_reduce(sum): one nonzero term
      }
      max_all = Tensor::from_vector(a, {kN}, stat);
      pick_all = Tensor::from_vector(s, {kN}, stat);
      Tensor g = mine.clone();
      ops::cross_entropy_backward(g, g, ids, 0.5, r.lo);
      const std::vector<double> gv = g.to_vector();
      for (int64_t n = 0; n < kN; ++n)
        for (int64_t c = r.lo; c < r.hi; ++c)
          grads[n * kV + c] = gv[n * (r.hi - r.lo) + (c - r.lo)];
    }
    const Tensor grad_all = Tensor::from_vector(grads, {kN, kV}, dt);
    expect_equal(max_all, max_whole, 0, "row_max");
    expect_equal(pick_all, pick_whole, 0, "pick_columns");
    expect_equal(grad_all, grad_whole, 0, "cross_entropy_backward with offsets");
  }
}

TEST(RowOps, MaskedLookupAndIndexAddAreTheEmbeddingsBitwise) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const DType grad_dt = DType::f32;  // fp32 gradients also for bf16 data (R4)
    const Tensor table = Tensor::from_vector(uniform({kV, kC}, 5).to_vector(), {kV, kC}, dt);
    const Tensor ids = random_tokens({1, kN}, kV, 6);
    const Tensor flat_ids = ids.view({kN});
    const Tensor dout = Tensor::from_vector(uniform({1, kN, kC}, 7).to_vector(), {1, kN, kC}, dt);
    // the whole: the library's embedding with zero positions (B = 1, T = kN)
    Tensor pos = Tensor::zeros({kN, kC}, dt), out_whole = Tensor::empty({1, kN, kC}, dt);
    ops::embedding_forward(out_whole, ids, table, pos);
    Tensor dwte_whole = uniform({kV, kC}, 8, grad_dt), none;
    const Tensor dwte_start = dwte_whole.clone();
    ops::embedding_backward(dwte_whole, none, dout, ids);
    // the shards: each looks up its rows (zero elsewhere) and adds into its rows only
    Tensor sum = Tensor::zeros({kN, kC}, DType::f64);
    std::vector<double> dwte(kV * kC);
    for (const Range& r : kShards) {
      const Tensor rows = table.rows(r.lo, r.hi).clone();
      Tensor out = Tensor::empty({kN, kC}, dt);
      ops::fill(out, 7.0);  // overwritten, zero rows included
      ops::gather_rows(out, rows, flat_ids, r.lo);
      Tensor exact = Tensor::empty({kN, kC}, DType::f64);  // every dtype's value is exact in f64
      ops::cast(exact, out);
      ops::add(sum, sum, exact);  // one nonzero term per row: what all_reduce(sum) gives
      Tensor g = dwte_start.rows(r.lo, r.hi).clone();
      ops::index_add_rows(g, dout.view({kN, kC}), flat_ids, r.lo);
      const std::vector<double> gv = g.to_vector();
      std::copy(gv.begin(), gv.end(), dwte.begin() + r.lo * kC);
    }
    expect_equal(sum, Tensor::from_vector(out_whole.to_vector(), {kN, kC}, DType::f64), 0,
                 "gather_rows");
    expect_equal(Tensor::from_vector(dwte, {kV, kC}, grad_dt), dwte_whole, 0, "index_add_rows");
  }
}

TEST(RowOps, RefusesMismatchedShapesAndTypes) {
  Tensor x = Tensor::zeros({4, 5}), m = Tensor::zeros({4}), ids = Tensor::zeros({4}, DType::i32);
  Tensor wrong = Tensor::zeros({3});
  EXPECT_THROW(ops::row_max(wrong, x), CheckFailed);
  Tensor m64 = Tensor::zeros({4}, DType::f64);
  EXPECT_THROW(ops::row_max(m64, x), CheckFailed);  // statistics of f32 data are f32
  EXPECT_THROW(ops::pick_columns(m, x, Tensor::zeros({3}, DType::i32), 0), CheckFailed);
  Tensor table = Tensor::zeros({2, 5}), out = Tensor::zeros({4, 4});
  EXPECT_THROW(ops::gather_rows(out, table, ids, 0), CheckFailed);
  Tensor bf_table = Tensor::zeros({2, 5}, DType::bf16);
  EXPECT_THROW(ops::index_add_rows(bf_table, x, ids, 0), CheckFailed);  // f32 into bf16
  Tensor i32 = Tensor::zeros({4}, DType::i32);
  EXPECT_THROW(ops::logarithm(i32, i32), CheckFailed);
}
