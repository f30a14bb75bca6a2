// Flash attention on Hopper's warpgroup MMA (wgmma): version 2's three kernels (forward, dK/dV,
// dQ; flash_attention_tc_cuda.cu, read it first) for head size 64, with every tile product a
// wgmma.mma_async of the four warps together instead of mma.sync of each warp alone. Trial
// kernels "flash_forward_wgmma" and "flash_backward_wgmma" (common/ops/trial_kernels.hpp):
// written without a GPU; off until `ctest -L gpu` has checked them on an H100/H200 and
// scalelab_bench_attention has timed them beside version 2. Compiled for sm_90a only (this file
// is its own object library, common/tensor.cmake): they run on compute capability 9.0 devices.
//
// Why. On an H100 version 2 reached 145 TFLOP/s forward and 94 backward, cuDNN's (PyTorch's SDPA)
// 229 and 152; in lab 02's step on an H200 attention took 10.5 ms a step against cuDNN's 3.7
// (lab 02's README and deck), the largest gap left to PyTorch. mma.sync multiplies 16 x 8 x 16
// per warp: each warp loads its own copy of every B fragment from shared memory with ldmatrix,
// and with 16 rows a warp each fragment feeds one or two products, so shared-memory traffic, not
// the tensor cores, sets the pace (version 2's dK/dV kernel: 72 ldmatrix.x4 per 128 mma.sync a
// tile). And Hopper's tensor cores run at full rate only through wgmma: mma.sync reaches about
// two thirds of it. wgmma multiplies 64 x 64 x 16 per warpgroup and reads B (and A, when A is in
// shared memory) straight from shared memory, once for all four warps.
//
// What changes from version 2 (everything else is the same code: flash_tc.cuh's softmax, masks,
// P and dS to bf16 A fragments, stores):
//  - a block is one warpgroup (4 warps, 64 rows, as before), and it computes whole 64 x 64 tiles
//    together: no warp skips a tile on its own (causal: the masks zero what a warp's rows do not
//    see, as version 2's diagonal tiles do);
//  - tiles sit in shared memory as 64 rows of 128 bytes, swizzled (wgmma_layout.hpp), and the
//    products find them through descriptors: S = Q K^T (both K-major), O += P V (P from the
//    registers, V MN-major), and in the backward S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
//    dK += dS^T Q, S = Q K^T, dP = dO V^T, dQ += dS K;
//  - each batch of products is waited for at once (flash_wgmma.cuh): no overlap of the softmax
//    with the next product inside a block. The blocks beside it on the SM overlap instead
//    (FlashAttention-3's warp specialisation and ping-pong would do it inside: a later version).
#include <cuda_runtime.h>

#include "common/device.hpp"
#include "common/ops/cuda/flash_wgmma.cuh"
#include "common/tensor.hpp"

namespace scalelab::ops::cuda {

namespace {
using namespace flash_tc;
using flash_wgmma::Acc;
using flash_wgmma::kN;
namespace wg = flash_wgmma;

static_assert(kN == kept_ds::kTile, "the dK/dV kernel keeps dS^T in the dQ kernel's tiles");
constexpr int kTileBytes = kN * wgmma::kRowBytes;  // 64 rows of 64 bf16: 8 KiB
constexpr int kNT = kN / 8;                          // n-tiles of a 64 x 64 accumulator
// Shared memory of each kernel: five 8 KiB tiles (one fixed pair or one fixed tile, plus two
// double-buffered), 1 KiB to align them, and the dK/dV kernel's lse and D of two query tiles.
constexpr size_t kSmemForward = 5 * kTileBytes + wgmma::kAtomBytes;
constexpr size_t kSmemDkdv = 6 * kTileBytes + wgmma::kAtomBytes + 4 * kN * sizeof(float);
constexpr size_t kSmemDq = 6 * kTileBytes + wgmma::kAtomBytes;

// The copy of key tile t + 1 (K and V) into the other buffer starts, then key tile t's is
// waited for (the forward's and the dQ kernel's loops).
__device__ inline void next_kv_tile(unsigned char* Ks, unsigned char* Vs, Rows k, Rows v,
                                    int t, int n_tiles, int T) {
  if (t + 1 < n_tiles) {  // the next tile's copy runs while this one is multiplied
    const int nb = (t + 1) % 2;
    wg::load_tile(Ks + nb * kTileBytes, k, (t + 1) * kN, T);
    wg::load_tile(Vs + nb * kTileBytes, v, (t + 1) * kN, T);
    cp_async_commit();
    wg::tiles_landed<1>();
  } else {
    wg::tiles_landed<0>();
  }
}

// ---- forward ----------------------------------------------------------------------------------
// Grid (query tiles, NH, B); the warpgroup owns 64 query rows from q0 (warp w: 16 w .. + 15),
// loops over key tiles of 64 like version 2.
__global__ void __launch_bounds__(kBlock)
    flash_wgmma_forward_kernel(bf16* out_base, float* lse, const bf16* q_base,
                               const bf16* k_base, const bf16* v_base, Heads qh, Heads kh,
                               Heads vh, Heads oh, int T, float scale_log2, bool causal) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* Qs = wg::aligned_smem(smem_raw);
  unsigned char* Ks = Qs + kTileBytes;      // 2 tiles (double buffer)
  unsigned char* Vs = Ks + 2 * kTileBytes;  // 2 tiles

