// The bias gradient (the column sums of dout), version 2: 16-byte loads, each lane's 8 column
// sums in registers over its rows. Trial kernel "bias_backward_v2"
// (common/ops/trial_kernels.hpp): written without a GPU; off until `ctest -L gpu` has checked it
// and scalelab_bench_kernels has timed it beside version 1 and cuBLASLt's BGRADB epilogue.
//
// Read version 1 first (column_sums.cuh: a (32, 32) block per 32 columns and slice of rows, each
// thread adding one element a row). In bf16 a warp there loads 64 bytes an instruction. In lab
// 02's step on an H200 the bias gradients took 1.1 ms a step (cuBLASLt's BGRADB kernel
// globalKernelBgradAB_v2; version 1 took as long: lab 02's README) for ~2.7 GB of dout (48
// Linears' dout of 16384 rows): ~2.5 TB/s of the H200's ~4.8. Reading each byte once is all a
// column sum needs, so what changes is how many bytes each instruction moves and how many are
// in flight:
//  - a block owns 256 columns (8 a lane, one 16-byte load: a warp moves 512 bytes an
//    instruction) and a slice of ~128 rows; its 8 warps take the slice's rows in turn, each warp
//    4 rows at once (their loads go out together);
//  - each lane's 8 sums stay in registers over all its rows; at the end the block's 8 warps
//    add theirs in warp order in shared memory, one row of partial sums a slice;
//  - add_partial_rows (column_sums.cuh) adds the slices into dbias, 8 warps a column block each
//    adding every 8th slice in order (version 1's second pass, one thread a column, would be a
//    chain of 128 dependent loads: as long as this kernel at C = 768).
// bf16 dout with C a multiple of 256 (gpt-85m: 768, 2304, 3072) and 16-byte aligned; elsewhere
// it returns false and the caller runs version 1.
//
// Deterministic and the same on any GPU: the slices depend on N only; a lane adds its rows in
// order, a block its warps in order, the second pass its slices in a fixed order.
#include <algorithm>

#include "common/ops/cuda/column_sums.cuh"
#include "common/ops/cuda/kernels.cuh"
#include "common/ops/fused_backend.hpp"

namespace scalelab::ops::cuda {

namespace {
constexpr int kWarps = 8;                 // warps a block
constexpr int kCols = 8 * kWarp;          // columns a block: 8 a lane, one 16-byte load
constexpr int kInFlight = 4;              // rows a warp loads at once
constexpr int64_t kRowsPerSlice = 128;    // 16 rows a warp
constexpr int64_t kMaxSlices = 1024;      // beyond N = 131072 a slice takes more rows

__device__ inline void add8(float (&s)[8], const Pack8& v) {
#pragma unroll
  for (int e = 0; e < 8; ++e) s[e] += float(v.e[e]);
}

// Grid (C / 256 column blocks, slices): partial[slice, c] = the sum of dout's column c over the
// slice's rows.
__global__ void __launch_bounds__(kWarps * kWarp)
    bias_backward_v2_kernel(float* __restrict__ partial, const bf16* __restrict__ dout, int64_t N,
                            int64_t C) {
  __shared__ float sums[kWarps][kCols];
  const int warp = threadIdx.x / kWarp, ln = threadIdx.x % kWarp;
  const int64_t c0 = int64_t{blockIdx.x} * kCols + 8 * ln;  // this lane's first column
  const int64_t lo = N * blockIdx.y / gridDim.y, hi = N * (blockIdx.y + 1) / gridDim.y;
  const auto at = [&](int64_t row) { return *reinterpret_cast<const Pack8*>(dout + row * C + c0); };
  float s[8] = {};
  int64_t row = lo + warp;
  for (; row + (kInFlight - 1) * kWarps < hi; row += kInFlight * kWarps) {
    Pack8 v[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) v[i] = at(row + i * kWarps);
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) add8(s, v[i]);  // in row order
  }
  for (; row < hi; row += kWarps) add8(s, at(row));
#pragma unroll
  for (int e = 0; e < 8; ++e) sums[warp][8 * ln + e] = s[e];
  __syncthreads();
  // one column a thread (256 threads, 256 columns): the warps' sums in warp order
  const int c = threadIdx.x;
  float t = 0.f;
#pragma unroll
  for (int k = 0; k < kWarps; ++k) t += sums[k][c];
  partial[blockIdx.y * C + int64_t{blockIdx.x} * kCols + c] = t;
}
static_assert(kWarps * kWarp == kCols, "one column a thread in the block's final add");
}  // namespace

bool bias_backward_v2(Tensor& dbias, const Tensor& dout) {
  const int64_t C = dbias.numel(), N = C > 0 ? dout.numel() / C : 0;
  if (dout.dtype() != DType::bf16 || N == 0 || C % kCols != 0 || !dout.is_contiguous() ||
      !aligned16(dout.data_ptr()))
    return false;
  use_device(dbias);
  const int64_t slices =
      std::clamp<int64_t>((N + kRowsPerSlice - 1) / kRowsPerSlice, 1, kMaxSlices);
  Tensor partial = Tensor::empty({slices, C}, DType::f32, dbias.device());
  bias_backward_v2_kernel<<<dim3(static_cast<unsigned>(C / kCols), static_cast<unsigned>(slices)),
                            kWarps * kWarp>>>(partial.data<float>(), dout.data<bf16>(), N, C);
  CUDA_CHECK_LAUNCH();
  with_grad_type<bf16>(dbias.dtype(), [&](auto g_tag) {
    using G = decltype(g_tag);
    add_partial_rows<G, float>(dbias.data<G>(), partial.data<float>(), slices, C);
  });
  return true;
}

}  // namespace scalelab::ops::cuda
