// Pointwise ops on the host: fill, scale, axpy, add, copy, cast, bias, GELU. Each loads into
// acc_t (float for f32 and bf16, double for f64: dispatch.hpp), computes, and stores with one
// rounding, so f32 results are bitwise what they were before bf16 existed.
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/ops/cpu/exp_vectorizable.hpp"
#include "common/ops/cpu/ops_cpu.hpp"

namespace scalelab::ops::cpu {

void fill(Tensor& x, double value) {
  if (x.dtype() == DType::i32) {
    int32_t* p = x.data<int32_t>();
    for (int64_t i = 0, n_ = x.numel(); i < n_; ++i) p[i] = static_cast<int32_t>(value);
    return;
  }
  SCALELAB_TRAIN_TYPES(x.dtype(), {
    T* p = x.data<T>();
    const T v = T(static_cast<acc_t>(value));
    for (int64_t i = 0, n_ = x.numel(); i < n_; ++i) p[i] = v;
  });
}

void scale(Tensor& x, double a) {
  SCALELAB_TRAIN_TYPES(x.dtype(), {
    T* p = x.data<T>();
    const acc_t s = static_cast<acc_t>(a);
    for (int64_t i = 0, n_ = x.numel(); i < n_; ++i) p[i] = T(acc_t(p[i]) * s);
  });
}

void axpy(Tensor& y, double a, const Tensor& x) {
  SCALELAB_TRAIN_TYPES(y.dtype(), {
    T* py = y.data<T>();
    const T* px = x.data<T>();
    const acc_t s = static_cast<acc_t>(a);
    for (int64_t i = 0, n_ = y.numel(); i < n_; ++i) py[i] = T(acc_t(py[i]) + s * acc_t(px[i]));
  });
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  SCALELAB_TRAIN_TYPES(out.dtype(), {
    T* po = out.data<T>();
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    for (int64_t i = 0, n_ = out.numel(); i < n_; ++i) po[i] = T(acc_t(pa[i]) + acc_t(pb[i]));
  });
}

void copy(Tensor& dst, const Tensor& src) {
  std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());
}

void cast(Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  const int64_t n = src.numel();
  // Through double (exact for every source), then the destination's acc_t: f32 <-> bf16 and
  // anything -> f64 round at most once; f64 -> bf16 rounds to float first, then to bf16 (a
  // double rounding that can differ from the directly rounded value in the last bf16 bit; no
  // training path casts f64 to bf16).
  SCALELAB_TRAIN_TYPES_AS(src.dtype(), S, {
    const S* ps = src.data<S>();
    using src_acc = acc_t;
    SCALELAB_TRAIN_TYPES_AS(dst.dtype(), D, {
      D* pd = dst.data<D>();
      for (int64_t i = 0; i < n; ++i)
        pd[i] = D(static_cast<acc_t>(static_cast<double>(src_acc(ps[i]))));
    });
  });
}

void add_bias(Tensor& out, const Tensor& bias) {
  const int64_t C = bias.numel(), N = out.numel() / C;
  SCALELAB_TRAIN_TYPES(out.dtype(), {
    T* po = out.data<T>();
    const T* pb = bias.data<T>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) po[n * C + c] = T(acc_t(po[n * C + c]) + acc_t(pb[c]));
  });
}

void bias_backward(Tensor& dbias, const Tensor& dout) {
  const int64_t C = dbias.numel(), N = dout.numel() / C;
  // Sums over rows in acc_t (float for bf16), rounding into dbias once at the end: a bf16 sum
  // rounded after every row would lose the small rows' contributions.
  auto accumulate = [&](auto* pb, const auto* pd, auto zero) {
    using A = decltype(zero);
    std::vector<A> total(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) total[c] = A(pb[c]);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) total[c] += A(pd[n * C + c]);
    for (int64_t c = 0; c < C; ++c) pb[c] = std::remove_pointer_t<decltype(pb)>(total[c]);
  };
  if (dout.dtype() == DType::bf16 && dbias.dtype() == DType::f32)  // R6: an fp32 gradient
    return accumulate(dbias.data<float>(), dout.data<bf16>(), 0.0f);
  SCALELAB_TRAIN_TYPES(dout.dtype(), { accumulate(dbias.data<T>(), dout.data<T>(), acc_t(0)); });
}

namespace {
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)

// tanh through one exp: several times faster than std::tanh (GELU was 40% of a CPU step), and
// exact to rounding in the form GELU uses (0.5 (1 + tanh u)).
template <class T>
inline T fast_tanh(T u) {
  return T(1) - T(2) / (exp_vectorizable(T(2) * u) + T(1));
}

// The loops over plain pointers, so that the compiler vectorizes them (in the dispatch macro it
// does not: the loop shares its function with the dtype check's throw). SCALELAB_HOST_SIMD
// builds an AVX2 copy beside the default one (exp_vectorizable.hpp).
template <class T, class A>
SCALELAB_HOST_SIMD void gelu_forward_loop(T* __restrict po, const T* __restrict pi, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    A x = A(pi[i]);
    A cube = A(0.044715) * x * x * x;
    po[i] = T(A(0.5) * x * (A(1) + fast_tanh(A(kGeluScale) * (x + cube))));
  }
}

template <class T, class A>
SCALELAB_HOST_SIMD void gelu_backward_loop(T* __restrict pdi, const T* __restrict pi,
                                           const T* __restrict pdo, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    A x = A(pi[i]);
    A u = A(kGeluScale) * (x + A(0.044715) * x * x * x);
    A th = fast_tanh(u);
    A sech2 = A(1) - th * th;
    A local = A(0.5) * (A(1) + th) +
              x * A(0.5) * sech2 * A(kGeluScale) * (A(1) + A(3 * 0.044715) * x * x);
    pdi[i] = T(A(pdi[i]) + local * A(pdo[i]));
  }
}
}  // namespace

void gelu_forward(Tensor& out, const Tensor& in) {
  SCALELAB_TRAIN_TYPES(in.dtype(), {
    gelu_forward_loop<T, acc_t>(out.data<T>(), in.data<T>(), in.numel());
  });
}

void gelu_backward(Tensor& din, const Tensor& in, const Tensor& dout) {
  SCALELAB_TRAIN_TYPES(in.dtype(), {
    gelu_backward_loop<T, acc_t>(din.data<T>(), in.data<T>(), dout.data<T>(), in.numel());
  });
}

}  // namespace scalelab::ops::cpu
