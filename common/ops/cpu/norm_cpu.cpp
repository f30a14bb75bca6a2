// LayerNorm and row softmax on the host.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/ops/cpu/ops_cpu.hpp"

namespace scalelab::ops::cpu {

namespace {
// D: the data's element type (in, out, weight, bias, din, dout); G: the parameter gradients'
// (D, or float for bf16 data: R3); A: the compute type, also the statistics' type (float for f32
// and bf16, double for f64). Every value is loaded into A and each result stored with one rounding.
template <class D, class A>
void layernorm_forward_typed(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& in,
                             const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t C = in.size(-1), N = in.numel() / C;
  const D* x = in.data<D>();
  const D* w = weight.data<D>();
  const D* b = bias.data<D>();
  D* o = out.data<D>();
  for (int64_t n = 0; n < N; ++n) {
    const D* xn = x + n * C;
    A m = 0;
    for (int64_t c = 0; c < C; ++c) m += A(xn[c]);
    m /= C;
    A var = 0;  // biased variance, as PyTorch's LayerNorm
    for (int64_t c = 0; c < C; ++c) var += (A(xn[c]) - m) * (A(xn[c]) - m);
    var /= C;
    A s = A(1) / std::sqrt(var + A(eps));
    for (int64_t c = 0; c < C; ++c) o[n * C + c] = D((A(xn[c]) - m) * s * A(w[c]) + A(b[c]));
    mean.data<A>()[n] = m;
    rstd.data<A>()[n] = s;
  }
}

template <class D, class G, class A>
void layernorm_backward_typed(Tensor& din, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                              const Tensor& in, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, const Tensor& base) {
  const int64_t C = in.size(-1), N = in.numel() / C;
  const D* x = in.data<D>();
  const D* w = weight.data<D>();
  const D* dy = dout.data<D>();
  D* dx = din.data<D>();
  const D* dres = base.data<D>();  // din itself, or the residual's gradient
  G* dw = dweight.data<G>();
  G* db = dbias.data<G>();
  // dweight and dbias are sums over rows: kept in A and rounded into G once at the end
  std::vector<A> dw_acc(static_cast<size_t>(C)), db_acc(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    dw_acc[c] = A(dw[c]);
    db_acc[c] = A(db[c]);
  }
  for (int64_t n = 0; n < N; ++n) {
    const A m = mean.data<A>()[n], s = rstd.data<A>()[n];
    const D* xn = x + n * C;
    const D* dyn = dy + n * C;
    // two reductions: mean of dnorm and mean of dnorm * norm
    A dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      A norm = (A(xn[c]) - m) * s;
      A dnorm = A(w[c]) * A(dyn[c]);
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int64_t c = 0; c < C; ++c) {
      A norm = (A(xn[c]) - m) * s;
      A dnorm = A(w[c]) * A(dyn[c]);
      db_acc[c] += A(dyn[c]);
      dw_acc[c] += norm * A(dyn[c]);
      dx[n * C + c] = D(A(dres[n * C + c]) + s * (dnorm - dnorm_mean - norm * dnorm_norm_mean));
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    dw[c] = G(dw_acc[c]);
    db[c] = G(db_acc[c]);
  }
}
}  // namespace

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& in,
                       const Tensor& weight, const Tensor& bias, double eps) {
  SCALELAB_TRAIN_TYPES(in.dtype(), {
    layernorm_forward_typed<T, acc_t>(out, mean, rstd, in, weight, bias, eps);
  });
}

void layernorm_backward(Tensor& din, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& in, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& base) {
  if (in.dtype() == DType::bf16 && dweight.dtype() == DType::f32)  // fp32 gradients (R3)
    return layernorm_backward_typed<bf16, float, float>(din, dweight, dbias, dout, in, weight,
                                                        mean, rstd, base);
  SCALELAB_TRAIN_TYPES(in.dtype(), {
    layernorm_backward_typed<T, T, acc_t>(din, dweight, dbias, dout, in, weight, mean, rstd,
                                          base);
  });
}

void softmax_forward(Tensor& out, const Tensor& in) {
  const int64_t C = in.size(-1), N = in.numel() / C;
  SCALELAB_TRAIN_TYPES(in.dtype(), {
    using A = acc_t;
    const T* x = in.data<T>();
    T* y = out.data<T>();
    std::vector<A> e(static_cast<size_t>(C));
    for (int64_t n = 0; n < N; ++n) {
      const T* xn = x + n * C;
      T* yn = y + n * C;
      A mx = -std::numeric_limits<A>::infinity();
      for (int64_t c = 0; c < C; ++c) mx = std::max(mx, A(xn[c]));
      A total = 0;
      for (int64_t c = 0; c < C; ++c) {
        e[c] = std::exp(A(xn[c]) - mx);
        total += e[c];
      }
      for (int64_t c = 0; c < C; ++c) yn[c] = T(e[c] / total);
    }
  });
}

}  // namespace scalelab::ops::cpu
