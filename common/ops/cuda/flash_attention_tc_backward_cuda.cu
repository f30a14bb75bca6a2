// Flash attention's backward in one kernel: version 2's backward (flash_attention_tc_cuda.cu,
// read it first) without its second pass over the scores. Trial kernel "flash_backward_one_kernel"
// (common/ops/trial_kernels.hpp): written without a GPU; off until `ctest -L gpu` has checked it
// and scalelab_bench_attention has timed it beside the two-kernel backward.
//
// Why. Version 2 computes dK, dV in one kernel (a block owns 64 keys and walks the query tiles)
// and dQ in another (a block owns 64 queries and walks the key tiles). Both need P and dS, so
// both compute S = Q K^T and dP = dO V^T: 7 tile products per (query tile, key tile) where 5
// would do. FlashAttention-2 computes dQ in the dK/dV pass too, adding each key block's share
// dS K into an fp32 dQ with atomicAdd; those adds land in whatever order the blocks reach them,
// so dQ's last bits change from run to run.
//
// Here the adds take turns, in a fixed order, so the bits do not change:
//  - each block, per query tile, computes its share dS K (dS through shared memory: the four
//    warps each hold 16 keys' rows of dS^T, and the product sums over all 64 keys of the block);
//  - the shares of query tile i are added into an fp32 buffer by the key blocks that see it,
//    from the last such block down to block 0, each waiting for its turn on a counter per
//    (head, query tile); block 0 adds the last share and writes dQ in bf16, scaled;
//  - the grid runs the key blocks of a head from the last to the first (blockIdx.x 0 is the last
//    key block), so a block only ever waits for blocks launched before it. Blocks start in
//    launch order on NVIDIA GPUs (observed, not documented; FlashAttention-3's deterministic
//    backward takes turns on a counter too), so the oldest unfinished block never waits for a
//    block that has not started: no deadlock (flash_turns.hpp holds the order; its host test
//    replays whole grids with few blocks resident at once). And causal, a key block's first
//    query tile is the diagonal one, where it is the first to add; at every later tile, the
//    block whose turn comes just before its own reaches that tile one step sooner (it started
//    one tile further on, and no later), so it seldom waits.
// What it costs: an fp32 dQ buffer (B NH T hs x 4 bytes), one int per (head, query tile), four
// barriers a tile where version 2 has two, and each share read and written once in L2. Unmasked
// (lab 11's off-diagonal blocks) it costs waiting too: every key block starts at query tile 0,
// where the turns come one after another, so key block j adds its first share n_key_blocks - 1 - j
// turns late and then runs on in step. Starting each block at another tile would not help: with
// the turns in launch order, some block would reach a tile before the one whose turn precedes
// it. scalelab_bench_attention --mask none times it beside version 2.
#include <cstdio>

#include "common/ops/cuda/flash_tc.cuh"
#include "common/ops/cuda/flash_turns.hpp"
#include "common/tensor.hpp"

