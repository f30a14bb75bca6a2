// LayerNorm and row softmax on the host.
#include <algorithm>
#include <cmath>

#include "common/ops/cpu/ops_cpu.hpp"

namespace scalelab::ops::cpu {

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& in,
                       const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t C = in.size(-1), N = in.numel() / C;
  SCALELAB_FLOAT_TYPES(in.dtype(), {
    const T* x = in.data<T>();
    const T* w = weight.data<T>();
    const T* b = bias.data<T>();
    T* o = out.data<T>();
    for (int64_t n = 0; n < N; ++n) {
      const T* xn = x + n * C;
      T m = 0;
      for (int64_t c = 0; c < C; ++c) m += xn[c];
      m /= C;
      T var = 0;  // biased variance, as PyTorch's LayerNorm
      for (int64_t c = 0; c < C; ++c) var += (xn[c] - m) * (xn[c] - m);
      var /= C;
      T s = T(1) / std::sqrt(var + T(eps));
      for (int64_t c = 0; c < C; ++c) o[n * C + c] = (xn[c] - m) * s * w[c] + b[c];
      mean.data<T>()[n] = m;
      rstd.data<T>()[n] = s;
    }
  });
}

void layernorm_backward(Tensor& din, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& in, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  const int64_t C = in.size(-1), N = in.numel() / C;
  SCALELAB_FLOAT_TYPES(in.dtype(), {
    const T* x = in.data<T>();
    const T* w = weight.data<T>();
    const T* dy = dout.data<T>();
    T* dx = din.data<T>();
    T* dw = dweight.data<T>();
    T* db = dbias.data<T>();
    for (int64_t n = 0; n < N; ++n) {
      const T m = mean.data<T>()[n], s = rstd.data<T>()[n];
      const T* xn = x + n * C;
      const T* dyn = dy + n * C;
      // two reductions: mean of dnorm and mean of dnorm * norm
      T dnorm_mean = 0, dnorm_norm_mean = 0;
      for (int64_t c = 0; c < C; ++c) {
        T norm = (xn[c] - m) * s;
        T dnorm = w[c] * dyn[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
      for (int64_t c = 0; c < C; ++c) {
        T norm = (xn[c] - m) * s;
        T dnorm = w[c] * dyn[c];
        db[c] += dyn[c];
        dw[c] += norm * dyn[c];
        dx[n * C + c] += s * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
      }
    }
  });
}

void softmax_forward(Tensor& out, const Tensor& in) {
  const int64_t C = in.size(-1), N = in.numel() / C;
  SCALELAB_FLOAT_TYPES(in.dtype(), {
    const T* x = in.data<T>();
    T* y = out.data<T>();
    for (int64_t n = 0; n < N; ++n) {
      const T* xn = x + n * C;
      T* yn = y + n * C;
      T mx = *std::max_element(xn, xn + C);
      T total = 0;
      for (int64_t c = 0; c < C; ++c) {
        yn[c] = std::exp(xn[c] - mx);
        total += yn[c];
      }
      for (int64_t c = 0; c < C; ++c) yn[c] /= total;
    }
  });
}

}  // namespace scalelab::ops::cpu
