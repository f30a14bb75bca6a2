// The non-matmul pieces of attention: head layout moves (any storage type: f32, f64, bf16) and
// the causal softmax (one warp per row, computed in float for bf16: R1).
#include "common/ops/cuda/kernels.cuh"

namespace scalelab::ops::cuda {

namespace {
// element i of (B, NH, T, hs) <-> its place in a (B, T, width) tensor, part p of the width
__device__ inline int64_t btc_index(int64_t i, int64_t NH, int64_t T, int64_t hs, int64_t width,
                                    int64_t part) {
  const int64_t d = i % hs, t = (i / hs) % T, h = (i / (hs * T)) % NH, b = i / (hs * T * NH);
  return (b * T + t) * width + part * NH * hs + h * hs + d;
}

template <class S>
__global__ void split_heads_kernel(S* q, S* k, S* v, const S* qkv, int64_t n, int64_t NH,
                                   int64_t T, int64_t hs) {
  SCALELAB_GRID_STRIDE(i, n) {
    q[i] = qkv[btc_index(i, NH, T, hs, 3 * NH * hs, 0)];
    k[i] = qkv[btc_index(i, NH, T, hs, 3 * NH * hs, 1)];
    v[i] = qkv[btc_index(i, NH, T, hs, 3 * NH * hs, 2)];
  }
}

template <class S>
__global__ void split_heads_backward_kernel(S* dqkv, const S* dq, const S* dk, const S* dv,
                                            int64_t n, int64_t NH, int64_t T, int64_t hs) {
  SCALELAB_GRID_STRIDE(i, n) {
    dqkv[btc_index(i, NH, T, hs, 3 * NH * hs, 0)] = dq[i];
    dqkv[btc_index(i, NH, T, hs, 3 * NH * hs, 1)] = dk[i];
    dqkv[btc_index(i, NH, T, hs, 3 * NH * hs, 2)] = dv[i];
  }
}

template <class S>
__global__ void merge_heads_kernel(S* out, const S* y, int64_t n, int64_t NH, int64_t T,
                                   int64_t hs) {
  SCALELAB_GRID_STRIDE(i, n) out[btc_index(i, NH, T, hs, NH * hs, 0)] = y[i];
}

template <class S>
__global__ void merge_heads_backward_kernel(S* dy, const S* dout, int64_t n, int64_t NH,
                                            int64_t T, int64_t hs) {
  SCALELAB_GRID_STRIDE(i, n) dy[i] = dout[btc_index(i, NH, T, hs, NH * hs, 0)];
}

// row r = (bh, t) of a (BH, T, T) tensor: softmax over columns 0..t, zeros after. Storage S,
// compute A (float for f32 and bf16, double for f64).
template <class S, class A>
__global__ void causal_softmax_kernel(S* att, const S* pre, int64_t rows, int64_t T, A scale) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const int64_t t = row % T;
  const S* x = pre + row * T;
  S* y = att + row * T;
  A mx = -INFINITY;
  for (int64_t s = lane(); s <= t; s += kWarp) mx = max(mx, scale * A(x[s]));
  mx = warp_max(mx);
  A sum = 0;
  for (int64_t s = lane(); s <= t; s += kWarp) sum += exp(scale * A(x[s]) - mx);
  sum = warp_sum(sum);
  for (int64_t s = lane(); s < T; s += kWarp) y[s] = S(s <= t ? exp(scale * A(x[s]) - mx) / sum : A(0));
}

template <class S, class A>
__global__ void causal_softmax_backward_kernel(S* dpre, const S* att, const S* datt,
                                               int64_t rows, int64_t T, A scale) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const int64_t t = row % T;
  const S* y = att + row * T;
  const S* dy = datt + row * T;
  A dot = 0;
  for (int64_t s = lane(); s <= t; s += kWarp) dot += A(y[s]) * A(dy[s]);
  dot = warp_sum(dot);
  for (int64_t s = lane(); s < T; s += kWarp)
    dpre[row * T + s] = S(s <= t ? scale * A(y[s]) * (A(dy[s]) - dot) : A(0));
}
}  // namespace

void split_heads(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, int64_t NH) {
  use_device(q);
  const int64_t n = q.numel(), T = q.size(2), hs = q.size(3);
  SCALELAB_TRAIN_TYPES_AS(qkv.dtype(), scalar_t, split_heads_kernel<<<blocks_for(n), kThreads>>>(
      q.data<scalar_t>(), k.data<scalar_t>(), v.data<scalar_t>(), qkv.data<scalar_t>(), n, NH, T, hs));
  CUDA_CHECK_LAUNCH();
}

void split_heads_backward(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  use_device(dqkv);
  const int64_t n = dq.numel(), NH = dq.size(1), T = dq.size(2), hs = dq.size(3);
  SCALELAB_TRAIN_TYPES_AS(dqkv.dtype(), scalar_t,
      split_heads_backward_kernel<<<blocks_for(n), kThreads>>>(
          dqkv.data<scalar_t>(), dq.data<scalar_t>(), dk.data<scalar_t>(), dv.data<scalar_t>(),
          n, NH, T, hs));
  CUDA_CHECK_LAUNCH();
}

void merge_heads(Tensor& out, const Tensor& y) {
  use_device(out);
  const int64_t n = y.numel(), NH = y.size(1), T = y.size(2), hs = y.size(3);
  SCALELAB_TRAIN_TYPES_AS(y.dtype(), scalar_t, merge_heads_kernel<<<blocks_for(n), kThreads>>>(
      out.data<scalar_t>(), y.data<scalar_t>(), n, NH, T, hs));
  CUDA_CHECK_LAUNCH();
}

void merge_heads_backward(Tensor& dy, const Tensor& dout) {
  use_device(dy);
  const int64_t n = dy.numel(), NH = dy.size(1), T = dy.size(2), hs = dy.size(3);
  SCALELAB_TRAIN_TYPES_AS(dy.dtype(), scalar_t,
      merge_heads_backward_kernel<<<blocks_for(n), kThreads>>>(
          dy.data<scalar_t>(), dout.data<scalar_t>(), n, NH, T, hs));
  CUDA_CHECK_LAUNCH();
}

void causal_softmax_forward(Tensor& att, const Tensor& preatt, double scale) {
  use_device(att);
  const int64_t T = preatt.size(1), rows = preatt.size(0) * T;
  SCALELAB_TRAIN_TYPES_AS(preatt.dtype(), scalar_t,
      causal_softmax_kernel<scalar_t, acc_t><<<blocks_for_rows(rows), kThreads>>>(
          att.data<scalar_t>(), preatt.data<scalar_t>(), rows, T, acc_t(scale)));
  CUDA_CHECK_LAUNCH();
}

void causal_softmax_backward(Tensor& dpreatt, const Tensor& att, const Tensor& datt,
                             double scale) {
  use_device(dpreatt);
  const int64_t T = att.size(1), rows = att.size(0) * T;
  SCALELAB_TRAIN_TYPES_AS(att.dtype(), scalar_t,
      causal_softmax_backward_kernel<scalar_t, acc_t><<<blocks_for_rows(rows), kThreads>>>(
          dpreatt.data<scalar_t>(), att.data<scalar_t>(), datt.data<scalar_t>(), rows, T,
          acc_t(scale)));
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda
