// Pointwise kernels: fill, scale, axpy, add, copy, cast, bias, GELU. Templated on the storage
// type S (float, double or bf16) and the compute type A (float for f32 and bf16, double for
// f64): each element is loaded into A, computed there and stored with one rounding (rules R1,
// R6, R7 of ops.hpp), as the host kernels do.
#include "common/ops/cuda/column_sums.cuh"
#include "common/ops/cuda/kernels.cuh"
#include "common/ops/fused_backend.hpp"
#include "common/ops/trial_kernels.hpp"

namespace scalelab::ops::cuda {

namespace {
template <class S>
__global__ void fill_kernel(S* x, S v, int64_t n) { SCALELAB_GRID_STRIDE(i, n) x[i] = v; }

template <class S, class A>
__global__ void scale_kernel(S* x, A a, int64_t n) { SCALELAB_GRID_STRIDE(i, n) x[i] = S(A(x[i]) * a); }

template <class S, class A>
__global__ void axpy_kernel(S* y, A a, const S* x, int64_t n) {
  SCALELAB_GRID_STRIDE(i, n) y[i] = S(A(y[i]) + a * A(x[i]));
}

template <class S, class A>
__global__ void add_kernel(S* o, const S* a, const S* b, int64_t n) {
  SCALELAB_GRID_STRIDE(i, n) o[i] = S(A(a[i]) + A(b[i]));
}

// add_kernel for bf16 in 16-byte pieces (the trial kernel "add_16_bytes"): a thread loads 8
// elements of a and of b as one Pack8 each and stores 8 sums, each the float sum rounded once,
// as add_kernel's (the same bits). Why: one 2-byte element a thread keeps few bytes in flight an
// SM (the block-end residual add, 12 a step at gpt-85m over 25 MB each, is bound by that, not
// by the bandwidth); 8 a thread keeps 8 times as many.
__global__ void add_bf16x8_kernel(Pack8* o, const Pack8* a, const Pack8* b, int64_t n8) {
  SCALELAB_GRID_STRIDE(i, n8) {
    const Pack8 x = a[i], y = b[i];
    Pack8 r;
#pragma unroll
    for (int e = 0; e < 8; ++e) r.e[e] = bf16(float(x.e[e]) + float(y.e[e]));
    o[i] = r;
  }
}

// D(S) through double, then D's compute type: the host's cast (pointwise_cpu.cpp), so f32 <-> bf16
// round once and f64 -> bf16 rounds to float first.
template <class D, class DA, class S, class SA>
__global__ void cast_kernel(D* dst, const S* src, int64_t n) {
  SCALELAB_GRID_STRIDE(i, n) dst[i] = D(static_cast<DA>(static_cast<double>(SA(src[i]))));
}

template <class S, class A>
__global__ void add_bias_kernel(S* o, const S* bias, int64_t n, int64_t C) {
  SCALELAB_GRID_STRIDE(i, n) o[i] = S(A(o[i]) + A(bias[i % C]));
}

constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)

template <class S, class A>
__global__ void gelu_forward_kernel(S* o, const S* in, int64_t n) {
  SCALELAB_GRID_STRIDE(i, n) {
    const A x = A(in[i]);
    o[i] = S(A(0.5) * x * (A(1) + tanh(A(kGeluScale) * (x + A(0.044715) * x * x * x))));
  }
}

template <class S, class A>
__global__ void gelu_backward_kernel(S* din, const S* in, const S* dout, int64_t n) {
  SCALELAB_GRID_STRIDE(i, n) {
    const A x = A(in[i]);
    const A th = tanh(A(kGeluScale) * (x + A(0.044715) * x * x * x));
    const A sech2 = A(1) - th * th;
    const A local = A(0.5) * (A(1) + th) +
                    x * A(0.5) * sech2 * A(kGeluScale) * (A(1) + A(3 * 0.044715) * x * x);
    din[i] = S(A(din[i]) + local * A(dout[i]));
  }
}

__global__ void fill_int_kernel(int32_t* x, int32_t v, int64_t n) { SCALELAB_GRID_STRIDE(i, n) x[i] = v; }
}  // namespace

void fill(Tensor& x, double value) {
  use_device(x);
  const int64_t n = x.numel();
  if (x.dtype() == DType::i32) {
    fill_int_kernel<<<blocks_for(n), kThreads>>>(x.data<int32_t>(), static_cast<int32_t>(value), n);
  } else {
    SCALELAB_TRAIN_TYPES(x.dtype(), fill_kernel<<<blocks_for(n), kThreads>>>(
                                        x.data<T>(), T(static_cast<acc_t>(value)), n));
  }
  CUDA_CHECK_LAUNCH();
}