  const Rows q = qh.at(q_base), k = kh.at(k_base), v = vh.at(v_base);
  const OutRows out = oh.at(out_base);
  lse += ((int64_t)blockIdx.z * gridDim.y + blockIdx.y) * T;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kN;  // causal: the longest rows first
  const int warp = threadIdx.x / kWarp, ln = threadIdx.x % kWarp;
  const int w0 = q0 + warp * kRowsPerWarp;
  const int row[1][2] = {{w0 + ln / 4, w0 + ln / 4 + 8}};
  const int n_tiles = ((causal ? min(q0 + kN, T) : T) + kN - 1) / kN;

  wg::load_tile(Qs, q, q0, T);
  wg::load_tile(Ks, k, 0, T);
  wg::load_tile(Vs, v, 0, T);
  cp_async_commit();

  float o[1][kNT][4];
  float m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.f, 0.f}};
  zero(o[0]);
  for (int t = 0; t < n_tiles; ++t) {
    next_kv_tile(Ks, Vs, k, v, t, n_tiles, T);
    const uint32_t Kt = smem_u32(Ks + (t % 2) * kTileBytes);
    const uint32_t Vt = smem_u32(Vs + (t % 2) * kTileBytes);
    const int k0 = t * kN;
    float s[1][kNT][4];
    wg::fence();
    wg::issue_ss(s[0], smem_u32(Qs), Kt);  // S = Q K^T
    wg::finish(s[0]);
    const bool edge = (causal && k0 + kN - 1 > w0) || k0 + kN > T;
    scale_and_mask<1, kNT>(s, row, k0, edge, causal, T, scale_log2);
    online_softmax<1, kNT, kNT>(s, o, m, l);
    uint32_t pf[kNT / 2][4];
    acc_to_a<kNT / 2>(pf, s[0]);
    wg::pin(o[0]);
    wg::pin(pf);
    wg::fence();  // the rescaled O and P are written before the tensor cores read them
    wg::issue_rs(o[0], pf, Vt);  // O += P V
    wg::finish(o[0]);
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
  store_out_lse<1, kNT>(out, lse, o, m, l, row, T);
}

