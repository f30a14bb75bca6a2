// Flash attention, version 2: FlashAttention-2 (Dao 2023) on tensor cores, bf16 in and fp32
// accumulators. Read version 1 (flash_attention_cuda.cu) first: same algorithm, same names.
//
// Why version 1 is slow, and why bf16 pays only now. Version 1 gives each thread one query row
// and does every product with scalar FMAs on the CUDA cores; bf16 there only halves the bytes
// loaded, because the tiles are converted to float when staged, so the FMAs run at the fp32
// rate (about 67 TFLOP/s on an H100 SXM). Attention with T = 1024 is not limited by bytes but
// by those FMAs. Tensor cores multiply small bf16 tiles in one instruction at about 990 TFLOP/s
// (dense) on an H100 SXM: 15x, and only for 16-bit (or 8-bit) inputs. So bf16 now pays in
// arithmetic, not just in bytes.
//
// What changes from version 1:
//  - a WARP owns 16 query rows (not a thread one row); four warps make a 64-row block;
//  - S = Q K^T and O += P V are warp-wide mma.sync.m16n8k16 products whose operands sit in
//    registers as "fragments" spread over the 32 lanes (mma_fragments.hpp says who holds what);
//    ldmatrix loads those fragments from shared memory, 8x8 tiles at a time;
//  - the online softmax runs on the accumulator fragments: a lane holds parts of two rows, the
//    four lanes of a quad hold a whole row, so a row max is two shuffles;
//  - P never leaves the registers: an accumulator tile pair has the A operand's layout, so
//    exp(S - m) rounded to bf16 IS the A fragment of P V (FlashAttention-2's trick);
//  - K and V tiles are double-buffered in shared memory with cp.async: the copy of tile j + 1
//    runs while the tensor cores work on tile j;
//  - causal: tiles above the diagonal are never loaded, and only tiles that cross the diagonal
//    (or the end of the sequence) pay for the mask;
//  - q, k, v and out are read and written where an AttentionLayout says (fused_backend.hpp):
//    in place in the (B, T, 3C) QKV output, so no split/merge copies.
//
// Backward (deterministic, no atomics): D = rowsum(dO * O) first; then one kernel over key
// tiles computes dK and dV (each warp 16 keys, looping over the query tiles that see them), and
// one over query tiles computes dQ (each warp 16 queries, looping over key tiles): every output
// element is summed by one lane in a fixed order. FlashAttention-2 instead adds dQ with
// atomicAdd from the key-tile pass, whose order varies run to run; the price here is computing
// S and dP twice (7 tile products per (query, key) tile instead of 5). The one-kernel backward
// (flash_attention_tc_backward_cuda.cu, on trial) adds dQ from the key-tile pass in a fixed order;
// the kept-dS backward (kept_ds.hpp, on trial) has the dK/dV kernel store each dS^T tile for a dQ
// kernel that only multiplies (flash_tc_dq_from_kept_ds_kernel below).
//
// Shared memory rows are padded by 8 bf16 (16 bytes): a row of HS + 8 elements starts 4 banks
// after the previous one, so the 8 row addresses of one ldmatrix tile hit 8 different 16-byte
// bank groups (no conflicts) and every row stays 16-byte aligned for cp.async.
#include <type_traits>

#include "common/ops/cuda/flash_tc.cuh"
#include "common/ops/trial_kernels.hpp"

