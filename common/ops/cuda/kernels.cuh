#pragma once
// Shared pieces of the CUDA kernels: launch geometry, warp reductions, the cuBLAS handle.
#include <cmath>
#include <cstdint>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/bf16.hpp"
#include "common/ops/cuda/cuda_check.cuh"
#include "common/ops/cuda/ops_cuda.hpp"

namespace scalelab::ops::cuda {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

/// Blocks for a grid-stride loop over n elements (capped: each thread then loops).
inline int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b < 1 ? 1 : b) : 65535);
}

/// Blocks for one warp per row.
inline int blocks_for_rows(int64_t rows) {
  const int64_t per_block = kThreads / kWarp;
  int64_t b = (rows + per_block - 1) / per_block;
  return static_cast<int>(b < 1 ? 1 : b);
}

#define SCALELAB_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)blockDim.x * gridDim.x)

template <class S>
__device__ inline S warp_sum(S v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class S>
__device__ inline S warp_max(S v) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    S other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  return v;
}

/// The global row handled by this warp (one warp per row), and the lane.
__device__ inline int64_t warp_row() {
  return (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / kWarp;
}
__device__ inline int lane() { return threadIdx.x % kWarp; }

/// One warp's row of a softmax: out[c] = exp(x[c] - max) / sum over the C columns (S storage, A
/// arithmetic). Returns the row's log-sum-exp, log(sum) + max (what cross-entropy needs).
template <class S, class A>
__device__ inline A warp_softmax_row(S* out, const S* x, int64_t C) {
  A mx = -INFINITY;
  for (int64_t c = lane(); c < C; c += kWarp) mx = max(mx, A(x[c]));
  mx = warp_max(mx);
  A s = 0;
  for (int64_t c = lane(); c < C; c += kWarp) s += exp(A(x[c]) - mx);
  s = warp_sum(s);
  for (int64_t c = lane(); c < C; c += kWarp) out[c] = S(exp(A(x[c]) - mx) / s);
  return log(s) + mx;
}

/// One warp's row of a LayerNorm: out = (x - mean) * rstd * w + b over the C columns; lane 0
/// stores mean and rstd. Each lane reads only the columns it would write, so x may be a row the
/// same lanes just stored (the fused residual + LayerNorm).
template <class S, class A>
__device__ inline void warp_layernorm_row(S* out, A* mean, A* rstd, const S* x, const S* w,
                                          const S* b, int64_t C, A eps) {
  A s = 0;
  for (int64_t c = lane(); c < C; c += kWarp) s += A(x[c]);
  const A m = warp_sum(s) / C;
  A v = 0;
  for (int64_t c = lane(); c < C; c += kWarp) v += (A(x[c]) - m) * (A(x[c]) - m);
  const A r = A(1) / sqrt(warp_sum(v) / C + eps);
  for (int64_t c = lane(); c < C; c += kWarp) out[c] = S((A(x[c]) - m) * r * A(w[c]) + A(b[c]));
  if (lane() == 0) {
    *mean = m;
    *rstd = r;
  }
}

/// One warp's two row means of LayerNorm's backward, over the C columns of a row x with output
/// gradient dy: a = mean(dnorm), b = mean(dnorm * norm), where norm = (x - m) * r and
/// dnorm = w * dy. The row's input gradient is then r * (dnorm - a - norm * b), column by column.
template <class S, class A>
__device__ inline void warp_layernorm_backward_means(A& a, A& b, const S* x, const S* dy,
                                                     const S* w, A m, A r, int64_t C) {
  a = 0, b = 0;
  for (int64_t c = lane(); c < C; c += kWarp) {
    const A norm = (A(x[c]) - m) * r, dnorm = A(w[c]) * A(dy[c]);
    a += dnorm;
    b += dnorm * norm;
  }
  a = warp_sum(a) / C;
  b = warp_sum(b) / C;
}

/// Calls f(G{}) with G the type of a parameter gradient that may be the data's storage type S or
/// f32 when S is bf16 (rules R3, R4, R6: fp32 gradients of bf16 data).
template <class S, class F>
void with_grad_type(DType grad_dtype, F f) {
  if (grad_dtype == dtype_of<S>()) f(S{});
  else if (grad_dtype == DType::f32) f(float{});
  else SCALELAB_CHECK(false, "gradient dtype {} for {} data", dtype_name(grad_dtype), dtype_name(dtype_of<S>()));
}

/// Eight bf16 loaded or stored in one 16-byte access (a warp moves 512 bytes an instruction): the
/// one-read kernels' unit (LayerNorm backward version 3, the bias gradient's version 2).
struct alignas(16) Pack8 {
  bf16 e[8];  ///< 8 consecutive columns
};

/// Whether p may be read as Pack8 (16-byte aligned).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// The cuBLAS handle of the current device (created on first use, math mode applied).
cublasHandle_t cublas_handle();

/// Makes `device` current (every op does so first: a rank may own any GPU).
inline void use_device(const Tensor& t) { CUDA_CHECK(cudaSetDevice(t.device().index)); }

}  // namespace scalelab::ops::cuda
