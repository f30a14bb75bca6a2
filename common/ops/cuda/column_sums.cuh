#pragma once
// Column sums of an (N, C) matrix on the GPU: the bias gradients (pointwise_cuda.cu) and
// LayerNorm's weight and bias gradients (norm_cuda.cu).
#include "common/ops/cuda/kernels.cuh"
#include "common/tensor.hpp"

namespace scalelab::ops::cuda {

/// Column sums of an (N, C) matrix (bias and LayerNorm gradients), deterministic and GPU-wide, in
/// two passes (add_column_sums). Pass 1: a (32, 32) block per 32 columns and per slice of the
/// rows (column_slices(N) slices); lane y sums rows y, y+32, ... of its slice in order, then the
/// 32 partial sums are added in a fixed tree, into partial[slice, c]. Pass 2 adds each column's
/// slices in order. One block per 32 columns alone left gpt-85m's 768 columns 24 blocks for 132
/// SMs (3.9 ms a step in LayerNorm's weight gradients on an H100). The slice count depends on N
/// only, so the bits are the same on any GPU. `f(n, c)` gives the value summed.
constexpr int kColTile = 32;
inline int column_sum_blocks(int64_t C) { return static_cast<int>((C + kColTile - 1) / kColTile); }
inline int column_slices(int64_t N) {
  const int64_t p = N / 512;  // >= 512 rows a slice, at most 64 slices
  return static_cast<int>(p < 1 ? 1 : (p > 64 ? 64 : p));
}

/// This block's slice (blockIdx.y of gridDim.y) of the column sums.
template <class S, class F>
__device__ inline S column_slice_sum(int64_t N, int64_t C, F f) {
  __shared__ S partial[kColTile][kColTile + 1];
  __syncthreads();  // the block may have used `partial` in a previous call
  const int64_t c = blockIdx.x * (int64_t)kColTile + threadIdx.x;
  const int64_t lo = N * blockIdx.y / gridDim.y, hi = N * (blockIdx.y + 1) / gridDim.y;
  S s = 0;
  if (c < C)
    for (int64_t n = lo + threadIdx.y; n < hi; n += kColTile) s += f(n, c);
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  for (int stride = kColTile / 2; stride > 0; stride /= 2) {
    if (threadIdx.y < stride)
      partial[threadIdx.y][threadIdx.x] += partial[threadIdx.y + stride][threadIdx.x];
    __syncthreads();
  }
  return partial[0][threadIdx.x];  // meaningful where threadIdx.y == 0 and c < C
}

template <class A, class F>
__global__ void column_partial_kernel(A* partial, int64_t N, int64_t C, F f) {
  const A s = column_slice_sum<A>(N, C, f);
  const int64_t c = blockIdx.x * (int64_t)kColTile + threadIdx.x;
  if (threadIdx.y == 0 && c < C) partial[blockIdx.y * C + c] = s;
}

template <class G, class A>
__global__ void column_total_kernel(G* out, const A* partial, int64_t slices, int64_t C) {
  SCALELAB_GRID_STRIDE(c, C) {
    A s = 0;
    for (int64_t p = 0; p < slices; ++p) s += partial[p * C + c];
    out[c] = G(A(out[c]) + s);
  }
}

/// out[c] (G) += the sum over p < slices of partial[p, c] (an (slices, C) matrix of A): the second
/// pass of the one-read kernels (bias_backward_v2, layernorm_backward_v3), whose first pass leaves
/// 128 or more rows of partial sums. column_total_kernel gives each column one thread that adds
/// its slices one after another (a chain of dependent loads: ~5 us at 128 slices, as long as the
/// first pass at C = 768); here the 8 warps of a block of 32 columns each add every 8th slice in
/// order, then warp 0 adds the 8 warps' sums in order: the bits depend on (slices, C) only.
/// Grid (C + 31) / 32 blocks of 256 threads.
template <class G, class A>
__global__ void __launch_bounds__(8 * kWarp)
    column_total_grouped_kernel(G* out, const A* partial, int64_t slices, int64_t C) {
  __shared__ A part[8][kWarp];
  const int g = threadIdx.x / kWarp, l = threadIdx.x % kWarp;
  const int64_t c = blockIdx.x * int64_t{kWarp} + l;
  A s = 0;
  if (c < C)
    for (int64_t p = g; p < slices; p += 8) s += partial[p * C + c];
  part[g][l] = s;
  __syncthreads();
  if (g == 0 && c < C) {
    A t = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) t += part[k][l];
    out[c] = G(A(out[c]) + t);
  }
}

/// out[c] += the column sums of partial (slices, C) by column_total_grouped_kernel.
template <class G, class A>
void add_partial_rows(G* out, const A* partial, int64_t slices, int64_t C) {
  if (C == 0) return;
  column_total_grouped_kernel<G, A><<<static_cast<unsigned>((C + kWarp - 1) / kWarp), 8 * kWarp>>>(
      out, partial, slices, C);
  CUDA_CHECK_LAUNCH();
}

/// A summand of add_column_sums: the element (n, c) of a row-major (N, C) matrix of storage type
/// S, loaded into the compute type A (A = S unless S is bf16).
template <class S, class A = S>
struct Element {
  const S* p;
  int64_t C;
  __device__ A operator()(int64_t n, int64_t c) const { return A(p[n * C + c]); }
};

/// out[c] (G, on `device`) += the sum over rows n < N of f(n, c), summed in A: both passes.
template <class G, class A, class F>
void add_column_sums(G* out, int64_t N, int64_t C, F f, Device device) {
  if (C == 0) return;
  const int slices = column_slices(N);
  Tensor partial = Tensor::empty({slices, C}, dtype_of<A>(), device);
  column_partial_kernel<A><<<dim3(column_sum_blocks(C), slices), dim3(kColTile, kColTile)>>>(
      partial.data<A>(), N, C, f);
  CUDA_CHECK_LAUNCH();
  column_total_kernel<G, A><<<blocks_for(C), kThreads>>>(out, partial.data<A>(), slices, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda
