// Flash attention (common/ops/flash_attention.hpp) on the host against the unfused path of
// common/nn/attention.cpp: batched_matmul (q k^T), causal_softmax_forward, batched_matmul (att v)
// and, for backward, the same ops' backward as CausalSelfAttention::backward.
//
// Tolerances:
//  - f64: 1e-12 relative to the largest |reference| of each tensor (only the order of the sums
//    differs: tiles and the online rescaling);
//  - f32: 1e-5 relative (the same, in float);
//  - bf16: the inputs rounded to bf16 (exactly representable in f64, so the reference sees the
//    same numbers), compute in float, the result rounded to bf16 once: 2^-8 relative rounding of
//    each stored element plus float sums, so 1e-2 relative to the largest |reference|.
// Shapes: T = 1, T not a multiple of the 16-row tile (37, 70) and a multiple (32); hs 16 and 64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/allocator.hpp"
#include "common/ops/flash_attention.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/work.hpp"
#include "tests/common/gradcheck.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
struct Case {
  int64_t BH, T, hs;
};

// The inputs of one case in f64 (already rounded to bf16 when `dtype` is bf16), and in `dtype`.
struct Inputs {
  Tensor q, k, v, dout;  // f64
  double scale;
};

Inputs make_inputs(const Case& c, DType dtype, uint64_t seed) {
  Inputs in;
  Tensor* all[] = {&in.q, &in.k, &in.v, &in.dout};
  for (Tensor* t : all) {
    *t = uniform({c.BH, c.T, c.hs}, seed++, DType::f64, -2, 2);
    // round through the dtype so the f64 reference sees exactly the numbers the op sees
    *t = Tensor::from_vector(Tensor::from_vector(t->to_vector(), t->shape(), dtype).to_vector(),
                             t->shape(), DType::f64);
  }
  in.scale = 1.0 / std::sqrt(static_cast<double>(c.hs));
  return in;
}

Tensor as(const Tensor& t, DType dtype) { return Tensor::from_vector(t.to_vector(), t.shape(), dtype); }

// The unfused path, f64: what CausalSelfAttention does with its (BH, T, T) matrices.
struct Reference {
  Tensor out, lse, dq, dk, dv;
};
Reference unfused(const Inputs& in) {
  const int64_t BH = in.q.size(0), T = in.q.size(1), hs = in.q.size(2);
  Reference r;
  Tensor preatt = Tensor::empty({BH, T, T}, DType::f64), att = Tensor::empty({BH, T, T}, DType::f64);
  ops::batched_matmul(preatt, in.q, in.k, false, true);
  ops::causal_softmax_forward(att, preatt, in.scale);
  r.out = Tensor::empty({BH, T, hs}, DType::f64);
  ops::batched_matmul(r.out, att, in.v);
  // lse from its definition: log sum_{s <= t} exp(scale q_t . k_s)
  r.lse = Tensor::empty({BH, T}, DType::f64);
  for (int64_t h = 0; h < BH; ++h)
    for (int64_t t = 0; t < T; ++t) {
      double mx = -INFINITY;
      for (int64_t s = 0; s <= t; ++s) mx = std::max(mx, in.scale * preatt.item((h * T + t) * T + s));
      double sum = 0;
      for (int64_t s = 0; s <= t; ++s) sum += std::exp(in.scale * preatt.item((h * T + t) * T + s) - mx);
      r.lse.data<double>()[h * T + t] = mx + std::log(sum);
    }
  // backward as CausalSelfAttention::backward (set, not accumulate: the outputs start at zero)
  Tensor datt = Tensor::empty({BH, T, T}, DType::f64), dpre = Tensor::empty({BH, T, T}, DType::f64);
  r.dq = Tensor::zeros({BH, T, hs}, DType::f64);
  r.dk = Tensor::zeros({BH, T, hs}, DType::f64);
  r.dv = Tensor::zeros({BH, T, hs}, DType::f64);
  ops::batched_matmul(datt, in.dout, in.v, false, true);
  ops::batched_matmul(r.dv, att, in.dout, true, false);
  ops::causal_softmax_backward(dpre, att, datt, in.scale);
  ops::batched_matmul(r.dq, dpre, in.k);
  ops::batched_matmul(r.dk, dpre, in.q, true, false);
  return r;
}

// max |got - want| over max(1, max |want|): one relative figure per tensor
double rel_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to_vector(), w = want.to_vector();
  double err = 0, big = 1;
  for (std::size_t i = 0; i < w.size(); ++i) {
    err = std::max(err, std::abs(g[i] - w[i]));
    big = std::max(big, std::abs(w[i]));
  }
  return err / big;
}

