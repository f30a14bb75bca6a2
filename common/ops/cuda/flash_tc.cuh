#pragma once
// The tensor-core building blocks of flash attention's version 2 (flash_attention_tc_cuda.cu,
// read it first: it says why each piece is there) and of its one-kernel backward
// (flash_attention_tc_backward_cuda.cu): the PTX instructions, warp-wide tile products, and
// where a head's rows lie. Only .cu files include this.
#include <cuda_bf16.h>

#include "common/ops/cuda/kept_ds.hpp"
#include "common/ops/cuda/kernels.cuh"
#include "common/ops/cuda/mma_fragments.hpp"
#include "common/ops/fused_backend.hpp"

namespace scalelab::ops::cuda::flash_tc {

constexpr int kWarps = 4;                // warps per block
constexpr int kBlock = kWarps * kWarp;   // 128 threads
constexpr int kRowsPerWarp = 16;         // the M of m16n8k16
constexpr int kTileRows = kWarps * kRowsPerWarp;  // 64 rows a block owns
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- PTX: the four instructions this file is about -------------------------------------------
__device__ inline uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers; with valid = false the 16 bytes
// are zero-filled (src-size 0): rows past the end of the sequence load as zeros.
__device__ inline void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ inline void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ inline void ldsm_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c (16x8 fp32) += a (16x16 bf16) b (16x8 bf16), the whole warp together.
__device__ inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two bf16 (round to nearest even); lo in the low half.
__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- warp-level tile products ------------------------------------------------------------------
// A fragments of a 16 x (16 KC) tile in shared memory (row-major, ld elements per row).
template <int KC>
__device__ inline void load_a(uint32_t (&a)[KC][4], const bf16* tile, int ld) {
  const int ln = threadIdx.x % kWarp;
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) ldsm_x4(a[kc], tile + mma::ldsm_a_offset(ln, kc, ld));
}

// How B lies in shared memory: as B^T, [n][k] row-major (K in S = Q K^T: n = key, k = head
// dimension), or as B, [k][n] row-major (V in O = P V: k = key, n = head dimension), which
// ldmatrix.trans turns into B fragments on the way.
enum class BIs { NK, KN };

// acc[mt] (16 x 8N) += A[mt] (16 x 16KC, fragments) * B for MT row tiles mt at once (a warp
// owning 16 MT rows), B (16KC x 8N) in shared memory laid out as `lay` says, with ld elements
// per row: each pair of B fragments loaded from shared memory feeds the MT products that need it.
template <BIs lay, int KC, int N, int MT>
__device__ inline void mma_tiles(float (&acc)[MT][N][4], const uint32_t (&a)[MT][KC][4],
                                 const bf16* b, int ld) {
  static_assert(N % 2 == 0, "n-tiles come in pairs (one ldmatrix.x4)");
  const int ln = threadIdx.x % kWarp;
#pragma unroll
  for (int kc = 0; kc < KC; ++kc)
#pragma unroll
    for (int np = 0; np < N / 2; ++np) {
      uint32_t r[4];
      if constexpr (lay == BIs::NK) ldsm_x4(r, b + mma::ldsm_bt_offset(ln, np, kc, ld));
      else ldsm_x4_trans(r, b + mma::ldsm_b_offset(ln, np, kc, ld));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_bf16(acc[mt][2 * np], a[mt][kc], r[0], r[1]);
        mma_bf16(acc[mt][2 * np + 1], a[mt][kc], r[2], r[3]);
      }
    }
}

// One row tile: acc (16 x 8N) += A (16 x 16KC) * B.
template <BIs lay, int KC, int N>
__device__ inline void mma_tile(float (&acc)[N][4], const uint32_t (&a)[KC][4], const bf16* b,
                                int ld) {
  mma_tiles<lay, KC, N, 1>(reinterpret_cast<float(&)[1][N][4]>(acc),
                           reinterpret_cast<const uint32_t(&)[1][KC][4]>(a), b, ld);
}

// An accumulator (16 x 16KC fp32) as the A operand of the next product, rounded to bf16.
template <int KC>
__device__ inline void acc_to_a(uint32_t (&a)[KC][4], const float (&acc)[2 * KC][4]) {
#pragma unroll
  for (int kc = 0; kc < KC; ++kc)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float(&c)[4] = acc[mma::a_from_c_tile(kc, r)];
      a[kc][r] = pack_bf16(c[mma::a_from_c_reg(r, 0)], c[mma::a_from_c_reg(r, 1)]);
    }
}