namespace scalelab::ops::cuda {

namespace {
using namespace flash_tc;

// ---- forward ----------------------------------------------------------------------------------
// Grid (query tiles, NH, B); 4 warps, warp w owns query rows q0 + 16 MT w .. + 16 MT - 1: MT row
// tiles of 16 (the M of m16n8k16). Bc keys a tile. MT = 1 is version 2 as first written.
// MT = 2 ("flash_forward_two_row_tiles", the default at head size 64) gives each warp 32 rows:
// each K or V fragment loaded from shared memory then feeds two products instead of one, for
// twice the registers of S and O (ldmatrix traffic, not the tensor cores, may set the pace at
// one row tile: 32 ldmatrix.x4 of 512 bytes per 64 products a tile).
template <int HS, int MT>
__global__ void __launch_bounds__(kBlock)
    flash_tc_forward_kernel(bf16* out_base, float* lse, const bf16* q_base, const bf16* k_base,
                            const bf16* v_base, Heads qh, Heads kh, Heads vh, Heads oh, int T,
                            float scale_log2, bool causal) {
  constexpr int Br = kTileRows * MT, Bc = 64, L = HS + 8;
  constexpr int WR = kRowsPerWarp * MT;  // rows a warp owns
  constexpr int KC = HS / 16;  // k-chunks of S = Q K^T (over the head dimension)
  constexpr int NS = Bc / 8;   // n-tiles of S (over the keys)
  constexpr int NO = HS / 8;   // n-tiles of O (over the head dimension)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);  // Br x L
  bf16* Ks = Qs + Br * L;                         // 2 x Bc x L (double buffer)
  bf16* Vs = Ks + 2 * Bc * L;                     // 2 x Bc x L

  const Rows q = qh.at(q_base), k = kh.at(k_base), v = vh.at(v_base);
  const OutRows out = oh.at(out_base);
  lse += ((int64_t)blockIdx.z * gridDim.y + blockIdx.y) * T;
  // causal: the last query tiles have the most keys to visit: start them first
  const int q0 = (gridDim.x - 1 - blockIdx.x) * Br;
  const int warp = threadIdx.x / kWarp, ln = threadIdx.x % kWarp;
  const int w0 = q0 + warp * WR;  // this warp's first query row
  int row[MT][2];                 // the two rows this lane holds in each row tile
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    row[mt][0] = w0 + kRowsPerWarp * mt + ln / 4, row[mt][1] = row[mt][0] + 8;
  const int n_tiles = ((causal ? min(q0 + Br, T) : T) + Bc - 1) / Bc;

  load_tile<Br, HS>(Qs, q, q0, T);
  load_tile<Bc, HS>(Ks, k, 0, T);
  load_tile<Bc, HS>(Vs, v, 0, T);
  cp_async_commit();

  uint32_t qf[MT][KC][4];  // this warp's query rows as A fragments, loaded once
  float o[MT][NO][4];      // the partial output, unnormalised (rows row[mt][0], row[mt][1])
  float m[MT][2], l[MT][2];  // running max, in log2 units (scores * scale * log2 e), and this
                             // lane's share of the running sum of exp2(s - m)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    zero(o[mt]);
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }

  for (int t = 0; t < n_tiles; ++t) {
    if (t + 1 < n_tiles) {  // start the copy of the next tile into the other buffer
      const int nb = (t + 1) % 2;
      load_tile<Bc, HS>(Ks + nb * Bc * L, k, (t + 1) * Bc, T);
      load_tile<Bc, HS>(Vs + nb * Bc * L, v, (t + 1) * Bc, T);
      cp_async_commit();
      cp_async_wait<1>();  // this tile's group (and Q's) has landed, the next one may not have
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // ... for every thread's copies
    if (t == 0)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        load_a<KC>(qf[mt], Qs + (warp * WR + kRowsPerWarp * mt) * L, L);
    const bf16* Kt = Ks + (t % 2) * Bc * L;
    const bf16* Vt = Vs + (t % 2) * Bc * L;
    const int k0 = t * Bc;
    // a tile wholly above this warp's rows (causal) adds nothing: the warp skips it
    if (!causal || k0 <= w0 + WR - 1) {
      float s[MT][NS][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) zero(s[mt]);
      mma_tiles<BIs::NK, KC, NS, MT>(s, qf, Kt, L);
      // mask (only tiles crossing the diagonal or the end pay for it), scale into log2 units,
      // then the online softmax (flash_tc.cuh): S becomes P
      const bool edge = (causal && k0 + Bc - 1 > w0) || k0 + Bc > T;
      scale_and_mask<MT, NS>(s, row, k0, edge, causal, T, scale_log2);
      online_softmax<MT, NS, NO>(s, o, m, l);
      // O += P V with P straight from the registers
      uint32_t pf[MT][NS / 2][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc_to_a<NS / 2>(pf[mt], s[mt]);
      mma_tiles<BIs::KN, NS / 2, NO, MT>(o, pf, Vt, L);
    }
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }

  store_out_lse<MT, NO>(out, lse, o, m, l, row, T);
}

// ---- backward ---------------------------------------------------------------------------------
// D_i = dO_i . O_i (fp32), one warp per row; rows in (b, h, t) order, as lse.
template <int HS>
__global__ void flash_tc_backward_d_kernel(float* D, const bf16* dout_base, const bf16* out_base,
                                           Heads oh, int NH, int T, int64_t rows) {
  const int64_t r = warp_row();
  if (r >= rows) return;
  const int t = static_cast<int>(r % T);
  const int64_t bh = r / T, b = bh / NH, h = bh % NH;
  const int64_t at = oh.off + b * oh.batch + h * oh.head + t * oh.ld;
  float s = 0.f;
  for (int d = lane(); d < HS; d += kWarp)
    s += float(dout_base[at + d]) * float(out_base[at + d]);
  s = warp_sum(s);
  if (lane() == 0) D[r] = s;
}

// dK and dV. Grid (key tiles, NH, B); warp w owns keys k0 + 16 w .. + 15 and loops over the
// query tiles (Bq rows) that see them; each tile is dkdv_tile (flash_tc.cuh), as in the
// one-kernel backward:
//   S^T = K Q^T, P^T = exp(S^T scale - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D),
//   dV += P^T dO,  dK += dS^T Q   (scaled by `scale` at the end).
// P^T and dS^T stay in registers as A operands, like P in forward.
// kMinBlocks > 0 asks ptxas to fit that many blocks on an SM: at most 65536 / (128 kMinBlocks)
// registers a thread, 168 for 3. Unbounded (0, the default: the machine code an H200 checked;
// a bound of 1 already allocates registers otherwise) it takes 175, so an SM holds 2 blocks, 8
// warps (on an H200 Nsight Compute saw 12% occupancy, its busiest pipe 22% busy, the warps
// stalled on latency that more of them would hide). 3 is the trial kernel
// "flash_dkdv_three_blocks"; its launch also asks for the most shared memory (3 blocks of 56 KiB).
// kKeepDs (the trial kernel "flash_dq_from_kept_ds", head size 64): each dS^T tile is also stored
// at ds_base (kept_ds.hpp) for the dQ kernel that reads it back instead of computing it again
// (the last parameter, unused otherwise: the other kernels' machine code stays as checked).
template <int HS, int kMinBlocks, bool kKeepDs = false>
__global__ void __launch_bounds__(kBlock, kMinBlocks)
    flash_tc_dkdv_kernel(bf16* dk_base, bf16* dv_base, const bf16* q_base, const bf16* k_base,
                         const bf16* v_base, const bf16* dout_base, const float* lse,
                         const float* D, Heads qh, Heads kh, Heads vh, Heads oh, int T,
                         float scale, float scale_log2, bool causal, bf16* ds_base) {
  constexpr int Bk = kTileRows, Bq = HS == 64 ? 64 : 32, L = HS + 8;
  static_assert(!kKeepDs || (Bq == kept_ds::kTile && Bk == kept_ds::kTile),
                "kept dS^T tiles are 64 keys x 64 queries");
  constexpr int NQ = Bq / 8;   // n-tiles of S^T (over the queries)
  constexpr int NO = HS / 8;   // n-tiles of dK, dV
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);  // Bk x L
  bf16* Vs = Ks + Bk * L;                         // Bk x L
  bf16* Qs = Vs + Bk * L;                         // 2 x Bq x L
  bf16* dOs = Qs + 2 * Bq * L;                    // 2 x Bq x L
  float* lse_s = reinterpret_cast<float*>(dOs + 2 * Bq * L);  // 2 x Bq, log2 units
  float* D_s = lse_s + 2 * Bq;                                // 2 x Bq

  const Rows q = qh.at(q_base), k = kh.at(k_base), v = vh.at(v_base), dout = oh.at(dout_base);
  const OutRows dk = kh.at(dk_base), dv = vh.at(dv_base);
  const int64_t bh = (int64_t)blockIdx.z * gridDim.y + blockIdx.y, head_row = bh * T;
  lse += head_row, D += head_row;
  const int k0 = blockIdx.x * Bk;  // causal: the first key tiles see the most queries: first
  const int warp = threadIdx.x / kWarp, ln = threadIdx.x % kWarp;
  const int w0 = k0 + warp * kRowsPerWarp;              // this warp's first key
  const int key[2] = {w0 + ln / 4, w0 + ln / 4 + 8};    // the two keys this lane holds
  const int i_begin = causal ? k0 : 0;                  // queries before k0 see none of them
  const int n_tiles = (T - i_begin + Bq - 1) / Bq;

  load_tile<Bk, HS>(Ks, k, k0, T);
  load_tile<Bk, HS>(Vs, v, k0, T);
  load_tile<Bq, HS>(Qs, q, i_begin, T);
  load_tile<Bq, HS>(dOs, dout, i_begin, T);
  cp_async_commit();
  load_query_rows<Bq>(lse_s, D_s, lse, D, i_begin, T);

  float dk_acc[NO][4], dv_acc[NO][4];
  zero(dk_acc);
  zero(dv_acc);
  for (int t = 0; t < n_tiles; ++t) {
    const int i0 = i_begin + t * Bq;
    if (t + 1 < n_tiles) {
      const int nb = (t + 1) % 2;
      load_tile<Bq, HS>(Qs + nb * Bq * L, q, i0 + Bq, T);
      load_tile<Bq, HS>(dOs + nb * Bq * L, dout, i0 + Bq, T);
      cp_async_commit();
      load_query_rows<Bq>(lse_s + nb * Bq, D_s + nb * Bq, lse, D, i0 + Bq, T);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* Qt = Qs + (t % 2) * Bq * L;
    const bf16* dOt = dOs + (t % 2) * Bq * L;
    const float* lse_t = lse_s + (t % 2) * Bq;
    const float* D_t = D_s + (t % 2) * Bq;
    // causal: a query tile wholly before this warp's keys adds nothing (kept, every warp makes
    // its rows of the tile, masked to zeros there: the dQ kernel reads whole tiles; keys past T
    // masked too, as the one-kernel backward's)
    if (kKeepDs || !causal || i0 + Bq - 1 >= w0) {
      float ds[NQ][4];  // dS^T
      dkdv_tile<HS, Bq, kKeepDs>(dk_acc, dv_acc, ds, Ks + warp * kRowsPerWarp * L,
                                 Vs + warp * kRowsPerWarp * L, Qt, dOt, lse_t, D_t, i0, w0, key,
                                 causal, T, scale_log2);
      if constexpr (kKeepDs)
        store_kept_ds(kept_ds_tile(ds_base, bh, i0 / Bq, blockIdx.x, gridDim.x, causal), ds);
    }
    __syncthreads();
  }
  store_dkdv<HS>(dk, dv, dk_acc, dv_acc, key, T, scale);
}

// dQ. Grid (query tiles, NH, B); warp w owns queries q0 + 16 w .. + 15 and loops over key
// tiles (Bc keys) like forward:
//   S = Q K^T, P = exp(S scale - lse), dP = dO V^T, dS = P (dP - D),  dQ += dS K (scaled).
template <int HS>
__global__ void __launch_bounds__(kBlock)
    flash_tc_dq_kernel(bf16* dq_base, const bf16* q_base, const bf16* k_base, const bf16* v_base,
                       const bf16* dout_base, const float* lse, const float* D, Heads qh,
                       Heads kh, Heads vh, Heads oh, int T, float scale, float scale_log2,
                       bool causal) {
  constexpr int Br = kTileRows, Bc = HS == 64 ? 64 : 32, L = HS + 8;
  constexpr int KC = HS / 16;
  constexpr int NS = Bc / 8;  // n-tiles of S (over the keys)
  constexpr int NO = HS / 8;  // n-tiles of dQ
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);  // Br x L
  bf16* dOs = Qs + Br * L;                        // Br x L
  bf16* Ks = dOs + Br * L;                        // 2 x Bc x L
  bf16* Vs = Ks + 2 * Bc * L;                     // 2 x Bc x L

  const Rows q = qh.at(q_base), k = kh.at(k_base), v = vh.at(v_base), dout = oh.at(dout_base);
  const OutRows dq = qh.at(dq_base);
  const int64_t head_row = ((int64_t)blockIdx.z * gridDim.y + blockIdx.y) * T;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * Br;
  const int warp = threadIdx.x / kWarp, ln = threadIdx.x % kWarp;
  const int w0 = q0 + warp * kRowsPerWarp;
  const int row[2] = {w0 + ln / 4, w0 + ln / 4 + 8};
  float lse_row[2], D_row[2];
  load_row_stats(lse_row, D_row, lse, D, head_row, row, T);
  const int n_tiles = ((causal ? min(q0 + Br, T) : T) + Bc - 1) / Bc;

  load_tile<Br, HS>(Qs, q, q0, T);
  load_tile<Br, HS>(dOs, dout, q0, T);
  load_tile<Bc, HS>(Ks, k, 0, T);
  load_tile<Bc, HS>(Vs, v, 0, T);
  cp_async_commit();

  uint32_t qf[KC][4], dof[KC][4];  // the warp's Q and dO rows, loaded once
  float dq_acc[NO][4];
  zero(dq_acc);
  for (int t = 0; t < n_tiles; ++t) {
    if (t + 1 < n_tiles) {
      const int nb = (t + 1) % 2;
      load_tile<Bc, HS>(Ks + nb * Bc * L, k, (t + 1) * Bc, T);
      load_tile<Bc, HS>(Vs + nb * Bc * L, v, (t + 1) * Bc, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (t == 0) {
      load_a<KC>(qf, Qs + warp * kRowsPerWarp * L, L);
      load_a<KC>(dof, dOs + warp * kRowsPerWarp * L, L);
    }
    const bf16* Kt = Ks + (t % 2) * Bc * L;
    const bf16* Vt = Vs + (t % 2) * Bc * L;
    const int k0 = t * Bc;
    if (!causal || k0 <= w0 + kRowsPerWarp - 1) {
      float p[NS][4], ds[NS][4];
      zero(p);
      zero(ds);
      mma_tile<BIs::NK, KC, NS>(p, qf, Kt, L);
      mma_tile<BIs::NK, KC, NS>(ds, dof, Vt, L);
      const bool edge = (causal && k0 + Bc - 1 > w0) || k0 + Bc > T;
      dq_probabilities<NS>(p, ds, row, lse_row, D_row, k0, edge, causal, T, scale_log2);
      uint32_t dsf[NS / 2][4];
      acc_to_a<NS / 2>(dsf, ds);
      mma_tile<BIs::KN, NS / 2, NO>(dq_acc, dsf, Kt, L);
    }
    __syncthreads();
  }
  store_rows<NO>(dq, dq_acc, row, T, scale);
}

// dQ from the dS^T tiles the dK/dV kernel kept (the trial kernel "flash_dq_from_kept_ds", head
// size 64, kept_ds.hpp). Grid (query tiles, NH, B); warp w owns queries q0 + 16 w .. + 15 and
// loops over the key tiles its block sees, as the dQ kernel above, but a tile is one product:
//   dQ += dS K   (dS: this warp's rows of the kept dS^T, read with ldmatrix.trans; scaled)
// instead of three and the exponentials: S, P, dP and dS were made once, by the dK/dV kernel.
// What it reads instead: the tiles, 8 KiB each, with the key tiles as before.
__global__ void __launch_bounds__(kBlock)
    flash_tc_dq_from_kept_ds_kernel(bf16* dq_base, const bf16* ds_base, const bf16* k_base,
                                    Heads qh, Heads kh, int T, float scale, bool causal) {
  constexpr int HS = 64, B = kept_ds::kTile, L = HS + 8, LS = B + 8;
  constexpr int NO = HS / 8;  // n-tiles of dQ
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* dSs = reinterpret_cast<bf16*>(smem_raw);  // 2 x B x LS: dS^T tiles, keys along rows
  bf16* Ks = dSs + 2 * B * LS;                    // 2 x B x L

  const Rows k = kh.at(k_base);
  const OutRows dq = qh.at(dq_base);
  const int64_t bh = (int64_t)blockIdx.z * gridDim.y + blockIdx.y;
  const int n = gridDim.x, i = n - 1 - blockIdx.x, q0 = i * B;  // the longest rows first
  const int warp = threadIdx.x / kWarp, ln = threadIdx.x % kWarp;
  const int w0 = q0 + warp * kRowsPerWarp;
  const int row[2] = {w0 + ln / 4, w0 + ln / 4 + 8};
  const int n_tiles = causal ? i + 1 : n;
  // query tile i's kept tiles, key tiles j = 0, 1, ... one after another (kept_ds::tile_index)
  const bf16* ds_row = kept_ds_tile(ds_base, bh, i, 0, n, causal);
  const auto ds_tile = [&](int j) { return Rows{ds_row + (int64_t)j * kept_ds::kTileElems, B}; };

  load_tile<B, B>(dSs, ds_tile(0), 0, B);
  load_tile<B, HS>(Ks, k, 0, T);
  cp_async_commit();

  float dq_acc[NO][4];
  zero(dq_acc);
  for (int t = 0; t < n_tiles; ++t) {
    if (t + 1 < n_tiles) {
      const int nb = (t + 1) % 2;
      load_tile<B, B>(dSs + nb * B * LS, ds_tile(t + 1), 0, B);
      load_tile<B, HS>(Ks + nb * B * L, k, (t + 1) * B, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    uint32_t af[B / 16][4];  // dS, this warp's 16 queries x B keys, from the stored dS^T
#pragma unroll
    for (int kc = 0; kc < B / 16; ++kc)
      ldsm_x4_trans(af[kc], dSs + (t % 2) * B * LS + mma::ldsm_at_offset(ln, warp, kc, LS));
    mma_tile<BIs::KN, B / 16, NO>(dq_acc, af, Ks + (t % 2) * B * L, L);
    __syncthreads();
  }
  store_rows<NO>(dq, dq_acc, row, T, scale);
}

// ---- host side ---------------------------------------------------------------------------------

// Version 2 applies to bf16 with head size 64 or 128 whose every row starts 16 bytes aligned
// (cp.async copies 16 bytes) and whose grid fits.
bool applies(const AttentionLayout& l, std::initializer_list<const Tensor*> all) {
  if (l.hs != 64 && l.hs != 128) return false;
  if (l.B > 65535 || l.NH > 65535 || l.T > (1 << 30)) return false;
  for (const Tensor* t : all) {
    if (t->dtype() != DType::bf16) return false;
    if (!aligned16(t->data_ptr())) return false;
  }
  for (int64_t e : {l.in_batch, l.in_head, l.in_ld, l.q_off, l.k_off, l.v_off, l.out_batch,
                    l.out_head, l.out_ld})
    if (e % 8 != 0) return false;  // 8 bf16 = 16 bytes
  return true;
}

// Calls f(HS constant) for head size 64 or 128.
template <class F>
void with_hs(int64_t hs, F f) {
  if (hs == 64) f(std::integral_constant<int, 64>{});
  else f(std::integral_constant<int, 128>{});
}

const bf16* cdata(const Tensor& t) { return static_cast<const bf16*>(t.data_ptr()); }
bf16* mdata(Tensor& t) { return static_cast<bf16*>(t.data_ptr()); }

FlashV2Kernels g_last_kernels;  // last_flash_v2_kernels
}  // namespace

FlashV2Kernels last_flash_v2_kernels() { return g_last_kernels; }

Tensor flash_kept_ds_scratch(const AttentionLayout& l, bool causal, Device device) {
  const int64_t n = (l.T + kept_ds::kTile - 1) / kept_ds::kTile;
  // no fill: the dK/dV kernel writes every element of every tile before the dQ kernel reads it
  return Tensor::empty({l.B * l.NH * kept_ds::tiles_per_head(n, causal) * kept_ds::kTileElems},
                       DType::bf16, device);
}

void flash_tc_dq_from_kept_ds(Tensor& dq, const Tensor& ds, const Tensor& k,
                              const AttentionLayout& l, float scale, bool causal) {
  constexpr int B = kept_ds::kTile;
  const size_t smem = 2 * B * (B + 8) * sizeof(bf16) + 2 * B * (64 + 8) * sizeof(bf16);
  launch(flash_tc_dq_from_kept_ds_kernel, grid_for(l, B), smem, mdata(dq), cdata(ds), cdata(k),
         in_heads(l, l.q_off), in_heads(l, l.k_off), static_cast<int>(l.T), scale, causal);
}

bool flash_attention_v2_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                                const Tensor& v, const AttentionLayout& l, double scale,
                                bool causal) {
  if (!applies(l, {&out, &q, &k, &v})) return false;
  use_device(out);
  const auto run = [&](auto kernel, int rows) {  // `rows` query rows a block
    const size_t smem = (rows + 4 * 64) * (l.hs + 8) * sizeof(bf16);  // Q, 2 K, 2 V
    launch(kernel, grid_for(l, rows), smem, mdata(out), lse.data<float>(), cdata(q), cdata(k),
           cdata(v), in_heads(l, l.q_off), in_heads(l, l.k_off), in_heads(l, l.v_off),
           out_heads(l), static_cast<int>(l.T), static_cast<float>(scale) * kLog2e, causal);
  };
  // on trial: Hopper's warpgroup MMA (flash_attention_wgmma_cuda.cu), head size 64 on sm_90
  g_last_kernels.forward_wgmma = trial_kernel("flash_forward_wgmma") && flash_wgmma_runs_here(l);
  if (g_last_kernels.forward_wgmma) {
    flash_wgmma_forward(out, lse, q, k, v, l, static_cast<float>(scale), causal);
    g_last_kernels.forward_rows_per_warp = 16;
    return true;
  }
  // two row tiles a warp (above: checked on an H200, as fast causal and 7% faster unmasked);
  // head size 128 would need twice O's 64 registers
  const bool two_row_tiles = l.hs == 64 && trial_kernel("flash_forward_two_row_tiles");
  if (two_row_tiles)
    run(flash_tc_forward_kernel<64, 2>, 2 * kTileRows);
  else if (l.hs == 64)
    run(flash_tc_forward_kernel<64, 1>, kTileRows);
  else
    run(flash_tc_forward_kernel<128, 1>, kTileRows);
  g_last_kernels.forward_rows_per_warp = two_row_tiles ? 32 : 16;
  return true;
}

bool flash_attention_v2_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                                 const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse, const AttentionLayout& l,
                                 double scale, bool causal) {
  if (!applies(l, {&dq, &dk, &dv, &dout, &q, &k, &v, &out})) return false;
  use_device(dq);
  const int64_t rows = l.B * l.NH * l.T;
  Tensor D = Tensor::empty({rows}, DType::f32, q.device());  // dO_i . O_i per row, as lse
  const float s = static_cast<float>(scale), s2 = s * kLog2e;
  const int T = static_cast<int>(l.T);
  with_hs(l.hs, [&](auto hs_c) {
    constexpr int HS = decltype(hs_c)::value;
    flash_tc_backward_d_kernel<HS><<<blocks_for_rows(rows), kThreads>>>(
        D.data<float>(), cdata(dout), cdata(out), out_heads(l), static_cast<int>(l.NH), T, rows);
    CUDA_CHECK_LAUNCH();
    // on trial: the dK/dV kernel keeps dS^T and the dQ kernel reads it back (kept_ds.hpp),
    // whichever two kernels run (version 2's below or wgmma's), head size 64
    const bool keep_ds = HS == 64 && trial_kernel("flash_dq_from_kept_ds");
    // on trial: the two kernels below on Hopper's warpgroup MMA (flash_attention_wgmma_cuda.cu)
    g_last_kernels.backward_wgmma =
        trial_kernel("flash_backward_wgmma") && flash_wgmma_runs_here(l);
    if (g_last_kernels.backward_wgmma) {
      flash_wgmma_backward(dq, dk, dv, dout, q, k, v, lse, D, l, s, causal, keep_ds);
      g_last_kernels.backward_kernels = 2;
      g_last_kernels.dkdv_min_blocks = 1;
      g_last_kernels.dq_from_kept_ds = keep_ds;
      return;
    }
    // on trial: dK, dV and dQ in one kernel (flash_attention_tc_backward_cuda.cu; slower on an
    // H200 than the two below)
    if (trial_kernel("flash_backward_one_kernel")) {
      flash_tc_backward_one_kernel(dq, dk, dv, dout, q, k, v, lse, D, l, s, causal);
      g_last_kernels.backward_kernels = 1;
      g_last_kernels.dq_from_kept_ds = false;
      return;
    }
    g_last_kernels.backward_kernels = 2;
    g_last_kernels.dq_from_kept_ds = keep_ds;
    constexpr int L = HS + 8, Bq = HS == 64 ? 64 : 32;
    const size_t smem_kv = (2 * kTileRows + 4 * Bq) * L * sizeof(bf16) + 4 * Bq * sizeof(float);
    // on trial: the dK/dV kernel held to 168 registers, for 3 blocks an SM (above)
    const bool three_blocks = HS == 64 && trial_kernel("flash_dkdv_three_blocks");
    g_last_kernels.dkdv_min_blocks = three_blocks ? 3 : 1;
    Tensor ds;  // the kept dS^T tiles (keep_ds only)
    // held to 3 blocks for head size 64 only: no other is compiled (at 128 it would spill)
    constexpr int kThree = HS == 64 ? 3 : 0;
    auto dkdv = [&](auto keep) {  // keep: std::bool_constant, the kernel's kKeepDs
      constexpr bool kKeep = decltype(keep)::value;
      auto kernel = three_blocks ? flash_tc_dkdv_kernel<HS, kThree, kKeep>
                                 : flash_tc_dkdv_kernel<HS, 0, kKeep>;
      if (three_blocks)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
      launch(kernel, grid_for(l, kTileRows), smem_kv, mdata(dk), mdata(dv), cdata(q), cdata(k),
             cdata(v), cdata(dout), lse.data<float>(), D.data<float>(), in_heads(l, l.q_off),
             in_heads(l, l.k_off), in_heads(l, l.v_off), out_heads(l), T, s, s2, causal,
             kKeep ? mdata(ds) : nullptr);
    };
    if constexpr (HS == 64) {
      if (keep_ds) {
        ds = flash_kept_ds_scratch(l, causal, q.device());
        dkdv(std::true_type{});
        flash_tc_dq_from_kept_ds(dq, ds, k, l, s, causal);
        return;
      }
    }
    dkdv(std::false_type{});
    const size_t smem_q = (2 * kTileRows + 4 * Bq) * L * sizeof(bf16);  // Bc = Bq
    launch(flash_tc_dq_kernel<HS>, grid_for(l, kTileRows), smem_q, mdata(dq), cdata(q), cdata(k),
           cdata(v), cdata(dout), lse.data<float>(), D.data<float>(), in_heads(l, l.q_off),
           in_heads(l, l.k_off), in_heads(l, l.v_off), out_heads(l), T, s, s2, causal);
  });
  return true;
}

}  // namespace scalelab::ops::cuda