struct Flash {
  Tensor out, lse, dq, dk, dv;
};
Flash flash(const Inputs& in, DType dtype) {
  const Tensor q = as(in.q, dtype), k = as(in.k, dtype), v = as(in.v, dtype),
               dout = as(in.dout, dtype);
  Flash f;
  f.out = Tensor::empty(q.shape(), dtype);
  f.lse = Tensor::empty({q.size(0), q.size(1)}, ops::flash_attention_lse_dtype(dtype));
  ops::flash_attention_forward(f.out, f.lse, q, k, v, in.scale);
  // backward SETS its outputs: start them at garbage so an accumulation would show
  f.dq = Tensor::from_vector(std::vector<double>(q.numel(), 7.0), q.shape(), dtype);
  f.dk = f.dq.clone();
  f.dv = f.dq.clone();
  ops::flash_attention_backward(f.dq, f.dk, f.dv, dout, q, k, v, f.out, f.lse, in.scale);
  return f;
}

void check(DType dtype, double tol) {
  for (Case c : {Case{3, 1, 16}, Case{3, 37, 16}, Case{2, 70, 64}, Case{2, 32, 64}}) {
    const Inputs in = make_inputs(c, dtype, 100 + c.T + c.hs);
    const Reference r = unfused(in);
    const Flash f = flash(in, dtype);
    const std::string what = std::string(dtype_name(dtype)) + " BH " + std::to_string(c.BH) +
                             " T " + std::to_string(c.T) + " hs " + std::to_string(c.hs);
    EXPECT_LT(rel_error(f.out, r.out), tol) << what << " out";
    EXPECT_LT(rel_error(f.lse, r.lse), tol) << what << " lse";
    EXPECT_LT(rel_error(f.dq, r.dq), tol) << what << " dq";
    EXPECT_LT(rel_error(f.dk, r.dk), tol) << what << " dk";
    EXPECT_LT(rel_error(f.dv, r.dv), tol) << what << " dv";
  }
}
}  // namespace

TEST(FlashAttention, MatchesUnfusedF64) { check(DType::f64, 1e-12); }
TEST(FlashAttention, MatchesUnfusedF32) { check(DType::f32, 1e-5); }
TEST(FlashAttention, MatchesUnfusedBf16) { check(DType::bf16, 1e-2); }

// The point of the method: no (T, T) matrix. The forward allocates nothing beyond its outputs
// (tiles live on the stack and in tile-sized vectors); the backward one (T) vector of D per call.
// The unfused path at the same size needs 3 x (BH, T, T) f64 = 3 MiB; a (T, T) matrix for one
// head alone would be 512 KiB, far above these bounds.
TEST(FlashAttention, NeverAllocatesTheTxTMatrix) {
  const Case c{2, 256, 16};
  const Inputs in = make_inputs(c, DType::f64, 7);
  Tensor out = Tensor::empty(in.q.shape(), DType::f64), lse = Tensor::empty({c.BH, c.T}, DType::f64);
  Tensor dq = Tensor::empty(in.q.shape(), DType::f64), dk = dq.clone(), dv = dq.clone();
  const Device cpu = Device::cpu();

  reset_peak_memory(cpu);
  const std::size_t before = memory_stats(cpu).current;
  ops::flash_attention_forward(out, lse, in.q, in.k, in.v, in.scale);
  EXPECT_EQ(memory_stats(cpu).peak - before, 0u) << "forward allocated";

  reset_peak_memory(cpu);
  ops::flash_attention_backward(dq, dk, dv, in.dout, in.q, in.k, in.v, out, lse, in.scale);
  EXPECT_LE(memory_stats(cpu).peak - before, c.T * sizeof(double)) << "backward allocated more than D";
  EXPECT_EQ(memory_stats(cpu).current, before);
}

TEST(FlashAttention, ChecksShapesAndDtypes) {
  Tensor q = Tensor::zeros({2, 5, 16}), k = Tensor::zeros({2, 5, 16}), v = Tensor::zeros({2, 5, 16});
  Tensor out = Tensor::zeros({2, 5, 16});
  Tensor lse_f64 = Tensor::zeros({2, 5}, DType::f64), lse_short = Tensor::zeros({2, 4});
  Tensor k_short = Tensor::zeros({2, 4, 16});
  EXPECT_THROW(ops::flash_attention_forward(out, lse_f64, q, k, v, 0.25), CheckFailed);
  EXPECT_THROW(ops::flash_attention_forward(out, lse_short, q, k, v, 0.25), CheckFailed);
  Tensor lse = Tensor::zeros({2, 5});
  EXPECT_THROW(ops::flash_attention_forward(out, lse, q, k_short, v, 0.25), CheckFailed);
  EXPECT_NO_THROW(ops::flash_attention_forward(out, lse, q, k, v, 0.25));
}