template <int N>
__device__ inline void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[n][r] = 0.f;
}

// ---- where a head's rows are ------------------------------------------------------------------
// One (T, hs) matrix of one head: row t at p + t * ld.
struct Rows {
  const bf16* p;
  int64_t ld;
};
struct OutRows {
  bf16* p;
  int64_t ld;
};
// The head (b, h) = (blockIdx.z, blockIdx.y) of a tensor laid out as AttentionLayout says.
struct Heads {
  int64_t off, batch, head, ld;
  __device__ Rows at(const bf16* base) const {
    return {base + off + blockIdx.z * batch + blockIdx.y * head, ld};
  }
  __device__ OutRows at(bf16* base) const {
    return {base + off + blockIdx.z * batch + blockIdx.y * head, ld};
  }
};

// Copies rows [r0, r0 + ROWS) of m into tile (ROWS x HS, ld HS + 8) with cp.async, 16 bytes
// per copy, consecutive threads on consecutive bytes; rows past T come in as zeros.
template <int ROWS, int HS>
__device__ inline void load_tile(bf16* tile, Rows m, int r0, int T) {
  constexpr int kChunks = HS / 8;  // 16-byte pieces per row
  for (int e = threadIdx.x; e < ROWS * kChunks; e += kBlock) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    const bool valid = r0 + r < T;
    cp_async16(tile + r * (HS + 8) + c, m.p + (valid ? (r0 + r) * m.ld + c : 0), valid);
  }
}

// ---- the forward's online softmax, on accumulator fragments (versions 2 and 3) ----------------
// S of MT row tiles (this lane's rows row[mt][0], row[mt][1]) and NS n-tiles of keys from k0,
// scaled into log2 units (scores * scale * log2 e); -inf where masked. Only tiles crossing the
// diagonal or the end of the sequence (`edge`) pay for the mask.
template <int MT, int NS>
__device__ inline void scale_and_mask(float (&s)[MT][NS][4], const int (&row)[MT][2], int k0,
                                      bool edge, bool causal, int T, float scale_log2) {
  const int ln = threadIdx.x % kWarp;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = k0 + 8 * n + mma::c_col(ln, r), qi = row[mt][r / 2];
        const bool masked = edge && (key >= T || (causal && key > qi));
        s[mt][n][r] = masked ? -INFINITY : s[mt][n][r] * scale_log2;
      }
}

// The online softmax, per row: the new max over the quad, O and this lane's share of the sum l
// rescaled, S turned into P = exp2(S - max) in place (m: running max in log2 units).
template <int MT, int NS, int NO>
__device__ inline void online_softmax(float (&s)[MT][NS][4], float (&o)[MT][NO][4],
                                      float (&m)[MT][2], float (&l)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // h = 0: row[mt][0] (registers 0, 1); h = 1: row[mt][1]
      float mx = m[mt][h];
#pragma unroll
      for (int n = 0; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * h], s[mt][n][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // a row that has seen no key yet (m = -inf) and none in this tile would give
      // exp2(-inf - -inf) = NaN: the guard keeps it out (every row sees key 0 in tile 0,
      // never skipped, so the rows of a real sequence have a finite max from then on)
      const float base = mx == -INFINITY ? 0.f : mx;
      const float corr = exp2f(m[mt][h] - base);  // 0 on the first tile (m = -inf)
      m[mt][h] = mx;
      l[mt][h] *= corr;
#pragma unroll
      for (int n = 0; n < NO; ++n) o[mt][n][2 * h] *= corr, o[mt][n][2 * h + 1] *= corr;
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = exp2f(s[mt][n][2 * h + e] - base);  // masked: exp2(-inf) = 0
          s[mt][n][2 * h + e] = p;
          l[mt][h] += p;
        }
    }
}

// The quad's partial sums make the row's l; normalise once, store y and lse (rows before T).
template <int MT, int NO>
__device__ inline void store_out_lse(OutRows out, float* lse, const float (&o)[MT][NO][4],
                                     const float (&m)[MT][2], float (&l)[MT][2],
                                     const int (&row)[MT][2], int T) {
  const int ln = threadIdx.x % kWarp;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 1);
      l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 2);
      if (row[mt][h] >= T) continue;
      const float inv = 1.f / l[mt][h];
      bf16* dst = out.p + (int64_t)row[mt][h] * out.ld + mma::c_col(ln, 0);
