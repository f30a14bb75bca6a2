// LayerNorm backward, version 3: dx, dweight and dbias from one read of x and dout, with the
// column sums in registers. Trial kernel "layernorm_backward_v3" (common/ops/trial_kernels.hpp):
// written without a GPU; off until `ctest -L gpu` has checked it and scalelab_bench_kernels has
// timed it beside versions 1 and 2.
//
// Read version 1 (norm_cuda.cu: a dx kernel, then two GPU-wide column sums that read dout, and x
// and dout, again) and version 2 (layernorm_backward_v2_cuda.cu: one read, the sums in shared
// memory) first. Version 2 was 3.3x slower than version 1 on an H200 (0.33 ms against 0.10 at
// gpt-85m's 16384 x 768): its warps take one row at a time with 2-byte loads (64 bytes a warp
// instruction), add every element into shared memory (a read and a write per element), and each
// block of 32 rows zeroes and sums 8 warps' 2 C sums, about as much work as its rows, then leaves
// 512 rows of partial sums for two more passes. What changes here:
//  - a lane loads 8 columns at once (16 bytes: a warp moves 512 bytes an instruction), columns
//    c = 256 j + 8 lane + e of the row's C / 256 chunks j;
//  - those columns are the lane's for every row it sees, so their dweight and dbias sums live in
//    its registers (2 x 8 C / 256 floats) across all its rows: nothing in shared memory until
//    the block's rows are done;
//  - a block takes 128 rows (8 warps, 16 rows each), so the partial sums are N / 128 rows, added
//    into dweight and dbias by add_partial_rows (column_sums.cuh: one launch each). The sums and a row's values
//    take ~195 registers a thread at C = 768 (ptxas), so an SM holds one block of 8 warps:
//    gpt-85m's 16384 rows make 128 blocks, one wave on an H100's or H200's 132 SMs. (Held to
//    2 blocks an SM, 128 registers, it spills.)
// It takes bf16 data with C a multiple of 256 up to 1024 (gpt-85m: 768) and 16-byte aligned rows;
// elsewhere it returns false and the caller runs version 1.
//
// A row's x, dout and din are loaded together (one round trip to memory a row, not two: ptxas
// does not move the din loads above the row's two warp sums by itself), and the pointers are
// __restrict__ (din is written, x, dout, w only read; no two alias).
//
// Deterministic and the same on any GPU: the grid depends on N only; a lane adds its rows in
// order, a block its warps in order, add_partial_rows the blocks in a fixed order. The bits differ from
// version 1's in the order of float sums (dx: the row's two means are summed over other column
// sets per lane), within the tolerances of version 2's test.
#include <algorithm>
#include <initializer_list>

#include "common/ops/cuda/column_sums.cuh"
#include "common/ops/cuda/kernels.cuh"
#include "common/ops/fused_backend.hpp"

