#pragma once
// The Hopper building blocks of flash attention's version 3 (flash_attention_wgmma_cuda.cu, read
// it first): the warpgroup MMA instructions and the swizzled tiles they read. Compiled for sm_90a
// only (wgmma exists in no other architecture); only that .cu file includes this.
//
// wgmma.mma_async multiplies with the four warps of a warpgroup together: D (64 x N, fp32, in
// registers) += A (64 x 16, bf16) B (16 x N, bf16), A from shared memory (a descriptor) or from
// registers, B always from shared memory. A warp's share of D and of a register A is exactly
// mma.sync.m16n8k16's C and A fragment layout (mma_fragments.hpp) for its 16 rows: warp w holds
// rows 16 w .. 16 w + 15, and register 4 n + r of D is register r of n-tile n. So version 2's
// softmax, masks and acc_to_a (flash_tc.cuh) work on version 3's accumulators unchanged.
//
// "async": the instruction returns before the product is done. The rules this file keeps:
//  - wgmma.fence before a batch: the accumulator and A registers written by ordinary
//    instructions (a rescale, P rounded to bf16) are complete before the tensor cores read them;
//  - commit_group closes a batch, wait_group<0> waits for it; until then the accumulators are not
//    read and the A registers not rewritten (every batch here is waited for at once: no overlap
//    inside a block; the other blocks on the SM fill the gaps);
//  - after the wait, each accumulator register passes through an empty asm that "writes" it, so
//    the compiler cannot move a read of it above the wait (it does not know the MMA is async);
//    before a fence, the registers just written (a rescaled O, P as A fragments) pass through
//    one too, so their writes cannot sink below the fence;
//  - shared memory written by cp.async (the generic proxy) is fenced (fence.proxy.async) before
//    the barrier that precedes the MMAs reading it (the async proxy).
#include <cuda_bf16.h>

#include <cstdint>

#include "common/ops/cuda/flash_tc.cuh"
#include "common/ops/cuda/wgmma_layout.hpp"

namespace scalelab::ops::cuda::flash_wgmma {

using flash_tc::smem_u32;

constexpr int kN = 64;  // every product here is m64n64k16: tiles of 64 rows, head size 64

/// D of m64n64k16 as this thread holds it: register 4 n + r = d[n][r] (n-tile n, register r).
using Acc = float[kN / 8][4];

__device__ inline void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ inline void wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Shared memory this thread wrote with cp.async (or plain stores) is visible to the async proxy.
__device__ inline void fence_smem_for_mma() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Waits for this thread's copies (all but the newest `pending` groups), makes them visible to
// the tensor cores, then to the whole block.
template <int pending>
__device__ inline void tiles_landed() {
  flash_tc::cp_async_wait<pending>();
  fence_smem_for_mma();
  __syncthreads();
}

// Pins each register of d after wait_all (see above).
__device__ inline void pin(Acc& d) {
#pragma unroll
  for (int n = 0; n < kN / 8; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+f"(d[n][r])::"memory");
}

// The same for A fragments, before fence(): the instructions that wrote them (acc_to_a) stay
// above the fence, where the compiler could otherwise sink them (they touch no memory).
__device__ inline void pin(uint32_t (&a)[kN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[kk][r])::"memory");
}

#define SCALELAB_WGMMA_D32                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "   \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define SCALELAB_WGMMA_D32_OPERANDS(d)                                                            \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),      \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),  \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),  \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),  \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),  \
      "+f"(d[7][2]), "+f"(d[7][3])

/// d (+)= A B, A and B from shared memory (descriptors a, b; both K-major). accumulate = false
/// overwrites d (the first k-step of a product: no zeroing pass).
__device__ inline void mma_ss(Acc& d, uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SCALELAB_WGMMA_D32
      ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : SCALELAB_WGMMA_D32_OPERANDS(d)
      : "l"(a), "l"(b), "r"(int(accumulate)));
}

/// d += A B, A from registers (this warp's 16 rows x 16, mma.sync's A fragment), B from shared
/// memory MN-major (descriptor b; the instruction's "transpose B" flag set).
__device__ inline void mma_rs(Acc& d, const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SCALELAB_WGMMA_D32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : SCALELAB_WGMMA_D32_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
#undef SCALELAB_WGMMA_D32
#undef SCALELAB_WGMMA_D32_OPERANDS

/// Issues d = A B^T (64 x 64) for A and B K-major tiles at shared addresses a and b: the four
/// k-steps of the head dimension, d overwritten.
__device__ inline void issue_ss(Acc& d, uint32_t a, uint32_t b) {
  const uint64_t da = wgmma::descriptor(a), db = wgmma::descriptor(b);
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk)
    mma_ss(d, da + wgmma::k_major_step(kk), db + wgmma::k_major_step(kk), kk > 0);
}

/// Issues d += P B for P (64 x 64) in registers as four k-steps of A fragments (acc_to_a of a
/// 64 x 64 accumulator) and B (64 x 64) an MN-major tile at shared address b.
__device__ inline void issue_rs(Acc& d, const uint32_t (&p)[kN / 16][4], uint32_t b) {
  const uint64_t db = wgmma::descriptor(b);
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) mma_rs(d, p[kk], db + wgmma::mn_major_step(kk));
}

/// Closes the batch issued since fence(), waits for it, and pins the accumulators it wrote.
__device__ inline void finish(Acc& d) {
  commit();
  wait_all();
  pin(d);
}
__device__ inline void finish(Acc& d, Acc& e) {
  commit();
  wait_all();
  pin(d);
  pin(e);
}

// Copies rows [r0, r0 + 64) of m (64 bf16 a row) into a swizzled tile (wgmma_layout.hpp) with
// cp.async, 16 bytes a copy; rows past T come in as zeros. tile: 1024-byte aligned.
__device__ inline void load_tile(unsigned char* tile, flash_tc::Rows m, int r0, int T) {
  constexpr int kChunks = kN / 8;
  for (int e = threadIdx.x; e < kN * kChunks; e += flash_tc::kBlock) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    const bool valid = r0 + r < T;
    flash_tc::cp_async16(tile + wgmma::swizzled_offset(r, c),
                         m.p + (valid ? (r0 + r) * m.ld + c : 0), valid);
  }
}

// The first 1024-byte aligned address in dynamic shared memory (launches ask for 1 KiB more).
__device__ inline unsigned char* aligned_smem(unsigned char* raw) {
  const uint32_t a = smem_u32(raw);
  return raw + ((wgmma::kAtomBytes - a % wgmma::kAtomBytes) % wgmma::kAtomBytes);
}

}  // namespace scalelab::ops::cuda::flash_wgmma