#pragma unroll
      for (int n = 0; n < NO; ++n)
        *reinterpret_cast<uint32_t*>(dst + 8 * n) =
            pack_bf16(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
      if (ln % 4 == 0) lse[row[mt][h]] = (m[mt][h] + log2f(l[mt][h])) * kLn2;
    }
}

// ---- the dK/dV pass of the backward (version 2's dK/dV kernel and the one-kernel backward) -----
// lse (in log2 units) and D of the Bq queries from row i0; a query past T gets lse = +inf, so
// its p is 0.
template <int Bq>
__device__ inline void load_query_rows(float* lse_s, float* D_s, const float* lse, const float* D,
                                       int i0, int T) {
  for (int c = threadIdx.x; c < Bq; c += kBlock) {
    const int i = i0 + c;
    lse_s[c] = i < T ? lse[i] * kLog2e : INFINITY;
    D_s[c] = i < T ? D[i] : 0.f;
  }
}

// The elementwise part of a dK/dV tile (one query tile of Bq rows from i0, a warp's 16 keys from
// w0 as the M side; this lane's two keys `key`): S^T in p becomes P^T = exp2(S^T scale - lse),
// dP^T in ds becomes dS^T = P^T (dP^T - D). Masking as dkdv_tile says.
template <int Bq, bool kKeysPastT>
__device__ inline void dkdv_probabilities(float (&p)[Bq / 8][4], float (&ds)[Bq / 8][4],
                                          const float* lse_t, const float* D_t, int i0, int w0,
                                          const int (&key)[2], bool causal, int T,
                                          float scale_log2) {
  constexpr int NQ = Bq / 8;
  const int ln = threadIdx.x % kWarp;
  const bool before = causal && i0 < w0 + kRowsPerWarp - 1;  // some query before some key
  const bool edge = kKeysPastT ? before || w0 + kRowsPerWarp > T : before;
#pragma unroll
  for (int n = 0; n < NQ; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int c = 8 * n + mma::c_col(ln, r), kr = key[r / 2];  // the query within the tile
      const bool masked =
          edge && ((kKeysPastT && kr >= T) || ((!kKeysPastT || causal) && i0 + c < kr));
      const float pr = masked ? 0.f : exp2f(p[n][r] * scale_log2 - lse_t[c]);
      p[n][r] = pr;
      ds[n][r] = pr * (ds[n][r] - D_t[c]);
    }
}

// One query tile (Bq rows from i0: Qt, dOt, lse_t, D_t) for a warp's 16 keys (their K and V
// rows at Kw, Vw; this lane's two keys `key`), with the warp's keys as the M side:
//   S^T = K Q^T, P^T = exp(S^T scale - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D),
//   dV += P^T dO,  dK += dS^T Q   (dK scaled by `scale` when stored).
// P^T and dS^T stay in registers as A operands, like P in forward; dS^T is left in ds (fp32).
// Masked to zero: a query before its key (causal) and, with kKeysPastT, a key past T (whose K
// and V rows loaded as zeros: left alone its p would be exp(-lse), which matters where dS^T is
// read again, not where only dK and dV rows that are never stored see it). w0: the warp's first
// key (only tiles where some element may be masked pay for the test).
template <int HS, int Bq, bool kKeysPastT>
__device__ inline void dkdv_tile(float (&dk_acc)[HS / 8][4], float (&dv_acc)[HS / 8][4],
                                 float (&ds)[Bq / 8][4], const bf16* Kw, const bf16* Vw,
                                 const bf16* Qt, const bf16* dOt, const float* lse_t,
                                 const float* D_t, int i0, int w0, const int (&key)[2],
                                 bool causal, int T, float scale_log2) {
  constexpr int L = HS + 8, KC = HS / 16, NQ = Bq / 8, NO = HS / 8;
  uint32_t af[KC][4];  // the warp's K rows, then its V rows, as A fragments
  load_a<KC>(af, Kw, L);
  float p[NQ][4];  // S^T, then P^T
  zero(p);
  mma_tile<BIs::NK, KC, NQ>(p, af, Qt, L);
  load_a<KC>(af, Vw, L);
  zero(ds);  // dP^T, then dS^T
  mma_tile<BIs::NK, KC, NQ>(ds, af, dOt, L);
  dkdv_probabilities<Bq, kKeysPastT>(p, ds, lse_t, D_t, i0, w0, key, causal, T, scale_log2);
  uint32_t pf[NQ / 2][4];
  acc_to_a<NQ / 2>(pf, p);
  mma_tile<BIs::KN, NQ / 2, NO>(dv_acc, pf, dOt, L);
  acc_to_a<NQ / 2>(pf, ds);
  mma_tile<BIs::KN, NQ / 2, NO>(dk_acc, pf, Qt, L);
}