void scale(Tensor& x, double a) {
  use_device(x);
  const int64_t n = x.numel();
  SCALELAB_TRAIN_TYPES(x.dtype(), scale_kernel<T, acc_t><<<blocks_for(n), kThreads>>>(
                                      x.data<T>(), acc_t(a), n));
  CUDA_CHECK_LAUNCH();
}

void axpy(Tensor& y, double a, const Tensor& x) {
  use_device(y);
  const int64_t n = y.numel();
  SCALELAB_TRAIN_TYPES(y.dtype(), axpy_kernel<T, acc_t><<<blocks_for(n), kThreads>>>(
                                      y.data<T>(), acc_t(a), x.data<T>(), n));
  CUDA_CHECK_LAUNCH();
}

bool add_16_bytes(Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  if (out.dtype() != DType::bf16 || n % 8 != 0 || n == 0) return false;
  if (!aligned16(out.data_ptr()) || !aligned16(a.data_ptr()) || !aligned16(b.data_ptr()))
    return false;
  use_device(out);
  const int64_t n8 = n / 8;
  add_bf16x8_kernel<<<blocks_for(n8), kThreads>>>(static_cast<Pack8*>(out.data_ptr()),
                                                  static_cast<const Pack8*>(a.data_ptr()),
                                                  static_cast<const Pack8*>(b.data_ptr()), n8);
  CUDA_CHECK_LAUNCH();
  return true;
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  // on trial: bf16 in 16-byte pieces (above)
  if (trial_kernel("add_16_bytes") && add_16_bytes(out, a, b)) return;
  use_device(out);
  const int64_t n = out.numel();
  SCALELAB_TRAIN_TYPES(out.dtype(), add_kernel<T, acc_t><<<blocks_for(n), kThreads>>>(
                                        out.data<T>(), a.data<T>(), b.data<T>(), n));
  CUDA_CHECK_LAUNCH();
}

void copy(Tensor& dst, const Tensor& src) {
  use_device(dst);
  CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice));
}

void cast(Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  use_device(dst);
  const int64_t n = src.numel();
  SCALELAB_TRAIN_TYPES_AS(src.dtype(), S, {
    using SA = acc_t;
    SCALELAB_TRAIN_TYPES_AS(dst.dtype(), D, {
      cast_kernel<D, acc_t, S, SA><<<blocks_for(n), kThreads>>>(dst.data<D>(), src.data<S>(), n);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void add_bias(Tensor& out, const Tensor& bias) {
  use_device(out);
  const int64_t n = out.numel(), C = bias.numel();
  SCALELAB_TRAIN_TYPES(out.dtype(), add_bias_kernel<T, acc_t><<<blocks_for(n), kThreads>>>(
                                        out.data<T>(), bias.data<T>(), n, C));
  CUDA_CHECK_LAUNCH();
}

void bias_backward(Tensor& dbias, const Tensor& dout) {
  // version 2 (bias_backward_v2_cuda.cu): 16-byte loads, the sums in registers; on trial
  if (trial_kernel("bias_backward_v2") && bias_backward_v2(dbias, dout)) return;
  use_device(dbias);
  const int64_t C = dbias.numel(), N = dout.numel() / C;
  // column sums in a fixed order: deterministic. G: the gradient's type (T, or float for bf16).
  SCALELAB_TRAIN_TYPES(dout.dtype(), with_grad_type<T>(dbias.dtype(), [&](auto g_tag) {
    using G = decltype(g_tag);
    add_column_sums<G, acc_t>(dbias.data<G>(), N, C, Element<T, acc_t>{dout.data<T>(), C},
                              dbias.device());
  }));
}

void gelu_forward(Tensor& out, const Tensor& in) {
  use_device(out);
  const int64_t n = in.numel();
  SCALELAB_TRAIN_TYPES(in.dtype(), gelu_forward_kernel<T, acc_t><<<blocks_for(n), kThreads>>>(
                                       out.data<T>(), in.data<T>(), n));
  CUDA_CHECK_LAUNCH();
}

void gelu_backward(Tensor& din, const Tensor& in, const Tensor& dout) {
  use_device(din);
  const int64_t n = in.numel();
  SCALELAB_TRAIN_TYPES(in.dtype(), gelu_backward_kernel<T, acc_t><<<blocks_for(n), kThreads>>>(
                                       din.data<T>(), in.data<T>(), dout.data<T>(), n));
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda
