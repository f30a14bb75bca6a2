// bf16 on the CPU: the conversion (bf16.hpp) and every op of ops.hpp's rules R1-R8 in bf16
// against the same op in f32.
//
// How the ops are compared. Inputs are drawn as bf16 and widened exactly to f32, so both runs see
// the SAME numbers. The bf16 kernels load into float, compute in float and round once when they
// store, so a bf16 result must equal the f32 result up to that one rounding: bf16 keeps 8
// significant bits, round to nearest errs by at most half a unit in the last place, i.e.
// |bf16(x) - x| <= 2^-8 |x| (the unit roundoff u = 2^-8; 2^-9 relative to the binade's top). The
// tolerance below is exactly that, kRel = 2^-8, plus a tiny absolute term for results near 0.
// Results written to f32 under the mixed rules (fp32 gradients, losses, LayerNorm statistics)
// have no bf16 rounding at all: they must match the f32 op to f32 rounding (1e-6 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/ops/ops.hpp"
#include "common/tensor.hpp"

using namespace scalelab;

namespace {
constexpr double kRel = 1.0 / 256;  // 2^-8: one rounding to bf16 (8 significant bits)
constexpr double kF32 = 1e-6;       // results that stay f32: f32 rounding only

uint16_t bits_of(float f) { return bf16(f).bits; }
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The same random values (bf16-representable) as a bf16 tensor and an f32 tensor.
struct Pair {
  Tensor b, f;
};
Pair random_pair(std::vector<int64_t> shape, unsigned seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  Tensor b = Tensor::empty(shape, DType::bf16);
  for (int64_t i = 0; i < b.numel(); ++i) b.data<bf16>()[i] = bf16(static_cast<float>(dist(gen)));
  Tensor f = Tensor::empty(shape, DType::f32);
  ops::cast(f, b);
  return {b, f};
}

// got (bf16) is the f32 result `want` rounded once: |got - want| <= kRel |want| (+ 1e-30).
void expect_one_rounding(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.dtype(), DType::bf16) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const auto g = got.to_vector(), w = want.to_vector();
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol = kRel * std::fabs(w[i]) + 1e-30;
    if (!(std::fabs(g[i] - w[i]) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: bf16 " << g[i] << ", f32 " << w[i];
  }
  EXPECT_EQ(bad, 0) << what << ": elements off by more than one bf16 rounding";
}

// got and want both f32-valued: f32 rounding apart at most.
void expect_f32_close(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const auto g = got.to_vector(), w = want.to_vector();
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], kF32 * (1 + std::fabs(w[i]))) << what << "[" << i << "]";
}

