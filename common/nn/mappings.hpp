#pragma once
/// @file mappings.hpp
/// The hook points where a parallel technique plugs into the model (Megatron-LM's "mappings").
/// nn::Block and nn::GPT call these operators at fixed places and know nothing of ranks; this
/// class, the default, is one device: identities and the library's own ops. Lab 07 writes the
/// tensor-parallel ones (f and g, sequence parallelism's all-gather and reduce-scatter, the
/// vocabulary-parallel embedding and cross-entropy); a model takes them with GPT::set_mappings.
///
/// Where the model calls them (one block; the head is the same with ln_f and the logits):
///
///   rows ─ ln1 ─ enter ─▶ attention (column- then row-parallel) ─ leave ─ +bias ─ +x ─▶ rows
///                 ◀ enter_backward                                 ◀ leave_backward
///
///   tokens ─ embedding_forward ─ split_rows ─▶ blocks ─▶ ln_f ─ enter ─ logits ─ cross_entropy
///
/// "rows" are the token rows a rank keeps between the regions: all N = B*T of them, (B, T, C), or
/// with sequence parallelism its N/tp, (N/tp, C). Inside a region every rank computes on all N
/// rows ("full", (B, T, C)) with its slice of the weights. The default keeps every row and
/// every weight, so each operator is the identity.
#include <cstdint>
#include <vector>

#include "common/scalar.hpp"
#include "common/tensor.hpp"

namespace scalelab::nn {

class LayerNorm;
class MoE;

/// The operators a model calls where a parallel technique communicates; this base class is one
/// device (identities and the library's own ops). Subclass it and override what your technique
/// changes (lab 07's TensorParallel and SequenceParallel); GPT::set_mappings plugs it in.
class Mappings {
 public:
  virtual ~Mappings() = default;

  // ---- the regions of a block (and the head's logits) ----
  /// Into a region, forward: this rank's rows -> the full input of a column-parallel layer
  /// (lab 07 step 3 decides what tensor parallelism does here, step 5 sequence parallelism).
  virtual Tensor enter(const Tensor& x) const { return x; }
  /// ... backward: the full input's gradient, a partial sum on each rank -> this rank's rows of
  /// the sum.
  virtual Tensor enter_backward(const Tensor& dx) const { return dx; }
  /// Out of a region, forward: a row-parallel layer's partial full output -> this rank's rows
  /// of the sum.
  virtual Tensor leave(const Tensor& y) const { return y; }
  /// ... backward: this rank's rows of the output's gradient -> the full gradient.
  virtual Tensor leave_backward(const Tensor& dy) const { return dy; }
  /// LayerNorm's backward on this rank's rows: din +=, ln's gradients +=; given the residual's
  /// gradient (defined), din = dresidual + ... instead (LayerNorm::backward). Sequence parallel:
  /// the weight gradients of this rank's rows are partial sums, to be summed over the ranks.
  virtual void layernorm_backward(LayerNorm& ln, Tensor& din, const Tensor& dout,
                                  const Tensor& in, const Tensor& mean, const Tensor& rstd,
                                  const Tensor& dresidual) const;

  // ---- the attention core ----
  /// True when attention's core is the mappings' own (attention_forward/backward below) even if
  /// the model was not built with GPTOptions::flash_attention. Context parallel (lab 11): yes.
  virtual bool replaces_attention() const { return false; }
  /// The fused core of causal attention on this rank's rows: y = softmax(scale q k^T) v, causal
  /// in the sequence, from q, k, v (BH, T, hs) of this rank's T rows. Returns the log-sum-exp
  /// backward needs (kept in AttentionActivations::lse) and may add more tensors to `kept`
  /// (AttentionActivations::kept). Default: ops::flash_attention_forward, returning its
  /// log-sum-exp (BH, T). Context parallel (lab 11): the rows are this rank's share of the
  /// sequence and the other ranks' keys come by ring or by all-to-all.
  virtual Tensor attention_forward(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v,
                                   double scale, std::vector<Tensor>& kept) const;
  /// Sets dq, dk, dv (BH, T, hs) from dy; y, `lse` and `kept` are what attention_forward gave.
  virtual void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dy,
                                  const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& y, const Tensor& lse,
                                  const std::vector<Tensor>& kept, double scale) const;

  // ---- the experts of an MoE block (nn::MoE) ----
  /// The experts on the dispatched rows `xd` (M, C) of this rank's tokens, in nn::MoE's layout:
  /// rows_per_expert[e] consecutive rows for expert e = 0 .. E-1. Returns their outputs (M, C) in
  /// the same layout, and may keep in `kept` what experts_backward needs. Default: every expert
  /// is here (MoE::run_experts). Expert parallel (lab 12): each expert's rows go to the rank
  /// holding it and come back, by all-to-all.
  virtual Tensor experts_forward(const MoE& moe, const Tensor& xd,
                                 const std::vector<int64_t>& rows_per_expert,
                                 std::vector<Tensor>& kept) const;
  /// The backward: returns the gradient of xd (M, C) from the outputs' `dye` (M, C); the
  /// experts' gradients +=. `kept` is what experts_forward kept.
  virtual Tensor experts_backward(MoE& moe, const Tensor& dye,
                                  const std::vector<int64_t>& rows_per_expert,
                                  const std::vector<Tensor>& kept) const;

  // ---- the vocabulary ----
  /// True when the embedding and the head are split by vocabulary (Megatron's
  /// vocabulary-parallel embedding and cross-entropy): the head is then a column-parallel layer
  /// over the vocabulary, entered with enter() / enter_backward() like a block's regions. False
  /// (the default, and mappings that split only the blocks): the head is whole on every rank.
  virtual bool splits_vocabulary() const { return false; }

  // ---- the embedding ----
  /// (B, T, C) = wte[tokens] + wpe[0..T), every row on every rank; wte holds the vocabulary rows
  /// (context parallel, lab 11, overrides it: wpe of the global positions of this rank's rows)
  /// [lo, lo + wte.size(0)) (default: all of them, lo = 0). tokens (B, T) i32 on wte's device.
  virtual Tensor embedding_forward(const Tensor& wte, int64_t lo, const Tensor& wpe,
                                   const Tensor& tokens) const;
  /// dwte (its rows) +=, dwpe += from dout (B, T, C), the same on every rank.
  virtual void embedding_backward(Tensor& dwte, int64_t lo, Tensor& dwpe, const Tensor& dout,
                                  const Tensor& tokens) const;
  /// The embedding's output (every row) -> this rank's rows. Sequence parallel: keep N/tp rows.
  virtual Tensor split_rows(const Tensor& x) const { return x; }
  /// ... backward: this rank's rows' gradient -> every row's. Sequence parallel: all-gather.
  virtual Tensor split_rows_backward(const Tensor& dx) const { return dx; }

  // ---- the loss ----
  /// Mean cross-entropy over the N rows of logits (N, V_local), the columns [lo, lo + V_local)
  /// of the (N, V) logits; targets (N) i32. Replaces `logits` by the same columns of the softmax
  /// (what the backward needs). The same value on every rank, on the logits' device (a Scalar:
  /// read it to the host only to print it).
  virtual Scalar cross_entropy(Tensor& logits, const Tensor& targets, int64_t lo) const;
  /// Replaces `probs` (N, V_local) by the gradient of scale * the mean loss w.r.t. the logits,
  /// on these columns.
  virtual void cross_entropy_backward(Tensor& probs, const Tensor& targets, int64_t lo,
                                      double scale) const;

  /// The single-device mappings (what a model uses until set_mappings).
  static const Mappings& single_device();
};

}  // namespace scalelab::nn
