// Dispatch of the fused residual + LayerNorm: check shapes, dtypes and devices, call the backend.
#include "common/ops/fused_norm.hpp"

#include "common/ops/device_dispatch.hpp"
#include "common/ops/fused_backend.hpp"
#include "common/ops/work.hpp"

namespace scalelab::ops {

void residual_layernorm_forward(Tensor& res_out, Tensor& ln_out, Tensor& mean, Tensor& rstd,
                                const Tensor& x, const Tensor& residual, const Tensor& weight,
                                const Tensor& bias, double eps) {
  const char* op = "residual_layernorm_forward";
  SCALELAB_CHECK(x.defined() && x.dim() >= 1, "{}: x undefined or 0-d", op);
  const DType dt = x.dtype();
  SCALELAB_CHECK(dt == DType::f32 || dt == DType::f64 || dt == DType::bf16,
                 "{}: dtype {} (f32, f64 or bf16)", op, dtype_name(dt));
  const DType stat = dt == DType::f64 ? DType::f64 : DType::f32;
  const int64_t C = x.size(-1), N = x.numel() / C;
  auto expect = [&](const Tensor& t, const char* what, const std::vector<int64_t>& shape,
                    DType dtype) {
    SCALELAB_CHECK(t.defined() && t.is_contiguous() && t.shape() == shape && t.dtype() == dtype &&
                       t.device() == x.device(),
                   "{}: {} is {}, expected ({}) {} on {}", op, what,
                   t.defined() ? t.str() : "undefined", fmt::join(shape, ", "), dtype_name(dtype),
                   x.device().str());
  };
  expect(x, "x", x.shape(), dt);
  expect(residual, "residual", x.shape(), dt);
  expect(res_out, "res_out", x.shape(), dt);
  expect(ln_out, "ln_out", x.shape(), dt);
  expect(weight, "weight", {C}, dt);
  expect(bias, "bias", {C}, dt);
  expect(mean, "mean", {N}, stat);
  expect(rstd, "rstd", {N}, stat);
  count_layernorm_rows(N);
  SCALELAB_DISPATCH(x.device(), residual_layernorm_forward(res_out, ln_out, mean, rstd, x,
                                                          residual, weight, bias, eps));
}

}  // namespace scalelab::ops
