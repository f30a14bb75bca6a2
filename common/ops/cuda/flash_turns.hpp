#pragma once
// Who adds to dQ when, in flash attention's one-kernel backward
// (flash_attention_tc_backward_cuda.cu): the order of the turns in plain functions, so that a
// host test (tests/common/test_flash_turns.cpp) can replay a whole grid without a GPU: that every
// query tile gets the shares of exactly the key blocks that see it, each once, block 0's last; and
// that blocks started in launch order, however few fit on the GPU at once, never wait forever.
// No CUDA headers: the kernel and the test include the same lines.
//
// A block owns Bk keys (a key block) and walks the query tiles (Bq rows each) that see them.
// Query tile i0 (its first row) is added to by key blocks first_adder(i0), ..., 1, 0, in that
// order: a block's turn there is first_adder(i0) - its key block.
#include "common/bf16.hpp"  // SCALELAB_HD

namespace scalelab::ops::flash_turns {

/// The key block that block `block_x` of the grid owns: the last key block is launched first, so
/// that a block only ever waits for blocks launched before it.
SCALELAB_HD constexpr int key_block(int block_x, int n_key_blocks) {
  return n_key_blocks - 1 - block_x;
}

/// The first query row that sees key block `kb`'s keys: causal, its own first key; else row 0.
SCALELAB_HD constexpr int first_query(int kb, int Bk, bool causal) { return causal ? kb * Bk : 0; }

/// The key block that adds first to the query tile starting at row i0: the last one any of the
/// tile's queries sees (causal: the one holding key i0; Bq divides Bk, so the tile's queries see
/// no key block further on).
SCALELAB_HD constexpr int first_adder(int i0, int Bk, int n_key_blocks, bool causal) {
  return causal ? i0 / Bk : n_key_blocks - 1;
}

/// Key block kb's turn on the query tile starting at row i0: 0 adds first; the turn
/// first_adder(i0) belongs to key block 0, which adds the last share and writes dQ.
SCALELAB_HD constexpr int turn(int kb, int i0, int Bk, int n_key_blocks, bool causal) {
  return first_adder(i0, Bk, n_key_blocks, causal) - kb;
}

}  // namespace scalelab::ops::flash_turns
