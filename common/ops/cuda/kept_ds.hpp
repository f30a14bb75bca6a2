#pragma once
// Where flash attention's dK/dV kernel keeps dS^T for the dQ kernel (the trial kernel
// "flash_dq_from_kept_ds", flash_attention_tc_cuda.cu; head size 64): the index math in plain
// functions, so that a host test (tests/common/test_mma_fragments.cpp) can replay the store and
// the load back without a GPU. No CUDA headers.
//
// Version 2's two backward kernels both compute S and dP, because each needs dS: 7 tile products
// per (query tile, key tile) where 5 would do. Kept, dS is computed once: the dK/dV kernel writes
// each dS^T tile it made (bf16, rounded as dK's product used it) to a scratch buffer, and the dQ
// kernel reads it back, so its loop is one product, dQ += dS K, instead of three and the
// exponentials. The price is memory: 2 bytes per score, written once and read once (gpt-85m:
// 214 MB a layer causal, alive only during that layer's attention backward).
#include <cstdint>

#include "common/ops/cuda/mma_fragments.hpp"

namespace scalelab::ops::kept_ds {

/// Keys and queries per tile: the dK/dV kernel's key block and query tile at head size 64, the
/// dQ kernel's query block and key tile.
constexpr int kTile = 64;
constexpr int kTileElems = kTile * kTile;

/// Tiles kept per head with n tiles of keys (and of queries): the (query tile i, key tile j)
/// pairs with any score, j <= i causal (row i has i + 1 tiles), every pair unmasked.
SCALELAB_HD constexpr int64_t tiles_per_head(int64_t n, bool causal) {
  return causal ? n * (n + 1) / 2 : n * n;
}

/// Where tile (i, j) lies among its head's tiles (in tiles). Row i's tiles j = 0, 1, ... are
/// consecutive: the dQ kernel's block of query tile i reads them in order.
SCALELAB_HD constexpr int64_t tile_index(int64_t i, int64_t j, int64_t n, bool causal) {
  return causal ? i * (i + 1) / 2 + j : i * n + j;
}

/// A tile holds dS^T row-major: (key kk, query qq) at kk * kTile + qq. Warp `warp` of the dK/dV
/// kernel holds keys 16 warp .. + 15 as accumulators; register pair (2 h, 2 h + 1) of its n-tile
/// n (queries 8 n ..) is two neighbours in a row, stored as one 4-byte pair at this element.
SCALELAB_HD constexpr int fragment_offset(int warp, int lane, int n, int h) {
  return (16 * warp + mma::c_row(lane, 2 * h)) * kTile + 8 * n + mma::c_col(lane, 0);
}

}  // namespace scalelab::ops::kept_ds
