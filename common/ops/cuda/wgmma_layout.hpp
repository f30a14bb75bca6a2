#pragma once
// Where flash attention's version 3 (flash_attention_wgmma_cuda.cu) puts a tile in shared memory,
// and how it tells the tensor cores so: plain functions, so that a host test
// (tests/common/test_wgmma_layout.cpp) can replay them against the PTX manual's canonical
// layouts without a GPU. No CUDA headers: the kernels and the test include the same lines.
//
// Hopper's warpgroup MMA (wgmma.mma_async, four warps together, M = 64 rows) reads its B operand,
// and optionally A, straight from shared memory: no ldmatrix, no fragments in registers. It finds
// the elements through a 64-bit *matrix descriptor* (start address, two strides, a swizzle mode)
// and one of a few fixed "canonical" layouts. Version 3 keeps every tile as rows of 64 bf16
// (head size 64: one row is 128 bytes) with the 128-byte swizzle:
//
//   the 16-byte chunk c (0..7) of row r is stored at chunk c ^ (r % 8) of that row.
//
// Eight rows (1024 bytes) make a swizzle atom; tiles start 1024-byte aligned. The XOR spreads the
// eight rows' chunk c over all eight bank groups, so a column slice reads without bank conflicts
// (what version 2's 8-element row padding did for ldmatrix). The hardware applies the same XOR to
// the address bits it computes (bits 4-6 ^= bits 7-9), so one tile serves both ways wgmma reads:
//  - K-major ("rows are M or N, the reduction dimension K runs along a row"): Q and K in
//    S = Q K^T, K and V in S^T = K Q^T, dO in dP = dO V^T. Row r of an 8-row group is 128 bytes
//    after row r - 1; groups are `SBO` = 1024 bytes apart. A k-step of 16 elements (32 bytes)
//    starts 32 bytes further into the row: descriptor start + 32 kk.
//  - MN-major ("K runs down the rows, M or N along them"): V in O = P V (K = keys), dO and Q in
//    dV += P^T dO and dK += dS^T Q (K = queries), K in dQ += dS K. The 64 elements of N are one
//    128-byte row; K's rows are 128 bytes apart in groups of 8, groups `SBO` = 1024 apart. A k-step
//    of 16 rows starts 2048 bytes on.
#include <cstdint>

#include "common/bf16.hpp"  // SCALELAB_HD

namespace scalelab::ops::wgmma {

constexpr int kRowBytes = 128;    // 64 bf16: one head-size-64 row, one swizzle row
constexpr int kAtomBytes = 1024;  // 8 rows: the swizzle's period, and each tile's alignment
constexpr int kGroupBytes = 1024; // SBO: from one 8-row group to the next (both majors)

/// Byte offset, in a tile of 64-element bf16 rows with the 128-byte swizzle, of element `col`
/// (0..63) of row `row`.
SCALELAB_HD constexpr int swizzled_offset(int row, int col) {
  return row * kRowBytes + (((col / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
}

/// The matrix descriptor of a tile at shared address `addr` (1024-byte aligned, or advanced by
/// whole k-steps from such an address): bits 0-13 the address / 16, 16-29 the leading byte
/// offset / 16 (K-major with the swizzle: unused, 1 as CUTLASS sets it; MN-major: the step to
/// the next 64-element N atom, unused here because N = 64 is one atom), 32-45 the stride byte
/// offset / 16 (1024: the next 8-row group, of M/N rows K-major, of K rows MN-major), 49-51
/// the base offset (0: atom-aligned), 62-63 the swizzle mode (1 = 128 bytes).
SCALELAB_HD constexpr uint64_t descriptor(uint32_t addr) {
  return (uint64_t{(addr & 0x3FFFF) >> 4}) | (uint64_t{1} << 16) |
         (uint64_t{kGroupBytes >> 4} << 32) | (uint64_t{1} << 62);
}

/// How far a descriptor moves for the k-step kk of a K-major operand (16 elements along a row)
/// and of an MN-major one (16 rows), in the descriptor's units of 16 bytes.
SCALELAB_HD constexpr uint64_t k_major_step(int kk) { return uint64_t(32 * kk) >> 4; }
SCALELAB_HD constexpr uint64_t mn_major_step(int kk) {
  return uint64_t(16 * kk * kRowBytes) >> 4;
}

}  // namespace scalelab::ops::wgmma