namespace scalelab::ops::cuda {

namespace {
constexpr int kWarps = 8;                    // warps a block
constexpr int64_t kRowsPerBlock = 128;       // 16 rows a warp
constexpr int64_t kMaxBlocks = 1024;         // beyond N = 131072 a block takes more rows
constexpr int kChunk = 8 * kWarp;            // columns a warp covers with one 16-byte load a lane

template <int CH>  // CH = C / 256 chunks a row
__global__ void __launch_bounds__(kWarps * kWarp)
    // din and base may be one buffer (din += ...): neither is __restrict__
    layernorm_backward_v3_kernel(bf16* din, float* __restrict__ partial_dw,
                                 float* __restrict__ partial_db, const bf16* base,
                                 const bf16* __restrict__ dout,
                                 const bf16* __restrict__ in, const bf16* __restrict__ w,
                                 const float* __restrict__ mean, const float* __restrict__ rstd,
                                 int64_t N) {
  constexpr int64_t C = int64_t{CH} * kChunk;
  __shared__ float sums[kWarps][C];  // each warp's dweight (then dbias) sums, for the block's add
  const int warp = threadIdx.x / kWarp, ln = threadIdx.x % kWarp;
  Pack8 wv[CH];  // this lane's columns of the weight, for every row
#pragma unroll
  for (int j = 0; j < CH; ++j) wv[j] = *reinterpret_cast<const Pack8*>(w + kChunk * j + 8 * ln);
  float dw[CH][8] = {}, db[CH][8] = {};
  const int64_t lo = N * blockIdx.x / gridDim.x, hi = N * (blockIdx.x + 1) / gridDim.x;
  for (int64_t row = lo + warp; row < hi; row += kWarps) {
    const float m = mean[row], r = rstd[row];
    const int64_t at = row * C + 8 * ln;
    Pack8 xv[CH], gv[CH], dv[CH];  // the row's three reads go out together: one round trip
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      xv[j] = *reinterpret_cast<const Pack8*>(in + at + kChunk * j);
      gv[j] = *reinterpret_cast<const Pack8*>(dout + at + kChunk * j);
      dv[j] = *reinterpret_cast<const Pack8*>(base + at + kChunk * j);  // din, or the residual's
    }
    // the row's two means, as version 1's warp_layernorm_backward_means
    float a = 0.f, b = 0.f;
#pragma unroll
    for (int j = 0; j < CH; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float norm = (float(xv[j].e[e]) - m) * r,
                    dnorm = float(wv[j].e[e]) * float(gv[j].e[e]);
        a += dnorm;
        b += dnorm * norm;
      }
    a = warp_sum(a) / C;
    b = warp_sum(b) / C;
#pragma unroll
    for (int j = 0; j < CH; ++j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float g = float(gv[j].e[e]), norm = (float(xv[j].e[e]) - m) * r,
                    dnorm = float(wv[j].e[e]) * g;
        dv[j].e[e] = bf16(float(dv[j].e[e]) + r * (dnorm - a - norm * b));
        dw[j][e] += norm * g;
        db[j][e] += g;
      }
      *reinterpret_cast<Pack8*>(din + at + kChunk * j) = dv[j];
    }
  }
  // the block's sums, dweight's then dbias's: each warp's in shared memory, then added in warp
  // order into one row per block (one buffer for both: 8 warps x C floats, 24 KiB at C = 768)
  for (int which = 0; which < 2; ++which) {
    float* out = which == 0 ? partial_dw : partial_db;
    if (which == 1) __syncthreads();  // the dweight sums are read before they are overwritten
#pragma unroll
    for (int j = 0; j < CH; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        sums[warp][kChunk * j + 8 * ln + e] = which == 0 ? dw[j][e] : db[j][e];
    __syncthreads();
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float s = 0.f;
      for (int k = 0; k < kWarps; ++k) s += sums[k][c];
      out[blockIdx.x * C + c] = s;
    }
  }
}

}  // namespace

bool layernorm_backward_v3(Tensor& din, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                           const Tensor& in, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, const Tensor& base) {
  const int64_t C = in.size(-1), N = in.numel() / C;
  if (in.dtype() != DType::bf16 || N == 0 || C % kChunk != 0 || C / kChunk > 4) return false;
  for (const void* p : std::initializer_list<const void*>{din.data_ptr(), base.data_ptr(),
                                                          dout.data_ptr(), in.data_ptr(),
                                                          weight.data_ptr()})
    if (!aligned16(p)) return false;
  use_device(din);
  const int64_t blocks =
      std::clamp<int64_t>((N + kRowsPerBlock - 1) / kRowsPerBlock, 1, kMaxBlocks);
  Tensor partial = Tensor::empty({2, blocks, C}, DType::f32, din.device());
  float* pdw = partial.data<float>();
  float* pdb = pdw + blocks * C;
  const auto run = [&](auto kernel) {
    kernel<<<static_cast<int>(blocks), kWarps * kWarp>>>(
        din.data<bf16>(), pdw, pdb, base.data<bf16>(), dout.data<bf16>(), in.data<bf16>(),
        weight.data<bf16>(),
        mean.data<float>(), rstd.data<float>(), N);
    CUDA_CHECK_LAUNCH();
  };
  switch (C / kChunk) {
    case 1: run(layernorm_backward_v3_kernel<1>); break;
    case 2: run(layernorm_backward_v3_kernel<2>); break;
    case 3: run(layernorm_backward_v3_kernel<3>); break;
    default: run(layernorm_backward_v3_kernel<4>); break;
  }
  with_grad_type<bf16>(dweight.dtype(), [&](auto g_tag) {
    using G = decltype(g_tag);
    add_partial_rows<G, float>(dweight.data<G>(), pdw, blocks, C);
    add_partial_rows<G, float>(dbias.data<G>(), pdb, blocks, C);
  });
  return true;
}

}  // namespace scalelab::ops::cuda
