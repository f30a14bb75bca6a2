#pragma once
// Gradient checking against central finite differences, in float64 on the host.
//
// For a scalar loss L(x) the numeric derivative of element i is (L(x + h e_i) - L(x - h e_i)) / 2h
// with h = 1e-6: its truncation error is O(h^2) ~ 1e-12 and its rounding error ~ 1e-16 / h =
// 1e-10, so an analytic gradient within 1e-6 * max(1, |numeric|) is right, and any real bug (a
// missing term, a wrong sign or factor) is off by far more.
#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "common/tensor.hpp"

namespace scalelab::testing {

inline constexpr double kGradTol = 1e-6;  // see above

struct GradCheck {
  double max_error = 0;   // max |analytic - numeric| / max(1, |numeric|)
  int64_t worst = -1;     // the element where it occurs
  double analytic = 0, numeric = 0;
  int64_t checked = 0;
};

/// Compares `grad` (the analytic dL/dx, same shape as x) with central differences of `loss` at up
/// to `max_elements` elements of x spread evenly over it. x must be a contiguous f64 host tensor
/// that `loss` reads; it is restored afterwards.
inline GradCheck gradcheck(Tensor& x, const Tensor& grad, const std::function<double()>& loss,
                           int64_t max_elements = 200, double h = 1e-6) {
  GradCheck r;
  double* p = x.data<double>();
  const int64_t n = x.numel();
  const int64_t stride = std::max<int64_t>(1, n / max_elements);
  for (int64_t i = 0; i < n; i += stride) {
    const double saved = p[i];
    p[i] = saved + h;
    const double up = loss();
    p[i] = saved - h;
    const double down = loss();
    p[i] = saved;
    const double numeric = (up - down) / (2 * h);
    const double analytic = grad.item(i);
    const double err = std::abs(analytic - numeric) / std::max(1.0, std::abs(numeric));
    if (r.worst < 0 || err > r.max_error) {
      r.max_error = err;
      r.worst = i;
      r.analytic = analytic;
      r.numeric = numeric;
    }
    ++r.checked;
  }
  return r;
}

/// Uniform values in [lo, hi) from a seed (f32 or f64 host tensors).
inline void fill_uniform(Tensor& t, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype() == DType::f64) t.data<double>()[i] = u(rng);
    else t.data<float>()[i] = static_cast<float>(u(rng));
  }
}

inline Tensor uniform(std::vector<int64_t> shape, uint64_t seed, DType dtype = DType::f64,
                      double lo = -1.0, double hi = 1.0) {
  return Tensor::uniform(std::move(shape), seed, dtype, Device::cpu(), lo, hi);
}

/// Random token ids in [0, vocab).
inline Tensor random_tokens(std::vector<int64_t> shape, int vocab, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), DType::i32);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
  return t;
}

/// sum(a * b) in double: the loss whose gradient w.r.t. a is b.
inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.item(i) * b.item(i);
  return s;
}

}  // namespace scalelab::testing

// EXPECT that a gradient check passed, with the worst element in the message.
#define EXPECT_GRAD_OK(result, what)                                                        \
  do {                                                                                      \
    const auto& r_ = (result);                                                              \
    EXPECT_GT(r_.checked, 0) << what;                                                       \
    EXPECT_LT(r_.max_error, ::scalelab::testing::kGradTol)                                  \
        << what << ": element " << r_.worst << " analytic " << r_.analytic << " numeric "   \
        << r_.numeric;                                                                      \
  } while (0)