// Ring attention's pieces (lab 11): causal attention over T = 2c keys, cut into two blocks of c.
// The second half of the queries sees the first half of the keys unmasked (causal = false) and
// the second half causally; attention_merge of the two partial results is the whole attention's
// rows, and the blocks' backwards (given the whole attention's out and lse) sum to its
// gradients. f64, 1e-12 relative (sums in another order). The work counter counts the pairs and
// the fused GEMMs' FLOPs.
TEST(FlashAttention, UnmaskedBlocksMergeToCausal) {
  const int64_t c = 21, hs = 16, T = 2 * c;
  const Inputs in = make_inputs(Case{1, T, hs}, DType::f64, 11);
  const Reference r = unfused(in);
  // rows [a, a + c) of a (1, T, hs) or (1, T) tensor, as its own (1, c, ...) tensor
  auto half = [&](const Tensor& t, int64_t a) {
    const int64_t w = t.dim() == 3 ? hs : 1;
    return t.view({T, w}).rows(a, a + c).clone().view(t.dim() == 3 ? std::vector<int64_t>{1, c, hs}
                                                                     : std::vector<int64_t>{1, c});
  };
  const Tensor q2 = half(in.q, c), k1 = half(in.k, 0), v1 = half(in.v, 0), k2 = half(in.k, c),
               v2 = half(in.v, c), q1 = half(in.q, 0);
  const ops::WorkCount before = ops::work_stats();
  Tensor out = Tensor::empty({1, c, hs}, DType::f64), lse = Tensor::empty({1, c}, DType::f64);
  Tensor out_b = out.clone(), lse_b = lse.clone();
  ops::flash_attention_forward(out, lse, q2, k1, v1, in.scale, /*causal=*/false);
  ops::flash_attention_forward(out_b, lse_b, q2, k2, v2, in.scale, /*causal=*/true);
  const ops::WorkCount fwd = ops::work_stats() - before;
  EXPECT_EQ(fwd.attention_pairs, c * c + c * (c + 1) / 2);
  // its fused GEMMs count as matmuls: q k^T and p v, 2 hs FLOPs per pair each
  EXPECT_EQ(fwd.matmul_flops, 4 * hs * fwd.attention_pairs);
  EXPECT_EQ(fwd.matmul_calls, 2 * 2);
  ops::attention_merge(out, lse, out_b, lse_b);
  EXPECT_LT(rel_error(out, half(r.out, c)), 1e-12);
  EXPECT_LT(rel_error(lse, half(r.lse, c)), 1e-12);

  // backward of the (q2, k1) block and of the two diagonal blocks, with the whole out and lse
  const Tensor out1 = half(r.out, 0), lse1 = half(r.lse, 0), dout1 = half(in.dout, 0),
               dout2 = half(in.dout, c);
  Tensor dq_a = Tensor::empty({1, c, hs}, DType::f64), dk_a = dq_a.clone(), dv_a = dq_a.clone();
  Tensor dq_b = dq_a.clone(), dk_b = dq_a.clone(), dv_b = dq_a.clone();
  Tensor dq_c = dq_a.clone(), dk_c = dq_a.clone(), dv_c = dq_a.clone();
  ops::flash_attention_backward(dq_a, dk_a, dv_a, dout2, q2, k1, v1, out, lse, in.scale, false);
  ops::flash_attention_backward(dq_b, dk_b, dv_b, dout2, q2, k2, v2, out, lse, in.scale, true);
  const ops::WorkCount before_bwd = ops::work_stats();
  ops::flash_attention_backward(dq_c, dk_c, dv_c, dout1, q1, k1, v1, out1, lse1, in.scale, true);
  const ops::WorkCount bwd = ops::work_stats() - before_bwd;
  EXPECT_EQ(bwd.attention_pairs, c * (c + 1) / 2);
  EXPECT_EQ(bwd.matmul_flops, 10 * hs * bwd.attention_pairs);  // 5 fused GEMMs
  EXPECT_EQ(bwd.matmul_calls, 5);
  ops::add(dq_a, dq_a, dq_b);  // dq of the second half: both key blocks
  ops::add(dk_a, dk_a, dk_c);  // dk, dv of the first half: both query blocks
  ops::add(dv_a, dv_a, dv_c);
  EXPECT_LT(rel_error(dq_a, half(r.dq, c)), 1e-12);
  EXPECT_LT(rel_error(dk_a, half(r.dk, 0)), 1e-12);
  EXPECT_LT(rel_error(dv_a, half(r.dv, 0)), 1e-12);
  EXPECT_LT(rel_error(dq_c, half(r.dq, 0)), 1e-12);
  EXPECT_LT(rel_error(dk_b, half(r.dk, c)), 1e-12);
  EXPECT_LT(rel_error(dv_b, half(r.dv, c)), 1e-12);
}

