#pragma once
// Who holds what in a warp-wide tensor-core product: the index math of flash attention's
// version 2 (flash_attention_tc_cuda.cu), in plain functions so that a host test
// (tests/common/test_mma_fragments.cpp) can replay it against the PTX manual's definitions
// without a GPU. No CUDA headers: the kernel and the test include the same lines.
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 multiplies, across the 32 lanes of a warp,
// a 16x16 bf16 tile A by a 16x8 bf16 tile B into a 16x8 fp32 tile C. No lane holds a whole row:
// each holds a few elements, its "fragment", in registers. With g = lane / 4 (the group, 0..7)
// and c = lane % 4 (the lane in its group):
//   C (16x8 fp32, 4 registers): c0, c1 = row g,     columns 2c, 2c+1
//                               c2, c3 = row g + 8, columns 2c, 2c+1
//   A (16x16 bf16, 4 registers of 2 bf16 each; the low half holds the lower column):
//                               a0 = row g, cols 2c..2c+1      a1 = row g+8, cols 2c..2c+1
//                               a2 = row g, cols 2c+8..2c+9    a3 = row g+8, cols 2c+8..2c+9
//   B (16x8 bf16, k x n, 2 registers): b0 = rows (k) 2c..2c+1, column (n) g
//                                      b1 = rows (k) 2c+8..2c+9, column (n) g
// The same quad of lanes (one g) owns a whole row of C, which is why the softmax's row max and
// row sum need only two shuffles (xor 1, xor 2).
//
// ldmatrix.sync.aligned.m8n8.x4.b16 fills those registers from shared memory: it reads four 8x8
// tiles of 16-bit values, lane 8i + j giving the address of row j of tile i, and hands lane t
// row t / 4, columns 2 (t % 4) and 2 (t % 4) + 1 of tile i in its register i: exactly a
// fragment's pair. With .trans it hands lane t rows 2 (t % 4) and 2 (t % 4) + 1 of column t / 4
// instead: the pair of a B fragment when B is stored with k along rows.
#include "common/bf16.hpp"  // SCALELAB_HD

namespace scalelab::ops::mma {

/// Row of the C (accumulator) element in register r (0..3) of `lane`.
SCALELAB_HD constexpr int c_row(int lane, int r) { return lane / 4 + (r / 2) * 8; }
/// Column of the C element in register r of `lane`.
SCALELAB_HD constexpr int c_col(int lane, int r) { return 2 * (lane % 4) + r % 2; }

// ---- ldmatrix addresses: the element of a shared-memory tile each lane points at -------------
// Tiles are row-major with `ld` elements from row to row.

/// The A fragment of the 16x16 block at column 16 kc of a [16 rows][k] tile (Q, or a warp's
/// K rows): lanes 0-15 point at rows 0-15, column 0; lanes 16-31 at rows 0-15, column 8.
/// Registers 0..3 come back as a0..a3.
SCALELAB_HD constexpr int ldsm_a_offset(int lane, int kc, int ld) {
  return (lane % 16) * ld + 16 * kc + (lane / 16) * 8;
}

/// Two B fragments (n-tiles 2 np and 2 np + 1) of the k-chunk kc, from a tile stored [n][k]:
/// B^T row-major, such as K for S = Q K^T (n = key, k = head dimension). Registers 0, 1 come
/// back as b0, b1 of n-tile 2 np; registers 2, 3 as b0, b1 of n-tile 2 np + 1.
SCALELAB_HD constexpr int ldsm_bt_offset(int lane, int np, int kc, int ld) {
  return (16 * np + lane % 8 + (lane / 16) * 8) * ld + 16 * kc + ((lane / 8) % 2) * 8;
}

/// Two B fragments (n-tiles 2 np and 2 np + 1) of the k-chunk kc, from a tile stored [k][n]:
/// B row-major, such as V for O = P V (k = key, n = head dimension); loaded with .trans.
/// Registers as ldsm_bt_offset's.
SCALELAB_HD constexpr int ldsm_b_offset(int lane, int np, int kc, int ld) {
  return (16 * kc + lane % 8 + ((lane / 8) % 2) * 8) * ld + 16 * np + (lane / 16) * 8;
}

/// The A fragment of the 16x16 block at rows 16 mt, columns 16 kc of A, from a tile that
/// stores A transposed ([k][m] row-major: the one-kernel backward keeps dS^T, keys along rows,
/// as its warps computed it, and reads dS from it for dQ = dS K); loaded with .trans. Lanes
/// 0-7 point at the block's k rows 0-7 (tile a0: m 0-7), lanes 8-15 at the same rows 8 columns
/// on (a1: m 8-15), lanes 16-31 likewise at k rows 8-15 (a2, a3). Registers as ldsm_a_offset's.
SCALELAB_HD constexpr int ldsm_at_offset(int lane, int mt, int kc, int ld) {
  return (16 * kc + lane % 8 + (lane / 16) * 8) * ld + 16 * mt + ((lane / 8) % 2) * 8;
}

// ---- accumulators as the next product's A ------------------------------------------------------
// A C tile pair (n-tiles 2 kc, 2 kc + 1: 16 rows x 16 columns) has the A layout already: the
// same lane holds the same rows and columns. So P = exp(S - m), computed in S's registers, is
// the A operand of P V after rounding pairs to bf16, with no trip through shared memory.

/// Which C n-tile feeds A register r of k-chunk kc.
SCALELAB_HD constexpr int a_from_c_tile(int kc, int r) { return 2 * kc + r / 2; }
/// Which C register of that n-tile gives element e (0: low half, 1: high half) of A register r.
SCALELAB_HD constexpr int a_from_c_reg(int r, int e) { return (r % 2) * 2 + e; }

}  // namespace scalelab::ops::mma
