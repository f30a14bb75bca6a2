#pragma once
// Shared pieces of the CUDA kernels: launch geometry, warp reductions, the cuBLAS handle.
#include <cublas_v2.h>
#include <cuda_runtime.h>

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

/// The cuBLAS handle of the current device (created on first use, math mode applied).
cublasHandle_t cublas_handle();

/// Makes `device` current (every op does so first: a rank may own any GPU).
inline void use_device(const Tensor& t) { CUDA_CHECK(cudaSetDevice(t.device().index)); }

}  // namespace scalelab::ops::cuda