// Stores a warp's dK (times scale) and dV rows, the keys this lane holds, those before T.
template <int HS>
__device__ inline void store_dkdv(OutRows dk, OutRows dv, const float (&dk_acc)[HS / 8][4],
                                  const float (&dv_acc)[HS / 8][4], const int (&key)[2], int T,
                                  float scale) {
  const int ln = threadIdx.x % kWarp;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key[h] >= T) continue;
    const int col = mma::c_col(ln, 0);
    bf16* kd = dk.p + (int64_t)key[h] * dk.ld + col;
    bf16* vd = dv.p + (int64_t)key[h] * dv.ld + col;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      *reinterpret_cast<uint32_t*>(kd + 8 * n) =
          pack_bf16(dk_acc[n][2 * h] * scale, dk_acc[n][2 * h + 1] * scale);
      *reinterpret_cast<uint32_t*>(vd + 8 * n) = pack_bf16(dv_acc[n][2 * h], dv_acc[n][2 * h + 1]);
    }
  }
}

// ---- dS^T kept for the dQ kernel (the trial kernel "flash_dq_from_kept_ds", kept_ds.hpp) -------
// The tile (query tile i, key tile j) of head bh (blockIdx.z * gridDim.y + blockIdx.y) among the
// kept tiles at `base`, n tiles of keys a head.
__device__ inline bf16* kept_ds_tile(bf16* base, int64_t bh, int i, int j, int n, bool causal) {
  return base + (bh * kept_ds::tiles_per_head(n, causal) + kept_ds::tile_index(i, j, n, causal)) *
                    kept_ds::kTileElems;
}
__device__ inline const bf16* kept_ds_tile(const bf16* base, int64_t bh, int i, int j, int n,
                                           bool causal) {
  return kept_ds_tile(const_cast<bf16*>(base), bh, i, j, n, causal);
}

// This warp's rows of dS^T (its 16 keys x kTile queries, fp32 accumulators) into `tile`, rounded
// to bf16 as acc_to_a rounded them for dK's product: the dQ kernel multiplies the same numbers.
__device__ inline void store_kept_ds(bf16* tile, const float (&ds)[kept_ds::kTile / 8][4]) {
  const int warp = threadIdx.x / kWarp, ln = threadIdx.x % kWarp;
#pragma unroll
  for (int n = 0; n < kept_ds::kTile / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<uint32_t*>(tile + kept_ds::fragment_offset(warp, ln, n, h)) =
          pack_bf16(ds[n][2 * h], ds[n][2 * h + 1]);
}

// ---- the dQ pass of the backward (versions 2 and 3) ---------------------------------------------
// lse (in log2 units) and D of this lane's two query rows of the head at head_row; a row past
// T gets lse = +inf (its p is 0) and D = 0.
__device__ inline void load_row_stats(float (&lse_row)[2], float (&D_row)[2], const float* lse,
                                      const float* D, int64_t head_row, const int (&row)[2],
                                      int T) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lse_row[h] = row[h] < T ? lse[head_row + row[h]] * kLog2e : INFINITY;
    D_row[h] = row[h] < T ? D[head_row + row[h]] : 0.f;
  }
}

