#pragma once
/// @file attention.hpp
/// Causal multi-head self-attention (GPT-2): a fused QKV projection, per-head scaled dot-product
/// attention with a causal mask, and an output projection. By default attention is written out
/// (two batched matmuls and a causal softmax) so every step is visible and checkable, and the
/// (T, T) probabilities are kept for backward. With `flash` set the same attention runs as one
/// fused op (common/ops/flash_attention.hpp): it keeps one log-sum-exp per row instead of the
/// (T, T) matrix and recomputes the probabilities in backward: the fast path on a GPU, and the
/// only one that fits long contexts. That op reads q, k and v where the QKV matmul wrote them
/// and writes y with its heads merged (flash_attention_qkv_forward), so the fused path needs no
/// split_heads / merge_heads copies; a mappings' own attention core (lab 11's ring) takes
/// (B*NH, T, hs) heads as before.
///
/// Tensor parallel (lab 07): with tp_size > 1 this layer keeps a contiguous 1/tp of the heads
/// only: the q, k and v rows of those heads in the QKV weight (column parallel) and the matching
/// columns of the output projection (row parallel). Its output is then a PARTIAL sum, without the
/// projection's bias: the caller all-reduces it and then adds the bias once (proj.add_bias).
#include <string>
#include <vector>

#include "common/nn/linear.hpp"
#include "common/nn/mappings.hpp"

namespace scalelab::nn {

/// What forward saves for backward. Separate allocations, freed by reset().
struct AttentionActivations {
  Tensor q;    ///< (B, NH, T, hs) the queries (NH: this rank's heads); not on the fused path
  Tensor k;    ///< (B, NH, T, hs) the keys; not on the fused path
  Tensor v;    ///< (B, NH, T, hs) the values; not on the fused path
  /// (B, T, 3 * NH * hs) the QKV matmul's output, kept whole in place of q, k, v by the fused
  /// path (`flash` with the library's own attention core)
  Tensor qkv;
  Tensor att;  ///< (B*NH, T, T) softmax probabilities (0 above the diagonal); unfused only
  /// (B*NH, T) log-sum-exp of each row's scores, f32; flash only (or what the mappings'
  /// attention core keeps: Mappings::attention_forward)
  Tensor lse;
  /// Anything else that core keeps (lab 11's all-to-all: its heads).
  std::vector<Tensor> kept;
  Tensor y;    ///< (B, T, C) heads merged: the input of the output projection
  /// Frees every tensor.
  void reset() { *this = AttentionActivations{}; }
};

/// GPT-2's attention sub-layer; holds its weights (or a tensor-parallel rank's heads of them),
/// never its activations.
class CausalSelfAttention {
 public:
  /// Parameters `name`.qkv (3C, C) and `name`.proj (C, C) with biases; n_layer scales the
  /// projection's initial values (GPT-2's residual scaling); tp_rank / tp_size: its heads.
  CausalSelfAttention(const std::string& name, int64_t n_embd, int64_t n_head, int64_t n_layer,
                      int tp_rank = 0, int tp_size = 1);
  /// out (B, T, C) from x (B, T, C); fills `acts`. The fused path's core is m's
  /// (Mappings::attention_forward; null: one device), used when `flash` is set or m replaces it.
  void forward(Tensor& out, const Tensor& x, AttentionActivations& acts,
               const Mappings* m = nullptr) const;
  /// dx (B, T, C) += from dout (B, T, C) (`into` set: dx =); parameter gradients +=. Calls
  /// `hook` (if set) after each projection's backward.
  void backward(Tensor& dx, const Tensor& dout, const Tensor& x, const AttentionActivations& acts,
                const BackwardHook* hook = nullptr, const Mappings* m = nullptr,
                InputGrad into = InputGrad::add);
  /// qkv's, then proj's.
  std::vector<Parameter*> parameters();

  /// The heads on this rank (all of them without tensor parallelism).
  int64_t n_head() const { return n_head_; }
  /// C / n_head of the whole model: every head's width.
  int64_t head_size() const { return head_size_; }
  Linear qkv;   ///< the fused q, k, v projection (column parallel under tp)
  Linear proj;  ///< the output projection (row parallel under tp)
  /// Fused (flash) attention instead of the written-out one (GPTOptions::flash_attention).
  bool flash = false;

 private:
  int64_t n_head_, head_size_;
};

}  // namespace scalelab::nn