// The in-place form nn::CausalSelfAttention calls (issue 32): q, k, v read from the QKV output
// (B, T, 3C) where the matmul wrote them, y written as (B, T, C), dqkv set in the QKV layout.
// Reference: split_heads, the unfused f64 attention of the (BH, T, hs) heads, merge_heads (and
// split_heads_backward of its dq, dk, dv): 1e-12 relative in f64. In f32 and bf16 the host's
// in-place kernel is the packed one reading other addresses, so it must give the split path's
// numbers bit for bit (every sum in the same order). T 37 is not a multiple of the tiles; the
// outputs start at garbage so a missed element shows.
TEST(FlashAttention, QkvLayoutMatchesSplitHeads) {
  const int64_t B = 2, NH = 3, T = 37, hs = 16, C = NH * hs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    const std::string what = dtype_name(dt);
    const Tensor qkv = uniform({B, T, 3 * C}, 5, dt, -2, 2), dy = uniform({B, T, C}, 6, dt, -2, 2);
    const DType ldt = ops::flash_attention_lse_dtype(dt);
    Tensor y = Tensor::from_vector(std::vector<double>(B * T * C, 7.0), {B, T, C}, dt);
    Tensor lse = Tensor::empty({B * NH, T}, ldt), dqkv = qkv.clone();
    ops::flash_attention_qkv_forward(y, lse, qkv, NH, scale);
    ops::flash_attention_qkv_backward(dqkv, dy, qkv, y, lse, NH, scale);

    // the split path, on (BH, T, hs) heads
    auto heads = [&] { return Tensor::empty({B, NH, T, hs}, dt); };
    Tensor q = heads(), k = heads(), v = heads(), dyh = heads();
    ops::split_heads(q, k, v, qkv, NH);
    ops::merge_heads_backward(dyh, dy);
    const std::vector<int64_t> flat = {B * NH, T, hs};
    if (dt == DType::f64) {
      const Inputs in{q.view(flat), k.view(flat), v.view(flat), dyh.view(flat), scale};
      const Reference r = unfused(in);
      Tensor y_ref = Tensor::empty({B, T, C}, dt), dqkv_ref = qkv.clone();
      ops::merge_heads(y_ref, r.out.view({B, NH, T, hs}));
      ops::split_heads_backward(dqkv_ref, r.dq.view({B, NH, T, hs}), r.dk.view({B, NH, T, hs}),
                                r.dv.view({B, NH, T, hs}));
      EXPECT_LT(rel_error(y, y_ref), 1e-12) << what;
      EXPECT_LT(rel_error(lse, r.lse), 1e-12) << what;
      EXPECT_LT(rel_error(dqkv, dqkv_ref), 1e-12) << what;
      continue;
    }
    Tensor yh = heads(), lse_ref = Tensor::empty({B * NH, T}, ldt), dq = heads(), dk = heads(),
           dv = heads(), y_ref = Tensor::empty({B, T, C}, dt), dqkv_ref = qkv.clone();
    Tensor yh3 = yh.view(flat), dq3 = dq.view(flat), dk3 = dk.view(flat), dv3 = dv.view(flat);
    ops::flash_attention_forward(yh3, lse_ref, q.view(flat), k.view(flat), v.view(flat), scale);
    ops::merge_heads(y_ref, yh);
    ops::flash_attention_backward(dq3, dk3, dv3, dyh.view(flat), q.view(flat), k.view(flat),
                                  v.view(flat), yh3, lse_ref, scale);
    ops::split_heads_backward(dqkv_ref, dq, dk, dv);
    EXPECT_EQ(y.to_vector(), y_ref.to_vector()) << what;
    EXPECT_EQ(lse.to_vector(), lse_ref.to_vector()) << what;
    EXPECT_EQ(dqkv.to_vector(), dqkv_ref.to_vector()) << what;
  }
  // shapes: qkv's last dimension must be 3 * n_head * hs; y (B, T, C)
  Tensor qkv = Tensor::zeros({1, 4, 3 * 8}), y = Tensor::zeros({1, 4, 8});
  Tensor lse = Tensor::zeros({2, 4}), y_bad = Tensor::zeros({1, 4, 9});
  EXPECT_THROW(ops::flash_attention_qkv_forward(y, lse, qkv, 5, 0.5), CheckFailed);
  EXPECT_THROW(ops::flash_attention_qkv_forward(y_bad, lse, qkv, 2, 0.5), CheckFailed);
  EXPECT_NO_THROW(ops::flash_attention_qkv_forward(y, lse, qkv, 2, 0.5));
}