// The elementwise part of a dQ tile (a warp's 16 queries, this lane's rows row[0], row[1] with
// their lse in log2 units and D; NS n-tiles of keys from k0): S in s gives P = exp2(S scale -
// lse), dP in ds becomes dS = P (dP - D). Masked to zero: a key past T, a key after its query
// (causal); only tiles where some element may be masked (`edge`) pay for the test.
template <int NS>
__device__ inline void dq_probabilities(const float (&s)[NS][4], float (&ds)[NS][4],
                                        const int (&row)[2], const float (&lse_row)[2],
                                        const float (&D_row)[2], int k0, bool edge, bool causal,
                                        int T, float scale_log2) {
  const int ln = threadIdx.x % kWarp;
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int kj = k0 + 8 * n + mma::c_col(ln, r), h = r / 2;
      const bool masked = edge && (kj >= T || (causal && kj > row[h]));
      const float pr = masked ? 0.f : exp2f(s[n][r] * scale_log2 - lse_row[h]);
      ds[n][r] = pr * (ds[n][r] - D_row[h]);
    }
}

// Stores a warp's rows of acc (16 x 8 NO: this lane's rows row[0], row[1], those before T),
// times scale, in bf16.
template <int NO>
__device__ inline void store_rows(OutRows dst_rows, const float (&acc)[NO][4], const int (&row)[2],
                                  int T, float scale) {
  const int ln = threadIdx.x % kWarp;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row[h] >= T) continue;
    bf16* dst = dst_rows.p + (int64_t)row[h] * dst_rows.ld + mma::c_col(ln, 0);
#pragma unroll
    for (int n = 0; n < NO; ++n)
      *reinterpret_cast<uint32_t*>(dst + 8 * n) =
          pack_bf16(acc[n][2 * h] * scale, acc[n][2 * h + 1] * scale);
  }
}

// ---- host side ---------------------------------------------------------------------------------
inline Heads in_heads(const AttentionLayout& l, int64_t off) {
  return {off, l.in_batch, l.in_head, l.in_ld};
}
inline Heads out_heads(const AttentionLayout& l) {
  return {0, l.out_batch, l.out_head, l.out_ld};
}

// Grid (row tiles, NH, B): blockIdx.y is the head, blockIdx.z the batch element (Heads::at).
inline dim3 grid_for(const AttentionLayout& l, int rows_per_block) {
  return dim3(static_cast<unsigned>((l.T + rows_per_block - 1) / rows_per_block),
              static_cast<unsigned>(l.NH), static_cast<unsigned>(l.B));
}

template <class Kernel, class... Args>
inline void launch(Kernel kernel, dim3 grid, size_t smem, Args... args) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  kernel<<<grid, kBlock, smem>>>(args...);
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda::flash_tc

namespace scalelab::ops::cuda {
/// Flash attention's backward in one kernel (flash_attention_tc_backward_cuda.cu; the trial
/// kernel "flash_backward_one_kernel"): dq, dk, dv of version 2's backward from D = rowsum(dO O),
/// for a layout and tensors version 2 applies to.
void flash_tc_backward_one_kernel(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                                  const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& lse, const Tensor& D, const AttentionLayout& l,
                                  float scale, bool causal);

/// Flash attention on Hopper's warpgroup MMA (flash_attention_wgmma_cuda.cu, compiled for sm_90a
/// only; the trial kernels "flash_forward_wgmma" and "flash_backward_wgmma"): whether it can run
/// here (head size 64 on a compute capability 9.0 device), version 2's forward, and its
/// backward's dK, dV and dQ from D = rowsum(dO O). Same layouts and tensors as version 2.
bool flash_wgmma_runs_here(const AttentionLayout& l);
void flash_wgmma_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                         const Tensor& v, const AttentionLayout& l, float scale, bool causal);
/// keep_ds: its dK/dV kernel keeps dS^T and flash_tc_dq_from_kept_ds makes dQ (below).
void flash_wgmma_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                          const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                          const Tensor& D, const AttentionLayout& l, float scale, bool causal,
                          bool keep_ds);

/// The trial kernel "flash_dq_from_kept_ds" (flash_attention_tc_cuda.cu, kept_ds.hpp; head size
/// 64): the buffer a dK/dV kernel keeps dS^T in for a backward of layout l (bf16, 2 bytes a
/// score of each kept tile; not filled), and the dQ kernel that reads it back: dq = dS k, scaled.
Tensor flash_kept_ds_scratch(const AttentionLayout& l, bool causal, Device device);
void flash_tc_dq_from_kept_ds(Tensor& dq, const Tensor& ds, const Tensor& k,
                              const AttentionLayout& l, float scale, bool causal);
}  // namespace scalelab::ops::cuda