namespace scalelab::ops::cuda {

namespace {
using namespace flash_tc;

// ---- turns: one counter per (head, query tile) -------------------------------------------------
// The acquire makes every add of the blocks before this one visible to the whole block (with the
// barrier after it); the release publishes this block's adds before the next block's turn.
__device__ inline int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ inline void add_release(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Nanoseconds of the GPU's global timer (wall time, whatever the clocks do).
__device__ inline uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins until *turn == mine. A turn that never comes (a bug, or a GPU that started a block
// before one launched ahead of it) stops the kernel after 20 s with a line saying so, instead of
// hanging the program: the launch then fails with an error. (A turn normally comes within
// microseconds: the blocks ahead are a tile or so ahead.)
__device__ inline void wait_for_turn(const int* turn, int mine, int tile) {
  const uint64_t start = global_ns();
  while (load_acquire(turn) != mine) {
    if (global_ns() - start > 20'000'000'000ull) {
      printf("flash_tc_backward_kernel: block (%d, %d, %d) waited 20 s for its turn %d on query "
             "tile %d, which stays at %d\n",
             blockIdx.x, blockIdx.y, blockIdx.z, mine, tile, load_acquire(turn));
      __trap();
    }
    __nanosleep(32);
  }
}

// Grid (key blocks, NH, B), 4 warps; the block owns keys k0 .. k0 + 63 with
// k0 = 64 (gridDim.x - 1 - blockIdx.x), warp w keys k0 + 16 w .. + 15. Per query tile (Bq rows),
// as version 2's dK/dV kernel:
//   S^T = K Q^T, P^T = exp(S^T scale - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D),
//   dV += P^T dO,  dK += dS^T Q,
// and then dQ_i += dS K, that tile's share, added in its turn (see the top of the file).
// Registers: left alone ptxas gives it ~240 (two blocks, 8 warps an SM); asked for three blocks
// at head size 64 it fits in 168 with a few bytes spilled (128: ~380 bytes, so two there).
template <int HS>
__global__ void __launch_bounds__(kBlock, HS == 64 ? 3 : 2)
    flash_tc_backward_kernel(bf16* dq_base, bf16* dk_base, bf16* dv_base, float* dq_sum_base,
                             int* turns, const bf16* q_base, const bf16* k_base,
                             const bf16* v_base, const bf16* dout_base, const float* lse,
                             const float* D, Heads qh, Heads kh, Heads vh, Heads oh, int T,
                             float scale, float scale_log2, bool causal) {
  constexpr int Bk = kTileRows, Bq = HS == 64 ? 64 : 32, L = HS + 8;
  constexpr int LS = Bq + 8;   // a row of dS^T in shared memory, padded like the others
  constexpr int NQ = Bq / 8;   // n-tiles of S^T (over the queries)
  constexpr int NO = HS / 8;   // n-tiles of dK, dV
  // dQ_i = dS K (Bq x HS, summed over the block's Bk keys), split over the 4 warps: RG groups of
  // 16 query rows x CG groups of NC columns (64: 4 x 1; 128 with 32-row tiles: 2 x 2)
  constexpr int RG = Bq / kRowsPerWarp, CG = kWarps / RG, NC = HS / CG, NDQ = NC / 8;
  static_assert(RG * CG == kWarps && NC % 16 == 0, "the dQ split covers the tile");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);  // Bk x L
  bf16* Vs = Ks + Bk * L;                         // Bk x L
  bf16* Qs = Vs + Bk * L;                         // 2 x Bq x L
  bf16* dOs = Qs + 2 * Bq * L;                    // 2 x Bq x L
  bf16* dSs = dOs + 2 * Bq * L;                   // Bk x LS: dS^T, keys along rows
  float* lse_s = reinterpret_cast<float*>(dSs + Bk * LS);  // 2 x Bq, log2 units
  float* D_s = lse_s + 2 * Bq;                              // 2 x Bq

  const Rows q = qh.at(q_base), k = kh.at(k_base), v = vh.at(v_base), dout = oh.at(dout_base);
  const OutRows dq = qh.at(dq_base), dk = kh.at(dk_base), dv = vh.at(dv_base);
  const int64_t bh = (int64_t)blockIdx.z * gridDim.y + blockIdx.y;
  lse += bh * T, D += bh * T;
  float* dq_sum = dq_sum_base + bh * T * HS;  // (T, HS) fp32, this head's
  turns += bh * ((T + Bq - 1) / Bq);
  const int nk = gridDim.x, j = flash_turns::key_block(blockIdx.x, nk), k0 = j * Bk;
  const int warp = threadIdx.x / kWarp, ln = threadIdx.x % kWarp;
  const int w0 = k0 + warp * kRowsPerWarp;              // this warp's first key
  const int key[2] = {w0 + ln / 4, w0 + ln / 4 + 8};    // the two keys this lane holds
  const int rg = warp % RG, cg = warp / RG;             // this warp's part of dQ_i
  const int i_begin = flash_turns::first_query(j, Bk, causal);  // earlier queries see none
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
    __syncthreads();  // the tile has landed (and the last tile's dS^T has been read)
    {
      // every warp computes its rows, even a causal tile wholly before its keys: dQ_i's
      // product reads all 64 rows of dS^T, and the mask makes those zeros; keys past T too
      // (version 2 only skipped storing their dK, dV rows)
      float ds[NQ][4];
      dkdv_tile<HS, Bq, true>(dk_acc, dv_acc, ds, Ks + warp * kRowsPerWarp * L,
                              Vs + warp * kRowsPerWarp * L, Qs + (t % 2) * Bq * L,
                              dOs + (t % 2) * Bq * L, lse_s + (t % 2) * Bq, D_s + (t % 2) * Bq,
                              i0, w0, key, causal, T, scale_log2);
      // dS^T to shared memory, rounded to bf16 as dK's product used it: C pairs are row-major
      // neighbours, so each is one 4-byte store
#pragma unroll
      for (int n = 0; n < NQ; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<uint32_t*>(dSs + (warp * kRowsPerWarp + mma::c_row(ln, 2 * h)) * LS +
                                       8 * n + mma::c_col(ln, 0)) =
              pack_bf16(ds[n][2 * h], ds[n][2 * h + 1]);
    }
    __syncthreads();  // dS^T is whole
    // this block's share of dQ_i: rows 16 rg .. + 15 of the tile, columns NC cg .. + NC - 1
    float share[NDQ][4];
    zero(share);
    {
      uint32_t af[Bk / 16][4];  // dS (queries x keys) read from dS^T with ldmatrix.trans
#pragma unroll
      for (int kc = 0; kc < Bk / 16; ++kc)
        ldsm_x4_trans(af[kc], dSs + mma::ldsm_at_offset(ln, rg, kc, LS));
      mma_tile<BIs::KN, Bk / 16, NDQ>(share, af, Ks + cg * NC, L);
    }
    // the turn: query tile i0 / Bq is added to by key blocks first, first - 1, ..., 0, where
    // first is the last key block that any of its queries sees (flash_turns.hpp)
    const int first = flash_turns::first_adder(i0, Bk, nk, causal);
    int* turn = turns + i0 / Bq;
    if (threadIdx.x == 0) wait_for_turn(turn, flash_turns::turn(j, i0, Bk, nk, causal), i0 / Bq);
    __syncthreads();  // every thread sees the shares added before it
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = i0 + rg * kRowsPerWarp + mma::c_row(ln, 2 * h);
      if (row >= T) continue;
#pragma unroll
      for (int n = 0; n < NDQ; ++n) {
        const int col = cg * NC + 8 * n + mma::c_col(ln, 0);
        float2 sum = make_float2(share[n][2 * h], share[n][2 * h + 1]);
        float2* at = reinterpret_cast<float2*>(dq_sum + (int64_t)row * HS + col);
        if (j != first) {  // L2 loads and stores (.cg): another SM wrote these
          const float2 before = __ldcg(at);
          sum = make_float2(before.x + sum.x, before.y + sum.y);
        }
        if (j == 0)  // the last share: dQ itself
          *reinterpret_cast<uint32_t*>(dq.p + (int64_t)row * dq.ld + col) =
              pack_bf16(sum.x * scale, sum.y * scale);
        else
          __stcg(at, sum);
      }
    }
    __syncthreads();  // every thread's adds are done ...
    if (threadIdx.x == 0) {
      __threadfence();
      add_release(turn, 1);  // ... and visible before the next block's turn
    }
  }
  store_dkdv<HS>(dk, dv, dk_acc, dv_acc, key, T, scale);
}

template <int HS>
void launch_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Tensor& lse, const Tensor& D,
                     const AttentionLayout& l, float scale, bool causal) {
  constexpr int L = HS + 8, Bq = HS == 64 ? 64 : 32;
  const int64_t n_q_tiles = (l.T + Bq - 1) / Bq;
  // every element of it is written (by the first share) before it is read: no zero fill
  Tensor dq_sum = Tensor::empty({l.B * l.NH * l.T * HS}, DType::f32, q.device());
  Tensor turns = Tensor::zeros({l.B * l.NH * n_q_tiles}, DType::i32, q.device());
  const size_t smem = (2 * kTileRows + 4 * Bq) * L * sizeof(bf16) +
                      kTileRows * (Bq + 8) * sizeof(bf16) + 4 * Bq * sizeof(float);
  auto c = [](const Tensor& t) { return static_cast<const bf16*>(t.data_ptr()); };
  auto m = [](Tensor& t) { return static_cast<bf16*>(t.data_ptr()); };
  launch(flash_tc_backward_kernel<HS>, grid_for(l, kTileRows), smem, m(dq), m(dk), m(dv),
         dq_sum.data<float>(), turns.data<int32_t>(), c(q), c(k), c(v), c(dout),
         lse.data<float>(), D.data<float>(), in_heads(l, l.q_off), in_heads(l, l.k_off),
         in_heads(l, l.v_off), out_heads(l), static_cast<int>(l.T), scale, scale * kLog2e,
         causal);
}
}  // namespace

void flash_tc_backward_one_kernel(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                                  const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& lse, const Tensor& D, const AttentionLayout& l,
                                  float scale, bool causal) {
  if (l.hs == 64) launch_backward<64>(dq, dk, dv, dout, q, k, v, lse, D, l, scale, causal);
  else launch_backward<128>(dq, dk, dv, dout, q, k, v, lse, D, l, scale, causal);
}

}  // namespace scalelab::ops::cuda
