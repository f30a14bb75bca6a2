// The fused residual + LayerNorm (common/ops/fused_norm.hpp) on the host against ops::add then
// ops::layernorm_forward. Tolerance: bitwise, for f32, f64 and bf16 (the fused kernel stores the
// sum rounded to the data type and normalises those stored values in the same order as
// layernorm_forward: the same operations, so the same bits). Its backward: layernorm_backward
// given the residual's gradient (din = dresidual + ...) against a copy of it into din, then
// din += ...: bitwise too (one addition onto the same value).
#include <gtest/gtest.h>

#include "common/ops/fused_norm.hpp"
#include "common/ops/ops.hpp"
#include "tests/common/gradcheck.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
Tensor rnd(std::vector<int64_t> shape, uint64_t seed, DType dtype, double lo = -2, double hi = 2) {
  const Tensor t = uniform(std::move(shape), seed, DType::f64, lo, hi);
  return Tensor::from_vector(t.to_vector(), t.shape(), dtype);
}

void check(DType dt) {
  const DType stat = dt == DType::f64 ? DType::f64 : DType::f32;
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {7, 33}, {12, 768}}) {
    const Tensor x = rnd({N, C}, 1, dt), residual = rnd({N, C}, 2, dt, -10, 10);
    const Tensor w = rnd({C}, 3, dt, 0.5, 1.5), b = rnd({C}, 4, dt, -0.5, 0.5);
    Tensor res = Tensor::empty({N, C}, dt), ln = Tensor::empty({N, C}, dt);
    Tensor mean = Tensor::empty({N}, stat), rstd = Tensor::empty({N}, stat);
    ops::residual_layernorm_forward(res, ln, mean, rstd, x, residual, w, b);

    Tensor res_ref = Tensor::empty({N, C}, dt), ln_ref = Tensor::empty({N, C}, dt);
    Tensor mean_ref = Tensor::empty({N}, stat), rstd_ref = Tensor::empty({N}, stat);
    ops::add(res_ref, x, residual);
    ops::layernorm_forward(ln_ref, mean_ref, rstd_ref, res_ref, w, b);
    const std::string what = std::string(dtype_name(dt)) + " N " + std::to_string(N) + " C " +
                             std::to_string(C);
    EXPECT_EQ(res.to_vector(), res_ref.to_vector()) << what << " res";
    EXPECT_EQ(ln.to_vector(), ln_ref.to_vector()) << what << " ln";
    EXPECT_EQ(mean.to_vector(), mean_ref.to_vector()) << what << " mean";
    EXPECT_EQ(rstd.to_vector(), rstd_ref.to_vector()) << what << " rstd";
  }
}
}  // namespace

TEST(FusedNorm, ResidualLayerNormIsAddThenLayerNormF64) { check(DType::f64); }
TEST(FusedNorm, ResidualLayerNormIsAddThenLayerNormF32) { check(DType::f32); }
TEST(FusedNorm, ResidualLayerNormIsAddThenLayerNormBf16) { check(DType::bf16); }

TEST(FusedNorm, ChecksShapesAndDtypes) {
  Tensor x = Tensor::zeros({4, 8}), r = Tensor::zeros({4, 8}), w = Tensor::zeros({8}),
         b = Tensor::zeros({8});
  Tensor res = Tensor::zeros({4, 8}), ln = Tensor::zeros({4, 8}), mean = Tensor::zeros({4}),
         rstd = Tensor::zeros({4});
  Tensor mean64 = Tensor::zeros({4}, DType::f64), r_short = Tensor::zeros({3, 8});
  EXPECT_THROW(ops::residual_layernorm_forward(res, ln, mean64, rstd, x, r, w, b), CheckFailed);
  EXPECT_THROW(ops::residual_layernorm_forward(res, ln, mean, rstd, x, r_short, w, b), CheckFailed);
  EXPECT_NO_THROW(ops::residual_layernorm_forward(res, ln, mean, rstd, x, r, w, b));
}

