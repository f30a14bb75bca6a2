#pragma once
// One pre-LayerNorm transformer block (GPT-2):
//   x -> x + attn(ln1(x)) = r -> r + mlp(ln2(r))
// Its activations are one separate set of allocations, owned by the block: free_activations()
// releases them (activation checkpointing keeps only the block's input and calls forward again
// before backward), and has_activations() says whether backward can run.
#include <functional>
#include <string>
#include <vector>

#include "common/nn/attention.hpp"
#include "common/nn/layernorm.hpp"
#include "common/nn/mlp.hpp"

namespace scalelab::nn {

struct BlockActivations {
  Tensor ln1, ln1_mean, ln1_rstd;  // (B, T, C), (B*T), (B*T)
  AttentionActivations attn;
  Tensor res2;                     // (B, T, C): x + attn(ln1(x))
  Tensor ln2, ln2_mean, ln2_rstd;
  MLPActivations mlp;
  void reset() { *this = BlockActivations{}; }
  /// Bytes held (for memory tables).
  std::size_t nbytes() const;
};

class Block {
 public:
  Block(int index, int64_t n_embd, int64_t n_head, int64_t n_layer, int tp_rank = 0,
        int tp_size = 1);
  /// Returns the block's output (B, T, C), a new allocation; saves activations.
  Tensor forward(const Tensor& x);
  /// Returns dx (B, T, C) (a new allocation) from dout; accumulates parameter gradients. Needs
  /// the activations of the forward on this same x.
  Tensor backward(const Tensor& dout, const Tensor& x, const BackwardHook* hook = nullptr);
  void free_activations() { acts_.reset(); }
  bool has_activations() const { return acts_.res2.defined(); }
  const BlockActivations& activations() const { return acts_; }
  /// Writable: selective recomputation (lab 06) puts recomputed tensors back before backward.
  BlockActivations& activations() { return acts_; }
  std::vector<Parameter*> parameters();

  /// Tensor parallel: applied to the attention and MLP outputs before the residual add (the
  /// all-reduce of partial sums: the "g" operator), and to the gradients flowing out of the
  /// column-parallel inputs (the backward of the "f" operator). Unset: identity.
  std::function<void(Tensor&)> reduce_forward, reduce_backward;

  int index;
  LayerNorm ln1;
  CausalSelfAttention attn;
  LayerNorm ln2;
  MLP mlp;

 private:
  BlockActivations acts_;
};

}  // namespace scalelab::nn
