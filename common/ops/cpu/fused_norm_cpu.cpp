// Residual + LayerNorm on the host, one row at a time: the row's sum is stored (rounded to the
// data type) and the LayerNorm reads those stored values back, in the order of
// ops/cpu/norm_cpu.cpp's layernorm_forward, so the result is bitwise ops::add then
// ops::layernorm_forward.
#include <cmath>

#include "common/ops/dispatch.hpp"
#include "common/ops/fused_backend.hpp"

namespace scalelab::ops::cpu {

void residual_layernorm_forward(Tensor& res_out, Tensor& ln_out, Tensor& mean, Tensor& rstd,
                                const Tensor& x, const Tensor& residual, const Tensor& weight,
                                const Tensor& bias, double eps) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  SCALELAB_TRAIN_TYPES(x.dtype(), {
    const T* w = weight.data<T>();
    const T* b = bias.data<T>();
    for (int64_t n = 0; n < N; ++n) {
      const T* xn = x.data<T>() + n * C;
      const T* rn = residual.data<T>() + n * C;
      T* res = res_out.data<T>() + n * C;
      T* ln = ln_out.data<T>() + n * C;
      acc_t m = 0;
      for (int64_t c = 0; c < C; ++c) {
        res[c] = T(acc_t(xn[c]) + acc_t(rn[c]));  // the residual stream, as stored
        m += acc_t(res[c]);
      }
      m /= C;
      acc_t var = 0;  // biased variance, as PyTorch's LayerNorm
      for (int64_t c = 0; c < C; ++c) var += (acc_t(res[c]) - m) * (acc_t(res[c]) - m);
      var /= C;
      const acc_t s = acc_t(1) / std::sqrt(var + acc_t(eps));
      for (int64_t c = 0; c < C; ++c) ln[c] = T((acc_t(res[c]) - m) * s * acc_t(w[c]) + acc_t(b[c]));
      mean.data<acc_t>()[n] = m;
      rstd.data<acc_t>()[n] = s;
    }
  });
}

}  // namespace scalelab::ops::cpu
