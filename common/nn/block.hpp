#pragma once
/// @file block.hpp
/// One pre-LayerNorm transformer block (GPT-2):
///   x -> x + attn(ln1(x)) = r -> r + mlp(ln2(r))
///
/// The block keeps NO activations: forward fills a BlockActivations the caller owns, and backward
/// reads it. So one block can have several forwards in flight (a pipeline stage runs F(0) F(1)
/// F(2) B(0) F(3) B(1) ... with one BlockActivations per micro-batch), and activation
/// checkpointing frees one (reset()) and fills it again by calling forward on the same input.
/// Every tensor in it is its own allocation, counted by the allocator.
#include <memory>
#include <string>
#include <vector>

#include "common/nn/attention.hpp"
#include "common/nn/layernorm.hpp"
#include "common/nn/mappings.hpp"
#include "common/nn/mlp.hpp"
#include "common/nn/moe.hpp"

namespace scalelab::nn {

/// What one forward of a Block saves for its backward.
struct BlockActivations {
  Tensor ln1;                      ///< (B, T, C): ln1(x), the attention's input
  Tensor ln1_mean;                 ///< (B*T): ln1's per-row mean (statistics dtype)
  Tensor ln1_rstd;                 ///< (B*T): ln1's per-row 1/std
  AttentionActivations attn;       ///< what the attention saved
  Tensor res2;                     ///< (B, T, C): x + attn(ln1(x)), the MLP's residual
  Tensor ln2;                      ///< (B, T, C): ln2(res2), the MLP's input
  Tensor ln2_mean;                 ///< (B*T): ln2's per-row mean
  Tensor ln2_rstd;                 ///< (B*T): ln2's per-row 1/std
  MLPActivations mlp;              ///< what the MLP saved
  MoEActivations moe;              ///< what the mixture of experts saved (an MoE block)
  /// Frees every tensor (their bytes go back to the allocator).
  void reset() { *this = BlockActivations{}; }
  /// True when forward filled it (backward can run; selective pieces may still be missing).
  bool defined() const { return res2.defined(); }
  /// Bytes held (for memory tables).
  std::size_t nbytes() const;
};

/// One transformer block: holds its parameters (or a tensor-parallel rank's slice of them),
/// never its activations, so the same block serves several micro-batches in flight.
class Block {
 public:
  /// Block `index` of an n_layer model of width n_embd with n_head heads; tp_rank / tp_size:
  /// the share of its heads and MLP units it holds (the library's even cut unless
  /// GPTOptions::cut_block sets the shards). Parameters are bound later (ParameterSet).
  Block(int index, int64_t n_embd, int64_t n_head, int64_t n_layer, int tp_rank = 0,
        int tp_size = 1);
  /// Returns the block's output (a new allocation, the shape of x) and fills `acts` (any
  /// previous contents are released first). x: this rank's rows of the block's input, (B, T, C),
  /// or with sequence parallelism (N/tp, C) and then `seq_len` = T, so the block can view the
  /// full rows a region computes on as (B, T, C) (see mappings.hpp).
  Tensor forward(const Tensor& x, BlockActivations& acts, int64_t seq_len = 0) const;
  /// Returns dx (the shape of x, a new allocation) from dout; accumulates (+=) parameter
  /// gradients. `acts` must come from forward(x, acts) on this same x. Calls `hook` as each
  /// layer's gradients become final. `loss_scale`: the scale of the loss whose gradient dout
  /// is (an MoE block's balancing loss is scaled alike).
  Tensor backward(const Tensor& dout, const Tensor& x, const BlockActivations& acts,
                  const BackwardHook* hook = nullptr, int64_t seq_len = 0,
                  double loss_scale = 1.0);
  /// Its parameters, in the stable order (ln1, attention, ln2, MLP or mixture of experts).
  std::vector<Parameter*> parameters();

  /// Where the block's communication happens (mappings.hpp): entering and leaving its attention
  /// and MLP regions, and LayerNorm's backward. Null: one device (Mappings::single_device()).
  /// Not owned: nn::GPT::set_mappings points every block at its mappings.
  const Mappings* mappings = nullptr;

  int index;                 ///< its global index in the model (names: "blocks.<index>.")
  LayerNorm ln1;             ///< before the attention
  CausalSelfAttention attn;  ///< the attention sub-layer
  LayerNorm ln2;             ///< before the MLP
  MLP mlp;                   ///< the MLP sub-layer (never bound in an MoE block)
  /// An MoE block's mixture of experts, in place of the MLP (GPTOptions::moe); null: dense.
  std::unique_ptr<MoE> moe;
};

}  // namespace scalelab::nn