Tensor ids(std::vector<double> values, std::vector<int64_t> shape) {
  Tensor t = Tensor::empty(shape, DType::i32);
  for (size_t i = 0; i < values.size(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
  return t;
}
}  // namespace

// ---- the conversion -----------------------------------------------------------------------------

TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(float(bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is half way between 1 (even mantissa) and 1 + 2^-7 (odd): ties go to 1
  EXPECT_EQ(float(bf16(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3 * 2^-8 is half way between 1 + 2^-7 (odd) and 1 + 2^-6 (even): ties go up
  EXPECT_EQ(float(bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  // just above half way rounds up, just below rounds down
  EXPECT_EQ(float(bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f))), 1.0f + 0x1p-7f);
  EXPECT_EQ(float(bf16(std::nextafter(1.0f + 0x1p-8f, 0.0f))), 1.0f);
  EXPECT_EQ(float(bf16(-1.0f - 0x1p-8f)), -1.0f);  // symmetric in the sign
  // a carry through the mantissa into the exponent: 2 - 2^-9 rounds to 2
  EXPECT_EQ(float(bf16(2.0f - 0x1p-9f)), 2.0f);
}

TEST(Bf16, NanInfMaxAndSubnormals) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(float(bf16(std::nanf("")))));
  // a NaN whose payload sits only in the low 16 bits must not round to infinity
  EXPECT_TRUE(std::isnan(float(bf16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::signbit(float(bf16(from_bits(0xff800001u)))));
  EXPECT_EQ(float(bf16(inf)), inf);
  EXPECT_EQ(float(bf16(-inf)), -inf);
  // the largest bf16 is 0x7f7f = (2 - 2^-7) 2^127; f32's max is past half way to 2^128: inf
  const float bf16_max = from_bits(0x7f7f0000u);
  EXPECT_EQ(bits_of(bf16_max), 0x7f7f);
  EXPECT_EQ(float(bf16(std::numeric_limits<float>::max())), inf);
  EXPECT_EQ(float(bf16(from_bits(0x7f7f7fffu))), bf16_max);  // below half way: stays max
  // subnormals: the smallest bf16 subnormal 2^-133 is exact; half of it (a tie with 0, even)
  // rounds to 0; a bit more than half rounds up to it
  EXPECT_EQ(float(bf16(0x1p-133f)), 0x1p-133f);
  EXPECT_EQ(float(bf16(0x1p-134f)), 0.0f);
  EXPECT_EQ(float(bf16(0x1p-134f + 0x1p-140f)), 0x1p-133f);
  EXPECT_EQ(bits_of(-0.0f), 0x8000);
}

TEST(Bf16, CastRoundTrips) {
  // f32 -> bf16 -> f32 is bf16 rounding; bf16 -> f32 -> bf16 and bf16 -> f64 -> bf16 are exact
  std::vector<double> v = {0.0, 1.0, -1.0 - 1.0 / 256, 3.14159265, 1e-40, 6e4, -1e30};
  Tensor f = Tensor::from_vector(v, {7}), b = Tensor::empty({7}, DType::bf16);
  ops::cast(b, f);
  for (int i = 0; i < 7; ++i)
    EXPECT_EQ(b.data<bf16>()[i].bits, bf16(static_cast<float>(v[i])).bits) << "element " << i;
  Tensor f2 = Tensor::empty({7}), b2 = Tensor::empty({7}, DType::bf16);
  Tensor d = Tensor::empty({7}, DType::f64), b3 = Tensor::empty({7}, DType::bf16);
  ops::cast(f2, b);
  ops::cast(b2, f2);
  ops::cast(d, b);
  ops::cast(b3, d);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(b2.data<bf16>()[i].bits, b.data<bf16>()[i].bits);
    EXPECT_EQ(b3.data<bf16>()[i].bits, b.data<bf16>()[i].bits);
    EXPECT_EQ(d.item(i), float(b.data<bf16>()[i]));
  }
  // f32 <-> f64 both ways, and a cast to the same dtype is a copy
  Tensor back = Tensor::empty({7});
  ops::cast(d, f);
  ops::cast(back, d);
  EXPECT_EQ(back.to_vector(), f.to_vector());
  EXPECT_THROW(ops::cast(back, Tensor::empty({6}, DType::bf16)), CheckFailed);
  EXPECT_THROW(ops::cast(back, Tensor::empty({7}, DType::i32)), CheckFailed);
}

// ---- pointwise ops (R1) -------------------------------------------------------------------------

TEST(Bf16Ops, Pointwise) {
  Pair x = random_pair({5, 37}, 1), y = random_pair({5, 37}, 2), bias = random_pair({37}, 3);
  Tensor ob = Tensor::empty({5, 37}, DType::bf16), of = Tensor::empty({5, 37});
  ops::fill(ob, 0.3);
  ops::fill(of, 0.3);
  expect_one_rounding(ob, of, "fill");
  ops::add(ob, x.b, y.b);
  ops::add(of, x.f, y.f);
  expect_one_rounding(ob, of, "add");
  Tensor yb = y.b.clone(), yf = y.f.clone();
  ops::axpy(yb, -0.7, x.b);
  ops::axpy(yf, -0.7, x.f);
  expect_one_rounding(yb, yf, "axpy");
  Tensor xb = x.b.clone(), xf = x.f.clone();
  ops::scale(xb, 1.7);
  ops::scale(xf, 1.7);
  expect_one_rounding(xb, xf, "scale");
  ops::copy(ob, x.b);
  EXPECT_EQ(std::memcmp(ob.data_ptr(), x.b.data_ptr(), x.b.nbytes()), 0) << "copy";
  xb = x.b.clone(), xf = x.f.clone();
  ops::add_bias(xb, bias.b);
  ops::add_bias(xf, bias.f);
  expect_one_rounding(xb, xf, "add_bias");
  ops::gelu_forward(ob, x.b);
  ops::gelu_forward(of, x.f);
  expect_one_rounding(ob, of, "gelu_forward");
  Pair dout = random_pair({5, 37}, 4);
  Tensor dinb = y.b.clone(), dinf = y.f.clone();  // backward accumulates into din
  ops::gelu_backward(dinb, x.b, dout.b);
  ops::gelu_backward(dinf, x.f, dout.f);
  expect_one_rounding(dinb, dinf, "gelu_backward");
  ops::softmax_forward(ob, x.b);
  ops::softmax_forward(of, x.f);
  expect_one_rounding(ob, of, "softmax_forward");
  // reductions accumulate in double from the same values: equal to double rounding
  EXPECT_NEAR(ops::sum(x.b), ops::sum(x.f), 1e-12);
  EXPECT_NEAR(ops::sum_squares(x.b), ops::sum_squares(x.f), 1e-12);
  EXPECT_NE(ops::sum_squares(x.b), 0.0);
}

TEST(Bf16Ops, BiasBackwardIntoBf16OrF32) {
  Pair dout = random_pair({9, 16}, 5), db0 = random_pair({16}, 6);
  Tensor dbb = db0.b.clone(), dbf = db0.f.clone();
  ops::bias_backward(dbb, dout.b);
  ops::bias_backward(dbf, dout.f);
  expect_one_rounding(dbb, dbf, "bias_backward bf16");
  Tensor db32 = db0.f.clone();  // R6: an fp32 gradient from bf16 dout, no bf16 rounding
  ops::bias_backward(db32, dout.b);
  expect_f32_close(db32, dbf, "bias_backward f32 <- bf16");
}

// ---- attention pieces -----------------------------------------------------------------------------

TEST(Bf16Ops, HeadsAndCausalSoftmax) {
  const int64_t B = 2, NH = 3, T = 5, hs = 4, C = NH * hs;
  Pair qkv = random_pair({B, T, 3 * C}, 7);
  Tensor q = Tensor::empty({B, NH, T, hs}, DType::bf16), k = q.clone(), v = q.clone();
  Tensor qf = Tensor::empty({B, NH, T, hs}), kf = qf.clone(), vf = qf.clone();
  ops::split_heads(q, k, v, qkv.b, NH);
  ops::split_heads(qf, kf, vf, qkv.f, NH);
  expect_one_rounding(k, kf, "split_heads");  // a move: exact, so within any tolerance
  Tensor back = Tensor::empty({B, T, 3 * C}, DType::bf16);
  ops::split_heads_backward(back, q, k, v);
  EXPECT_EQ(std::memcmp(back.data_ptr(), qkv.b.data_ptr(), back.nbytes()), 0);
  Tensor merged = Tensor::empty({B, T, C}, DType::bf16), mf = Tensor::empty({B, T, C});
  ops::merge_heads(merged, v);
  ops::merge_heads(mf, vf);
  expect_one_rounding(merged, mf, "merge_heads");
  Tensor dy = Tensor::empty({B, NH, T, hs}, DType::bf16);
  ops::merge_heads_backward(dy, merged);
  EXPECT_EQ(std::memcmp(dy.data_ptr(), v.data_ptr(), v.nbytes()), 0);

  Pair pre = random_pair({B * NH, T, T}, 8, 3.0), datt = random_pair({B * NH, T, T}, 9);
  Tensor att = Tensor::empty({B * NH, T, T}, DType::bf16), attf = Tensor::empty({B * NH, T, T});
  ops::causal_softmax_forward(att, pre.b, 0.5);
  ops::causal_softmax_forward(attf, pre.f, 0.5);
  expect_one_rounding(att, attf, "causal_softmax_forward");
  // backward from the SAME probabilities (the bf16 ones, widened) in both precisions
  Tensor att_w = Tensor::empty({B * NH, T, T});
  ops::cast(att_w, att);
  Tensor dpre = att.clone(), dpref = attf.clone();
  ops::causal_softmax_backward(dpre, att, datt.b, 0.5);
  ops::causal_softmax_backward(dpref, att_w, datt.f, 0.5);
  expect_one_rounding(dpre, dpref, "causal_softmax_backward");
}

// ---- matmuls (R2) ---------------------------------------------------------------------------------

TEST(Bf16Ops, MatmulEveryTransposeAndBatched) {
  const int64_t M = 7, N = 5, K = 33;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Pair a = random_pair(ta ? std::vector<int64_t>{K, M} : std::vector<int64_t>{M, K}, 10 + ta);
      Pair b = random_pair(tb ? std::vector<int64_t>{N, K} : std::vector<int64_t>{K, N}, 20 + tb);
      Pair c0 = random_pair({M, N}, 30);
      Tensor cb = c0.b.clone(), cf = c0.f.clone();
      ops::matmul(cb, a.b, b.b, ta, tb, 0.5, 1.0);
      ops::matmul(cf, a.f, b.f, ta, tb, 0.5, 1.0);
      expect_one_rounding(cb, cf, ta ? (tb ? "matmul TT" : "matmul TN") : (tb ? "matmul NT" : "matmul NN"));
    }
  Pair a = random_pair({3, 4, 6}, 40), b = random_pair({3, 6, 2}, 41);
  Tensor cb = Tensor::empty({3, 4, 2}, DType::bf16), cf = Tensor::empty({3, 4, 2});
  ops::batched_matmul(cb, a.b, b.b);
  ops::batched_matmul(cf, a.f, b.f);
  expect_one_rounding(cb, cf, "batched_matmul");
}

TEST(Bf16Ops, MixedMatmulAccumulatesIntoF32) {
  // bf16 inputs, fp32 output with beta = 1: how a weight gradient lands in an fp32 buffer.
  // Twice, as over two micro-batches: the result is the f32 matmul's to f32 rounding.
  Pair x = random_pair({16, 8}, 50), dy = random_pair({16, 12}, 51);
  Pair g0 = random_pair({12, 8}, 52);
  Tensor gmix = g0.f.clone(), gf = g0.f.clone();
  for (int i = 0; i < 2; ++i) {
    ops::matmul(gmix, dy.b, x.b, true, false, 1.0, 1.0);  // dW (12, 8) += dy^T x
    ops::matmul(gf, dy.f, x.f, true, false, 1.0, 1.0);
  }
  EXPECT_EQ(gmix.dtype(), DType::f32);
  expect_f32_close(gmix, gf, "mixed matmul");
  Pair a = random_pair({2, 3, 4}, 53), b = random_pair({2, 4, 5}, 54);
  Tensor o32 = Tensor::zeros({2, 3, 5}), of = Tensor::zeros({2, 3, 5});
  ops::batched_matmul(o32, a.b, b.b, false, false, 1.0, 1.0);
  ops::batched_matmul(of, a.f, b.f, false, false, 1.0, 1.0);
  expect_f32_close(o32, of, "mixed batched_matmul");
  // refused: mixed inputs, or a bf16 output from f32 inputs
  Tensor out = Tensor::zeros({12, 8});
  EXPECT_THROW(ops::matmul(out, dy.f, x.b, true, false), CheckFailed);
  Tensor outb = Tensor::zeros({12, 8}, DType::bf16);
  EXPECT_THROW(ops::matmul(outb, dy.f, x.f, true, false), CheckFailed);
}

// ---- LayerNorm (R3) -------------------------------------------------------------------------------

TEST(Bf16Ops, LayerNormStatsAndGradientsInF32) {
  const int64_t N = 6, C = 24;
  Pair x = random_pair({N, C}, 60, 2.0), w = random_pair({C}, 61), b = random_pair({C}, 62);
  Tensor out = Tensor::empty({N, C}, DType::bf16), outf = Tensor::empty({N, C});
  Tensor mean = Tensor::empty({N}), rstd = Tensor::empty({N});
  Tensor meanf = Tensor::empty({N}), rstdf = Tensor::empty({N});
  ops::layernorm_forward(out, mean, rstd, x.b, w.b, b.b);
  ops::layernorm_forward(outf, meanf, rstdf, x.f, w.f, b.f);
  expect_one_rounding(out, outf, "layernorm_forward");
  expect_f32_close(mean, meanf, "layernorm mean (f32)");
  expect_f32_close(rstd, rstdf, "layernorm rstd (f32)");
  Tensor bad_mean = Tensor::empty({N}, DType::bf16);
  EXPECT_THROW(ops::layernorm_forward(out, bad_mean, rstd, x.b, w.b, b.b), CheckFailed);

  Pair dout = random_pair({N, C}, 63), din0 = random_pair({N, C}, 64);
  Tensor din = din0.b.clone(), dinf = din0.f.clone();
  Tensor dw = Tensor::zeros({C}), db = Tensor::zeros({C});  // fp32 gradients (R3)
  Tensor dwf = Tensor::zeros({C}), dbf = Tensor::zeros({C});
  ops::layernorm_backward(din, dw, db, dout.b, x.b, w.b, mean, rstd);
  ops::layernorm_backward(dinf, dwf, dbf, dout.f, x.f, w.f, meanf, rstdf);
  expect_one_rounding(din, dinf, "layernorm_backward din");
  expect_f32_close(dw, dwf, "layernorm_backward dweight (f32)");
  expect_f32_close(db, dbf, "layernorm_backward dbias (f32)");
  Tensor dwb = Tensor::zeros({C}, DType::bf16), dbb = Tensor::zeros({C}, DType::bf16);
  din = din0.b.clone();
  ops::layernorm_backward(din, dwb, dbb, dout.b, x.b, w.b, mean, rstd);
  expect_one_rounding(dwb, dwf, "layernorm_backward dweight (bf16)");
}

// ---- embedding and loss (R4, R5) ------------------------------------------------------------------

TEST(Bf16Ops, EmbeddingWithF32Gradients) {
  const int64_t B = 2, T = 3, C = 8, V = 5;
  Pair wte = random_pair({V, C}, 70), wpe = random_pair({4, C}, 71);
  Tensor tokens = ids({1, 4, 1, 0, 2, 1}, {B, T});
  Tensor out = Tensor::empty({B, T, C}, DType::bf16), outf = Tensor::empty({B, T, C});
  ops::embedding_forward(out, tokens, wte.b, wpe.b);
  ops::embedding_forward(outf, tokens, wte.f, wpe.f);
  expect_one_rounding(out, outf, "embedding_forward");
  Pair dout = random_pair({B, T, C}, 72);
  Tensor dwte = Tensor::zeros({V, C}), dwpe = Tensor::zeros({4, C});
  Tensor dwtef = Tensor::zeros({V, C}), dwpef = Tensor::zeros({4, C});
  ops::embedding_backward(dwte, dwpe, dout.b, tokens);
  ops::embedding_backward(dwtef, dwpef, dout.f, tokens);
  expect_f32_close(dwte, dwtef, "embedding_backward dwte (f32)");
  expect_f32_close(dwpe, dwpef, "embedding_backward dwpe (f32)");
  EXPECT_NE(dwte.item(1 * C), 0.0);  // token 1 appears three times
}

TEST(Bf16Ops, CrossEntropyLossesInF32) {
  const int64_t N = 4, V = 11;
  Pair logits = random_pair({N, V}, 80, 3.0);
  Tensor targets = ids({0, 10, 3, 3}, {N});
  Tensor losses = Tensor::empty({N}), probs = Tensor::empty({N, V}, DType::bf16);
  Tensor lossesf = Tensor::empty({N}), probsf = Tensor::empty({N, V});
  ops::cross_entropy_forward(losses, probs, logits.b, targets);
  ops::cross_entropy_forward(lossesf, probsf, logits.f, targets);
  expect_f32_close(losses, lossesf, "cross_entropy losses (f32)");
  expect_one_rounding(probs, probsf, "cross_entropy probs");
  Tensor bad = Tensor::empty({N}, DType::bf16);
  EXPECT_THROW(ops::cross_entropy_forward(bad, probs, logits.b, targets), CheckFailed);
  Tensor probs_w = Tensor::empty({N, V});
  ops::cast(probs_w, probs);
  Tensor dl = Tensor::empty({N, V}, DType::bf16), dlf = Tensor::empty({N, V});
  ops::cross_entropy_backward(dl, probs, targets, 0.25);
  ops::cross_entropy_backward(dlf, probs_w, targets, 0.25);
  expect_one_rounding(dl, dlf, "cross_entropy_backward");
}

// ---- AdamW with the compute copy (R8) -------------------------------------------------------------

TEST(Bf16Ops, AdamWRefreshesTheComputeCopy) {
  // An odd size: the vector loop's blocks and its scalar tail both write the copy.
  const int64_t n = 4096 + 1000 + 3;
  Pair p = random_pair({n}, 90), g = random_pair({n}, 91);
  Tensor p1 = p.f.clone(), p2 = p.f.clone();
  Tensor m1 = Tensor::zeros({n}), v1 = Tensor::zeros({n}), m2 = m1.clone(), v2 = v1.clone();
  Tensor copy = Tensor::zeros({n}, DType::bf16);
  ops::AdamWArgs a;
  a.lr = 0.01;
  a.weight_decay = 0.1;
  for (int64_t step = 1; step <= 2; ++step) {
    a.step = step;
    ops::adamw_update(p1, g.f, m1, v1, a);
    ops::adamw_update(p2, g.f, m2, v2, a, &copy);
  }
  // the master update is bitwise the one without a copy; the copy is bf16(master)
  EXPECT_EQ(std::memcmp(p1.data_ptr(), p2.data_ptr(), p1.nbytes()), 0);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(copy.data<bf16>()[i].bits, bf16(p2.data<float>()[i]).bits) << "element " << i;
  // refused: bf16 master weights, a copy of the wrong size or dtype
  Tensor pb = p.b.clone(), gb = g.b.clone(), mb = Tensor::zeros({n}, DType::bf16), vb = mb.clone();
  EXPECT_THROW(ops::adamw_update(pb, gb, mb, vb, a), CheckFailed);
  Tensor short_copy = Tensor::zeros({n - 1}, DType::bf16), f32_copy = Tensor::zeros({n});
  EXPECT_THROW(ops::adamw_update(p2, g.f, m2, v2, a, &short_copy), CheckFailed);
  EXPECT_THROW(ops::adamw_update(p2, g.f, m2, v2, a, &f32_copy), CheckFailed);
}