namespace {
// layernorm_backward into the residual's gradient against copy-then-accumulate, on `d` (the host,
// or the simulated GPU: the same kernels, behind the device's door).
void check_backward(DType dt, DType grad_dt, Device d) {
  const DType stat = dt == DType::f64 ? DType::f64 : DType::f32;
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {7, 33}, {12, 768}}) {
    const Tensor x = rnd({N, C}, 1, dt).to(d), w = rnd({C}, 3, dt, 0.5, 1.5).to(d),
                 b = rnd({C}, 4, dt, -0.5, 0.5).to(d), dout = rnd({N, C}, 5, dt).to(d),
                 dres = rnd({N, C}, 6, dt, -10, 10).to(d);
    Tensor ln = Tensor::empty({N, C}, dt, d), mean = Tensor::empty({N}, stat, d),
           rstd = Tensor::empty({N}, stat, d);
    ops::layernorm_forward(ln, mean, rstd, x, w, b);
    const auto grads = [&] {
      return std::vector<Tensor>{rnd({C}, 7, grad_dt).to(d), rnd({C}, 8, grad_dt).to(d)};
    };
    std::vector<Tensor> into = grads(), added = grads();
    Tensor din = rnd({N, C}, 9, dt, 100, 200).to(d);  // overwritten: no 100..200 survives
    ops::layernorm_backward(din, into[0], into[1], dout, x, w, mean, rstd, dres);
    Tensor din_ref = dres.clone();
    ops::layernorm_backward(din_ref, added[0], added[1], dout, x, w, mean, rstd);
    const std::string what = std::string(dtype_name(dt)) + " data, " + dtype_name(grad_dt) +
                             " gradients on " + d.str() + ", N " + std::to_string(N) + " C " +
                             std::to_string(C);
    const auto host = [](const Tensor& t) { return t.to(Device::cpu()).to_vector(); };
    EXPECT_EQ(host(din), host(din_ref)) << what << " din";
    EXPECT_EQ(host(into[0]), host(added[0])) << what << " dweight";
    EXPECT_EQ(host(into[1]), host(added[1])) << what << " dbias";
    EXPECT_EQ(host(dres), host(rnd({N, C}, 6, dt, -10, 10))) << what << " dresidual was written to";
  }
}
}  // namespace

TEST(FusedNorm, LayerNormBackwardIntoTheResidualGradientIsCopyThenAdd) {
  for (const Device d : {Device::cpu(), Device::sim()}) {
    check_backward(DType::f64, DType::f64, d);
    check_backward(DType::f32, DType::f32, d);
    check_backward(DType::bf16, DType::bf16, d);
    check_backward(DType::bf16, DType::f32, d);  // mixed precision: fp32 gradients
  }
}

TEST(FusedNorm, LayerNormBackwardChecksTheResidualGradient) {
  Tensor x = Tensor::zeros({4, 8}), w = Tensor::zeros({8}), dout = Tensor::zeros({4, 8});
  Tensor din = Tensor::zeros({4, 8}), dw = Tensor::zeros({8}), db = Tensor::zeros({8});
  Tensor mean = Tensor::zeros({4}), rstd = Tensor::zeros({4});
  const Tensor short_rows = Tensor::zeros({3, 8}), f64 = Tensor::zeros({4, 8}, DType::f64),
               on_sim = Tensor::zeros({4, 8}, DType::f32, Device::sim());
  EXPECT_THROW(ops::layernorm_backward(din, dw, db, dout, x, w, mean, rstd, short_rows),
               CheckFailed);
  EXPECT_THROW(ops::layernorm_backward(din, dw, db, dout, x, w, mean, rstd, f64), CheckFailed);
  EXPECT_THROW(ops::layernorm_backward(din, dw, db, dout, x, w, mean, rstd, on_sim), CheckFailed);
  EXPECT_NO_THROW(ops::layernorm_backward(din, dw, db, dout, x, w, mean, rstd, dout));
}
