#pragma once
// One pre-LayerNorm transformer block (GPT-2):
//   x -> x + attn(ln1(x)) = r -> r + mlp(ln2(r))
//
// The block keeps NO activations: forward fills a BlockActivations the caller owns, and backward
// reads it. So one block can have several forwards in flight (a pipeline stage runs F(0) F(1)
// F(2) B(0) F(3) B(1) ... with one BlockActivations per micro-batch), and activation
// checkpointing frees one (reset()) and fills it again by calling forward on the same input.
// Every tensor in it is its own allocation, counted by the allocator.
#include <string>
#include <vector>

#include "common/nn/attention.hpp"
#include "common/nn/layernorm.hpp"
#include "common/nn/mappings.hpp"
#include "common/nn/mlp.hpp"

namespace scalelab::nn {

/// What one forward of a Block saves for its backward.
struct BlockActivations {
  Tensor ln1, ln1_mean, ln1_rstd;  // (B, T, C), (B*T), (B*T)
  AttentionActivations attn;
  Tensor res2;                     // (B, T, C): x + attn(ln1(x))
  Tensor ln2, ln2_mean, ln2_rstd;
  MLPActivations mlp;
  /// Frees every tensor (their bytes go back to the allocator).
  void reset() { *this = BlockActivations{}; }
  /// True when forward filled it (backward can run; selective pieces may still be missing).
  bool defined() const { return res2.defined(); }
  /// Bytes held (for memory tables).
  std::size_t nbytes() const;
};

class Block {
 public:
  Block(int index, int64_t n_embd, int64_t n_head, int64_t n_layer, int tp_rank = 0,
        int tp_size = 1);
  /// Returns the block's output (a new allocation, the shape of x) and fills `acts` (any
  /// previous contents are released first). x: this rank's rows of the block's input, (B, T, C),
  /// or with sequence parallelism (N/tp, C) and then `seq_len` = T, so the block can view the
  /// full rows a region computes on as (B, T, C) (see mappings.hpp).
  Tensor forward(const Tensor& x, BlockActivations& acts, int64_t seq_len = 0) const;
  /// Returns dx (the shape of x, a new allocation) from dout; accumulates (+=) parameter
  /// gradients. `acts` must come from forward(x, acts) on this same x. Calls `hook` as each
  /// layer's gradients become final.
  Tensor backward(const Tensor& dout, const Tensor& x, const BlockActivations& acts,
                  const BackwardHook* hook = nullptr, int64_t seq_len = 0);
  std::vector<Parameter*> parameters();

  /// Where the block's communication happens (mappings.hpp): entering and leaving its attention
  /// and MLP regions, and LayerNorm's backward. Null: one device (Mappings::single_device()).
  /// Not owned: nn::GPT::set_mappings points every block at its mappings.
  const Mappings* mappings = nullptr;

  int index;
  LayerNorm ln1;
  CausalSelfAttention attn;
  LayerNorm ln2;
  MLP mlp;
};

}  // namespace scalelab::nn