// ---- backward: dK and dV ------------------------------------------------------------------------
// Grid (key tiles, NH, B); the warpgroup owns 64 keys from k0 (warp w: 16 w .. + 15) and loops
// over the query tiles that see them, as version 2's dK/dV kernel. kKeepDs (the trial kernel
// "flash_dq_from_kept_ds"): each dS^T tile is also stored at ds_base for the dQ kernel that
// reads it back (kept_ds.hpp; version 2's flash_tc_dq_from_kept_ds).
template <bool kKeepDs>
__global__ void __launch_bounds__(kBlock)
    flash_wgmma_dkdv_kernel(bf16* dk_base, bf16* dv_base, const bf16* q_base,
                            const bf16* k_base, const bf16* v_base, const bf16* dout_base,
                            const float* lse, const float* D, Heads qh, Heads kh, Heads vh,
                            Heads oh, int T, float scale, float scale_log2, bool causal,
                            bf16* ds_base) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* Ks = wg::aligned_smem(smem_raw);
  unsigned char* Vs = Ks + kTileBytes;
  unsigned char* Qs = Vs + kTileBytes;       // 2 tiles
  unsigned char* dOs = Qs + 2 * kTileBytes;  // 2 tiles
  float* lse_s = reinterpret_cast<float*>(dOs + 2 * kTileBytes);  // 2 x 64, log2 units
  float* D_s = lse_s + 2 * kN;                                     // 2 x 64

  const Rows q = qh.at(q_base), k = kh.at(k_base), v = vh.at(v_base), dout = oh.at(dout_base);
  const OutRows dk = kh.at(dk_base), dv = vh.at(dv_base);
  const int64_t bh = (int64_t)blockIdx.z * gridDim.y + blockIdx.y, head_row = bh * T;
  lse += head_row, D += head_row;
  const int k0 = blockIdx.x * kN;
  const int warp = threadIdx.x / kWarp, ln = threadIdx.x % kWarp;
  const int w0 = k0 + warp * kRowsPerWarp;
  const int key[2] = {w0 + ln / 4, w0 + ln / 4 + 8};
  const int i_begin = causal ? k0 : 0;
  const int n_tiles = (T - i_begin + kN - 1) / kN;

  wg::load_tile(Ks, k, k0, T);
  wg::load_tile(Vs, v, k0, T);
  wg::load_tile(Qs, q, i_begin, T);
  wg::load_tile(dOs, dout, i_begin, T);
  cp_async_commit();
  load_query_rows<kN>(lse_s, D_s, lse, D, i_begin, T);

  float dk_acc[kNT][4], dv_acc[kNT][4];
  zero(dk_acc);
  zero(dv_acc);
  for (int t = 0; t < n_tiles; ++t) {
    const int i0 = i_begin + t * kN;
    if (t + 1 < n_tiles) {
      const int nb = (t + 1) % 2;
      wg::load_tile(Qs + nb * kTileBytes, q, i0 + kN, T);
      wg::load_tile(dOs + nb * kTileBytes, dout, i0 + kN, T);
      cp_async_commit();
      load_query_rows<kN>(lse_s + nb * kN, D_s + nb * kN, lse, D, i0 + kN, T);
      wg::tiles_landed<1>();
    } else {
      wg::tiles_landed<0>();
    }
    const uint32_t Qt = smem_u32(Qs + (t % 2) * kTileBytes);
    const uint32_t dOt = smem_u32(dOs + (t % 2) * kTileBytes);
    float p[kNT][4], ds[kNT][4];  // S^T then P^T; dP^T then dS^T
    wg::fence();
    wg::issue_ss(p, smem_u32(Ks), Qt);    // S^T = K Q^T
    wg::issue_ss(ds, smem_u32(Vs), dOt);  // dP^T = V dO^T
    wg::finish(p, ds);
    // kept: keys past T masked to zeros too (their K rows are zeros in the dQ product anyway)
    dkdv_probabilities<kN, kKeepDs>(p, ds, lse_s + (t % 2) * kN, D_s + (t % 2) * kN, i0, w0,
                                    key, causal, T, scale_log2);
    if constexpr (kKeepDs)
      store_kept_ds(kept_ds_tile(ds_base, bh, i0 / kN, blockIdx.x, gridDim.x, causal), ds);
    uint32_t pf[kNT / 2][4], dsf[kNT / 2][4];
    acc_to_a<kNT / 2>(pf, p);
    acc_to_a<kNT / 2>(dsf, ds);
    wg::pin(pf);
    wg::pin(dsf);
    wg::fence();
    wg::issue_rs(dv_acc, pf, dOt);  // dV += P^T dO
    wg::issue_rs(dk_acc, dsf, Qt);  // dK += dS^T Q
    wg::finish(dv_acc, dk_acc);
    __syncthreads();
  }
  store_dkdv<kN>(dk, dv, dk_acc, dv_acc, key, T, scale);
}

