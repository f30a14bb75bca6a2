// LayerNorm and row softmax: one warp per row.
#include "common/ops/cuda/kernels.cuh"

namespace scalelab::ops::cuda {

namespace {
template <class S>
__global__ void layernorm_forward_kernel(S* out, S* mean, S* rstd, const S* in, const S* w,
                                         const S* b, int64_t N, int64_t C, S eps) {
  const int64_t row = warp_row();
  if (row >= N) return;
  const S* x = in + row * C;
  S s = 0;
  for (int64_t c = lane(); c < C; c += kWarp) s += x[c];
  const S m = warp_sum(s) / C;
  S v = 0;
  for (int64_t c = lane(); c < C; c += kWarp) v += (x[c] - m) * (x[c] - m);
  const S r = S(1) / sqrt(warp_sum(v) / C + eps);
  for (int64_t c = lane(); c < C; c += kWarp) out[row * C + c] = (x[c] - m) * r * w[c] + b[c];
  if (lane() == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dx per row (one warp per row)
template <class S>
__global__ void layernorm_backward_dx_kernel(S* din, const S* dout, const S* in, const S* w,
                                             const S* mean, const S* rstd, int64_t N, int64_t C) {
  const int64_t row = warp_row();
  if (row >= N) return;
  const S m = mean[row], r = rstd[row];
  const S* x = in + row * C;
  const S* dy = dout + row * C;
  S a = 0, b = 0;
  for (int64_t c = lane(); c < C; c += kWarp) {
    const S norm = (x[c] - m) * r, dnorm = w[c] * dy[c];
    a += dnorm;
    b += dnorm * norm;
  }
  a = warp_sum(a) / C;
  b = warp_sum(b) / C;
  for (int64_t c = lane(); c < C; c += kWarp) {
    const S norm = (x[c] - m) * r, dnorm = w[c] * dy[c];
    din[row * C + c] += r * (dnorm - a - norm * b);
  }
}

// the summand of dweight: norm(x) * dout
template <class S>
struct NormTimesGrad {
  const S *in, *dout, *mean, *rstd;
  int64_t C;
  __device__ S operator()(int64_t n, int64_t c) const {
    return (in[n * C + c] - mean[n]) * rstd[n] * dout[n * C + c];
  }
};

// dweight, dbias: column sums in a fixed order (deterministic)
template <class S>
__global__ void layernorm_backward_dw_kernel(S* dw, S* db, const S* dout, const S* in,
                                             const S* mean, const S* rstd, int64_t N, int64_t C) {
  const S sb = column_sum<S>(N, C, Element<S>{dout, C});
  const S sw = column_sum<S>(N, C, NormTimesGrad<S>{in, dout, mean, rstd, C});
  const int64_t c = blockIdx.x * (int64_t)kColTile + threadIdx.x;
  if (threadIdx.y == 0 && c < C) {
    dw[c] += sw;
    db[c] += sb;
  }
}

template <class S>
__global__ void softmax_kernel(S* out, const S* in, int64_t N, int64_t C) {
  const int64_t row = warp_row();
  if (row >= N) return;
  warp_softmax_row(out + row * C, in + row * C, C);
}
}  // namespace

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& in,
                       const Tensor& weight, const Tensor& bias, double eps) {
  use_device(out);
  const int64_t C = in.size(-1), N = in.numel() / C;
  SCALELAB_FLOAT_TYPES(in.dtype(), layernorm_forward_kernel<<<blocks_for_rows(N), kThreads>>>(
                                       out.data<T>(), mean.data<T>(), rstd.data<T>(), in.data<T>(),
                                       weight.data<T>(), bias.data<T>(), N, C, T(eps)));
  CUDA_CHECK_LAUNCH();
}

void layernorm_backward(Tensor& din, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& in, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  use_device(din);
  const int64_t C = in.size(-1), N = in.numel() / C;
  SCALELAB_FLOAT_TYPES(in.dtype(), {
    layernorm_backward_dx_kernel<<<blocks_for_rows(N), kThreads>>>(
        din.data<T>(), dout.data<T>(), in.data<T>(), weight.data<T>(), mean.data<T>(),
        rstd.data<T>(), N, C);
    CUDA_CHECK_LAUNCH();
    layernorm_backward_dw_kernel<<<column_sum_blocks(C), dim3(kColTile, kColTile)>>>(
        dweight.data<T>(), dbias.data<T>(), dout.data<T>(), in.data<T>(), mean.data<T>(),
        rstd.data<T>(), N, C);
  });
  CUDA_CHECK_LAUNCH();
}

void softmax_forward(Tensor& out, const Tensor& in) {
  use_device(out);
  const int64_t C = in.size(-1), N = in.numel() / C;
  SCALELAB_FLOAT_TYPES(in.dtype(), softmax_kernel<<<blocks_for_rows(N), kThreads>>>(
                                       out.data<T>(), in.data<T>(), N, C));
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda
