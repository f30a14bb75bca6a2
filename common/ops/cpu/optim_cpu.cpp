// Reductions and optimizer updates on the host.
#include <cmath>

#include "common/ops/cpu/ops_cpu.hpp"

namespace scalelab::ops::cpu {

double sum(const Tensor& x) {
  double total = 0;
  SCALELAB_FLOAT_TYPES(x.dtype(), {
    const T* p = x.data<T>();
    for (int64_t i = 0, n_ = x.numel(); i < n_; ++i) total += p[i];
  });
  return total;
}

double sum_squares(const Tensor& x) {
  double total = 0;
  SCALELAB_FLOAT_TYPES(x.dtype(), {
    const T* p = x.data<T>();
    for (int64_t i = 0, n_ = x.numel(); i < n_; ++i) total += static_cast<double>(p[i]) * p[i];
  });
  return total;
}

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& a) {
  const double c1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double c2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  SCALELAB_FLOAT_TYPES(param.dtype(), {
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* pm = m.data<T>();
    T* pv = v.data<T>();
    for (int64_t i = 0, n_ = param.numel(); i < n_; ++i) {
      pm[i] = T(a.beta1) * pm[i] + T(1 - a.beta1) * g[i];
      pv[i] = T(a.beta2) * pv[i] + T(1 - a.beta2) * g[i] * g[i];
      const T mhat = pm[i] / T(c1), vhat = pv[i] / T(c2);
      p[i] -= T(a.lr) * (mhat / (std::sqrt(vhat) + T(a.eps)) + T(a.weight_decay) * p[i]);
    }
  });
}

void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, double lr, double momentum,
                double weight_decay, bool first_step) {
  SCALELAB_FLOAT_TYPES(param.dtype(), {
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* b = momentum > 0 ? buf.data<T>() : nullptr;
    for (int64_t i = 0, n_ = param.numel(); i < n_; ++i) {
      T d = g[i] + T(weight_decay) * p[i];
      if (b) {
        b[i] = first_step ? d : T(momentum) * b[i] + d;
        d = b[i];
      }
      p[i] -= T(lr) * d;
    }
  });
}

}  // namespace scalelab::ops::cpu