// ---- backward: dQ -------------------------------------------------------------------------------
// Grid (query tiles, NH, B); the warpgroup owns 64 queries from q0 and loops over key tiles, as
// version 2's dQ kernel.
__global__ void __launch_bounds__(kBlock)
    flash_wgmma_dq_kernel(bf16* dq_base, const bf16* q_base, const bf16* k_base,
                          const bf16* v_base, const bf16* dout_base, const float* lse,
                          const float* D, Heads qh, Heads kh, Heads vh, Heads oh, int T,
                          float scale, float scale_log2, bool causal) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* Qs = wg::aligned_smem(smem_raw);
  unsigned char* dOs = Qs + kTileBytes;
  unsigned char* Ks = dOs + kTileBytes;     // 2 tiles
  unsigned char* Vs = Ks + 2 * kTileBytes;  // 2 tiles

  const Rows q = qh.at(q_base), k = kh.at(k_base), v = vh.at(v_base), dout = oh.at(dout_base);
  const OutRows dq = qh.at(dq_base);
  const int64_t head_row = ((int64_t)blockIdx.z * gridDim.y + blockIdx.y) * T;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kN;
  const int warp = threadIdx.x / kWarp, ln = threadIdx.x % kWarp;
  const int w0 = q0 + warp * kRowsPerWarp;
  const int row[2] = {w0 + ln / 4, w0 + ln / 4 + 8};
  float lse_row[2], D_row[2];
  load_row_stats(lse_row, D_row, lse, D, head_row, row, T);
  const int n_tiles = ((causal ? min(q0 + kN, T) : T) + kN - 1) / kN;

  wg::load_tile(Qs, q, q0, T);
  wg::load_tile(dOs, dout, q0, T);
  wg::load_tile(Ks, k, 0, T);
  wg::load_tile(Vs, v, 0, T);
  cp_async_commit();

  float dq_acc[kNT][4];
  zero(dq_acc);
  for (int t = 0; t < n_tiles; ++t) {
    next_kv_tile(Ks, Vs, k, v, t, n_tiles, T);
    const uint32_t Kt = smem_u32(Ks + (t % 2) * kTileBytes);
    const uint32_t Vt = smem_u32(Vs + (t % 2) * kTileBytes);
    const int k0 = t * kN;
    float s[kNT][4], ds[kNT][4];  // S; dP then dS
    wg::fence();
    wg::issue_ss(s, smem_u32(Qs), Kt);    // S = Q K^T
    wg::issue_ss(ds, smem_u32(dOs), Vt);  // dP = dO V^T
    wg::finish(s, ds);
    const bool edge = (causal && k0 + kN - 1 > w0) || k0 + kN > T;
    dq_probabilities<kNT>(s, ds, row, lse_row, D_row, k0, edge, causal, T, scale_log2);
    uint32_t dsf[kNT / 2][4];
    acc_to_a<kNT / 2>(dsf, ds);
    wg::pin(dsf);
    wg::fence();
    wg::issue_rs(dq_acc, dsf, Kt);  // dQ += dS K
    wg::finish(dq_acc);
    __syncthreads();
  }
  store_rows<kNT>(dq, dq_acc, row, T, scale);
}

const bf16* cdata(const Tensor& t) { return static_cast<const bf16*>(t.data_ptr()); }
bf16* mdata(Tensor& t) { return static_cast<bf16*>(t.data_ptr()); }
}  // namespace

bool flash_wgmma_runs_here(const AttentionLayout& l) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return l.hs == 64 && cuda_compute_capability(dev) == 90;  // sm_90a code runs on 9.0 only
}

void flash_wgmma_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                         const Tensor& v, const AttentionLayout& l, float scale, bool causal) {
  launch(flash_wgmma_forward_kernel, grid_for(l, kN), kSmemForward, mdata(out),
         lse.data<float>(), cdata(q), cdata(k), cdata(v), in_heads(l, l.q_off),
         in_heads(l, l.k_off), in_heads(l, l.v_off), out_heads(l), static_cast<int>(l.T),
         scale * kLog2e, causal);
}

void flash_wgmma_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                          const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                          const Tensor& D, const AttentionLayout& l, float scale, bool causal,
                          bool keep_ds) {
  const int T = static_cast<int>(l.T);
  Tensor ds;  // the kept dS^T tiles (keep_ds only)
  auto dkdv = [&](auto kernel) {
    launch(kernel, grid_for(l, kN), kSmemDkdv, mdata(dk), mdata(dv), cdata(q), cdata(k),
           cdata(v), cdata(dout), lse.data<float>(), D.data<float>(), in_heads(l, l.q_off),
           in_heads(l, l.k_off), in_heads(l, l.v_off), out_heads(l), T, scale, scale * kLog2e,
           causal, ds.defined() ? mdata(ds) : nullptr);
  };
  if (keep_ds) {
    ds = flash_kept_ds_scratch(l, causal, q.device());
    dkdv(flash_wgmma_dkdv_kernel<true>);
    flash_tc_dq_from_kept_ds(dq, ds, k, l, scale, causal);
    return;
  }
  dkdv(flash_wgmma_dkdv_kernel<false>);
  launch(flash_wgmma_dq_kernel, grid_for(l, kN), kSmemDq, mdata(dq), cdata(q), cdata(k),
         cdata(v), cdata(dout), lse.data<float>(), D.data<float>(), in_heads(l, l.q_off),
         in_heads(l, l.k_off), in_heads(l, l.v_off), out_heads(l), T, scale, scale * kLog2e,
         causal);
}

}  // namespace scalelab::ops::cuda
