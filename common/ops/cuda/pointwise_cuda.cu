// Pointwise kernels: fill, scale, axpy, add, copy, bias, GELU.
#include "common/ops/cuda/kernels.cuh"

namespace scalelab::ops::cuda {

namespace {
template <class S>
__global__ void fill_kernel(S* x, S v, int64_t n) { SCALELAB_GRID_STRIDE(i, n) x[i] = v; }

template <class S>
__global__ void scale_kernel(S* x, S a, int64_t n) { SCALELAB_GRID_STRIDE(i, n) x[i] *= a; }

template <class S>
__global__ void axpy_kernel(S* y, S a, const S* x, int64_t n) {
  SCALELAB_GRID_STRIDE(i, n) y[i] += a * x[i];
}

template <class S>
__global__ void add_kernel(S* o, const S* a, const S* b, int64_t n) {
  SCALELAB_GRID_STRIDE(i, n) o[i] = a[i] + b[i];
}

template <class S>
__global__ void add_bias_kernel(S* o, const S* bias, int64_t n, int64_t C) {
  SCALELAB_GRID_STRIDE(i, n) o[i] += bias[i % C];
}

// column sums in a fixed order: deterministic
template <class S>
__global__ void bias_backward_kernel(S* db, const S* dout, int64_t N, int64_t C) {
  const S s = column_sum<S>(N, C, Element<S>{dout, C});
  const int64_t c = blockIdx.x * (int64_t)kColTile + threadIdx.x;
  if (threadIdx.y == 0 && c < C) db[c] += s;
}

constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)

template <class S>
__global__ void gelu_forward_kernel(S* o, const S* in, int64_t n) {
  SCALELAB_GRID_STRIDE(i, n) {
    S x = in[i];
    o[i] = S(0.5) * x * (S(1) + tanh(S(kGeluScale) * (x + S(0.044715) * x * x * x)));
  }
}

template <class S>
__global__ void gelu_backward_kernel(S* din, const S* in, const S* dout, int64_t n) {
  SCALELAB_GRID_STRIDE(i, n) {
    S x = in[i];
    S th = tanh(S(kGeluScale) * (x + S(0.044715) * x * x * x));
    S sech2 = S(1) - th * th;
    S local = S(0.5) * (S(1) + th) +
              x * S(0.5) * sech2 * S(kGeluScale) * (S(1) + S(3 * 0.044715) * x * x);
    din[i] += local * dout[i];
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
    SCALELAB_FLOAT_TYPES(x.dtype(), fill_kernel<<<blocks_for(n), kThreads>>>(x.data<T>(), T(value), n));
  }
  CUDA_CHECK_LAUNCH();
}

void scale(Tensor& x, double a) {
  use_device(x);
  const int64_t n = x.numel();
  SCALELAB_FLOAT_TYPES(x.dtype(), scale_kernel<<<blocks_for(n), kThreads>>>(x.data<T>(), T(a), n));
  CUDA_CHECK_LAUNCH();
}

void axpy(Tensor& y, double a, const Tensor& x) {
  use_device(y);
  const int64_t n = y.numel();
  SCALELAB_FLOAT_TYPES(y.dtype(),
                       axpy_kernel<<<blocks_for(n), kThreads>>>(y.data<T>(), T(a), x.data<T>(), n));
  CUDA_CHECK_LAUNCH();
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  use_device(out);
  const int64_t n = out.numel();
  SCALELAB_FLOAT_TYPES(out.dtype(), add_kernel<<<blocks_for(n), kThreads>>>(
                                        out.data<T>(), a.data<T>(), b.data<T>(), n));
  CUDA_CHECK_LAUNCH();
}

void copy(Tensor& dst, const Tensor& src) {
  use_device(dst);
  CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice));
}

void add_bias(Tensor& out, const Tensor& bias) {
  use_device(out);
  const int64_t n = out.numel(), C = bias.numel();
  SCALELAB_FLOAT_TYPES(out.dtype(), add_bias_kernel<<<blocks_for(n), kThreads>>>(
                                        out.data<T>(), bias.data<T>(), n, C));
  CUDA_CHECK_LAUNCH();
}

void bias_backward(Tensor& dbias, const Tensor& dout) {
  use_device(dbias);
  const int64_t C = dbias.numel(), N = dout.numel() / C;
  SCALELAB_FLOAT_TYPES(dout.dtype(), bias_backward_kernel<<<column_sum_blocks(C), dim3(kColTile, kColTile)>>>(
                                         dbias.data<T>(), dout.data<T>(), N, C));
  CUDA_CHECK_LAUNCH();
}

void gelu_forward(Tensor& out, const Tensor& in) {
  use_device(out);
  const int64_t n = in.numel();
  SCALELAB_FLOAT_TYPES(in.dtype(), gelu_forward_kernel<<<blocks_for(n), kThreads>>>(
                                       out.data<T>(), in.data<T>(), n));
  CUDA_CHECK_LAUNCH();
}

void gelu_backward(Tensor& din, const Tensor& in, const Tensor& dout) {
  use_device(din);
  const int64_t n = in.numel();
  SCALELAB_FLOAT_TYPES(in.dtype(), gelu_backward_kernel<<<blocks_for(n), kThreads>>>(
                                       din.data<T>(), in.data<T>(), dout.data<T>(), n));
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda
