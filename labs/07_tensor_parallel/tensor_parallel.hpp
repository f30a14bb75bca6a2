#pragma once
/// @file tensor_parallel.hpp
/// Lab 07 contract: tensor parallelism (Megatron-LM). The tp ranks of a group share every layer:
/// each holds a slice of every weight, computes with its slice, and the ranks talk only where a
/// partial result must become whole. Two conjugate operators say where:
///
///   f   forward: identity (every rank already has the whole input X)
///       backward: all-reduce (each rank's dX is a partial sum over its slice of the weight)
///   g   forward: all-reduce (each rank's output is a partial sum)
///       backward: identity (every rank needs the whole dY, and already has it)
///
/// A column-parallel Linear (each rank keeps 1/tp of the output features: rows of the (out, in)
/// weight) starts with f; a row-parallel Linear (1/tp of the input features: columns of the
/// weight) ends with g. An MLP is f -> column -> GELU -> row -> g: one all-reduce forward, one
/// backward. Attention is the same with the heads as the columns.
///
/// Core steps 1-4 (about 90 minutes), optional steps 5 and 6: README.md (hints:
/// ./scalelab hint 07 STEP).
///
/// Every rank of `tp` must call these functions in the same order (they are collectives).
/// Parameters are drawn for the FULL tensor from (seed, name) and cut to the shard a layer holds
/// (nn::Shard), so a sharded layer holds exactly the single-device values.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/model_config.hpp"
#include "common/nn/block.hpp"
#include "common/nn/gpt.hpp"
#include "common/nn/mappings.hpp"
#include "common/nn/layernorm.hpp"
#include "common/nn/linear.hpp"

namespace scalelab::lab07 {

// ---- Step 1: the conjugate operators f and g ---------------------------------------------------

/// Step 1. f's forward: the identity (nothing to do, nothing sent).
void f_forward(Tensor& x, comm::Communicator& tp);
/// Step 1. f's backward: `dx` (this rank's partial input gradient) becomes the sum over the tp
/// ranks, in place: one all-reduce of dx. Call it even with one rank (the byte counters then
/// show every all-reduce the technique makes).
void f_backward(Tensor& dx, comm::Communicator& tp);
/// Step 1. g's forward: `y` (this rank's partial output) becomes the sum over the tp ranks, in
/// place: one all-reduce. Also with one rank.
void g_forward(Tensor& y, comm::Communicator& tp);
/// Step 1. g's backward: the identity (nothing to do, nothing sent).
void g_backward(Tensor& dy, comm::Communicator& tp);

// ---- Step 2: column- and row-parallel Linear --------------------------------------------------

/// Step 2a. The rows of an (out_features, in) weight rank `rank` of `tp` keeps in a
/// column-parallel Linear: a Shard on dim 0 holding this rank's contiguous 1/tp of the rows,
/// rank 0 the first (the bias is cut the same way). One range even when tp = 1.
/// scalelab::UsageError when tp does not divide out_features.
nn::Shard column_shard(int64_t out_features, int rank, int tp);
/// Step 2a. The columns of an (out, in_features) weight a row-parallel Linear keeps: a Shard on
/// dim 1 holding this rank's contiguous 1/tp of the columns (its bias is kept whole). One range
/// even when tp = 1,
/// so the layer knows it is row parallel (nn::Linear::row_parallel) and leaves the bias to the
/// caller. scalelab::UsageError when tp does not divide in_features.
nn::Shard row_shard(int64_t in_features, int rank, int tp);

/// Step 2b. Column-parallel forward. x (..., in) the whole input, the same on every rank;
/// returns (..., out/tp), this rank's output features of the layer (its bias included), with
/// 1/tp of the layer's GEMM FLOPs. No communication.
Tensor column_parallel_forward(const nn::Linear& layer, const Tensor& x, comm::Communicator& tp);
/// Step 2b. Column-parallel backward: this rank's slices of dW and db grow by their gradients
/// (+=); returns dx (..., in), the WHOLE input gradient, the same on every rank (one
/// all-reduce).
Tensor column_parallel_backward(nn::Linear& layer, const Tensor& dy_local, const Tensor& x,
                                comm::Communicator& tp);
/// Step 2c. Row-parallel forward: x_local (..., in/tp) this rank's input features. Returns
/// (..., out), the layer's whole output (its bias counted once), the same on every rank (one
/// all-reduce).
Tensor row_parallel_forward(const nn::Linear& layer, const Tensor& x_local,
                            comm::Communicator& tp);
/// Step 2c. Row-parallel backward: dy (..., out), the same on every rank; dW (this rank's
/// columns) and db (whole, the same on every rank) grow by their gradients (+=); returns
/// dx_local (..., in/tp), the gradient of this rank's input features. No communication.
Tensor row_parallel_backward(nn::Linear& layer, const Tensor& dy, const Tensor& x_local,
                             comm::Communicator& tp);

// ---- Step 3: the tensor-parallel block -------------------------------------------------------

/// Which rows of the fused (3C, C) QKV weight and which columns of the (C, C) output
/// projection a rank keeps.
struct HeadShards {
  nn::Shard qkv;   // dim 0: the q, k and v rows of this rank's heads (three ranges)
  nn::Shard proj;  // dim 1: the columns that read this rank's heads' outputs
};

/// Step 3a. Rank `rank` of `tp` keeps a contiguous group of n_head/tp whole heads, rank 0 the
/// first: their q, k and v rows of the fused QKV weight (which stacks all q rows, then all k
/// rows, then all v rows, head after head) and the projection's columns that read their
/// outputs. One set of ranges also when tp = 1. scalelab::UsageError when tp does not divide
/// n_head.
HeadShards head_shards(int64_t n_embd, int64_t n_head, int rank, int tp);

/// Given. Sets which slice of each weight `block` keeps as rank `rank` of `tp`: attention by
/// head_shards, the MLP's fc by column_shard(4C) and its proj by row_shard(4C), the row-parallel
/// biases whole. Called before the parameters are bound (nn::GPTOptions::cut_block), so the
/// block holds exactly these slices of the single-device values.
void cut_block(nn::Block& block, const ModelConfig& config, int rank, int tp);
/// Given. Block `index` of a model with n_layer blocks, cut by cut_block (parameters not bound:
/// bind them with an nn::ParameterSet). It computes partial sums until its mappings are set
/// (block.mappings = a TensorParallel).
std::unique_ptr<nn::Block> make_block(int index, const ModelConfig& config, int rank, int tp);

/// Where a tensor-parallel model talks (nn::Mappings, common/nn/mappings.hpp): nn::Block calls
/// enter before each column-parallel sub-layer (its attention, its MLP) and leave after each
/// row-parallel one; nn::GPT calls the vocabulary pieces at its embedding and head. One object
/// per model, on the model's tp group (kept by reference: the group must outlive the model).
class TensorParallel : public nn::Mappings {
 public:
  explicit TensorParallel(comm::Communicator& tp) : tp_(tp) {}
  /// Step 3b. The block's hook points, made tensor parallel: with these mappings a block equals
  /// the single-device block, each rank doing 1/tp of its GEMM FLOPs, with one all-reduce of
  /// (B, T, C) per sub-layer forward and one backward: 2 + 2 per block per step, whatever tp.
  /// enter: into a region (x whole on every rank); enter_backward: the gradient of that whole
  /// input, a partial sum on each rank; leave: a row-parallel layer's partial output;
  /// leave_backward: the gradient of the whole output, the same on every rank. Each returns
  /// the tensor to continue with (it may be the one it was given, changed in place).
  Tensor enter(const Tensor& x) const override;
  Tensor enter_backward(const Tensor& dx) const override;
  Tensor leave(const Tensor& y) const override;
  Tensor leave_backward(const Tensor& dy) const override;

  /// Given: the vocabulary-parallel ends with step 4's functions. The head is a column-parallel
  /// layer over the vocabulary (the model enters its region, then computes V/tp logit columns).
  bool splits_vocabulary() const override { return true; }
  Tensor embedding_forward(const Tensor& wte, int64_t lo, const Tensor& wpe,
                           const Tensor& tokens) const override;
  void embedding_backward(Tensor& dwte, int64_t lo, Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens) const override;
  Scalar cross_entropy(Tensor& logits, const Tensor& targets, int64_t lo) const override;
  void cross_entropy_backward(Tensor& probs, const Tensor& targets, int64_t lo,
                              double scale) const override;

  comm::Communicator& group() const { return tp_; }

 protected:
  comm::Communicator& tp_;
};

/// Given. scalelab::UsageError (one line) unless tp >= 1 divides the heads, the MLP width 4C and
/// the vocabulary of `config`.
void check_tp(const ModelConfig& config, int tp);

// ---- Step 4: vocabulary parallel -------------------------------------------------------------

/// Step 4a. The vocabulary rows [lo, hi) rank `rank` of `tp` keeps: its contiguous 1/tp of the
/// token ids, rank 0 the first.
/// scalelab::UsageError when tp does not divide V.
struct VocabRange {
  int64_t lo = 0, hi = 0;
};
VocabRange vocab_range(int64_t vocab_size, int rank, int tp);

/// Step 4b. The embedding with wte sharded by vocabulary rows: out (B, T, C), the single-device
/// token + position embedding of `tokens`, bitwise, on every rank. This rank holds wte rows
/// [lo, lo + wte_local.size(0)) (wte_local, (V/tp, C)) and the whole wpe; one all-reduce of
/// (B, T, C). Built from tensor ops that exist on both devices (common/ops/ops.hpp): the result
/// lives where wte_local does.
Tensor vocab_parallel_embedding_forward(const Tensor& wte_local, int64_t lo, const Tensor& wpe,
                                        const Tensor& tokens, comm::Communicator& tp);
/// Step 4b. The embedding's backward: dwte_local (this rank's rows) and dwpe grow by their
/// gradients (+=). dout is the same on every rank: no communication.
/// In mixed precision dout is bf16 and the gradients fp32 (the library's embedding backward
/// takes the same pair).
void vocab_parallel_embedding_backward(Tensor& dwte_local, int64_t lo, Tensor& dwpe,
                                       const Tensor& dout, const Tensor& tokens);

/// Step 4c. Cross-entropy over logits split by vocabulary, WITHOUT gathering them.
/// logits (N, V/tp): this rank's columns [lo, lo + V/tp) of the (N, V) logits; targets (N) i32,
/// on the logits' device. Replaces `logits` IN PLACE by this rank's columns of softmax(full
/// logits) (what backward needs) and returns the mean loss over the N rows, the same on every
/// rank. Exactly three all-reduces of N numbers; allocates only O(N) besides: the (N, V) logits
/// never exist on one rank.
/// Built from the per-row ops of common/ops/ops.hpp (no loop over elements here), so it runs on
/// the CPU and on a GPU. In mixed precision the logits (and probabilities) are bf16 and the three
/// per-row numbers fp32 (ops::stats_dtype): the probabilities within one bf16 rounding of the
/// single-device op's. The mean loss stays on the logits' device (a Scalar), read by whoever
/// prints it.
Scalar vocab_parallel_cross_entropy(Tensor& logits, const Tensor& targets, int64_t lo,
                                    comm::Communicator& tp);
/// Step 4c. The backward, in place: probs (N, V/tp) from the forward becomes the gradient of
/// scale times the mean loss with respect to this rank's logit columns. No communication.
void vocab_parallel_cross_entropy_backward(Tensor& probs, const Tensor& targets, int64_t lo,
                                           double scale = 1.0);

// ---- Step 5: sequence parallelism -----------------------------------------------------------

/// Between the tensor-parallel regions (LayerNorm, bias, residual) every rank of step 3 computes
/// the same thing on the whole (B, T, C) activation, and keeps it. Sequence parallelism splits
/// those regions by token instead: rank r holds rows [lo, hi) of the (B*T, C) activation. The
/// rows are the flattened tokens, so a rank's rows are contiguous in memory (in Megatron's
/// (s, b, h) layout the same idea splits s); LayerNorm, bias and residual act on each token
/// alone, so any split by token gives the same numbers. scalelab::UsageError when tp does not
/// divide the number of tokens.
struct TokenRange {
  int64_t lo = 0, hi = 0;
};
/// Step 5a. Rank `rank`'s token rows of `tokens` = B*T: its contiguous 1/tp of them, rank 0 the
/// first.
TokenRange sequence_rows(int64_t tokens, int rank, int tp);

/// Step 5a. The shapes: N = B*T token rows of C. A rank's rows are (N/tp, C); a region's whole
/// tensor comes as (B, T, C) from a block (the library views its gathered rows as the batch) and
/// as (N, C) from the head. Either way its rows are the N flattened tokens, split by tp into
/// contiguous pieces of N/tp rows: never by its first dimension (B may be smaller than tp, or
/// not divide by it). Each function returns (N/tp, C) or (N, C).
///
/// Entering a tensor-parallel region (before a column-parallel layer, in place of f): forward,
/// all-gather this rank's rows x_sp (N/tp, C) into the whole (N, C), rank 0's rows first; ...
Tensor gather_sequence(const Tensor& x_sp, comm::Communicator& tp);
/// ... backward, the gradient of the whole input, dx_full (B, T, C) or (N, C), is a partial sum
/// on each rank (as in f's backward), and each rank needs only its rows: one reduce-scatter to
/// (N/tp, C).
Tensor gather_sequence_backward(const Tensor& dx_full, comm::Communicator& tp);
/// Step 5a. Leaving a tensor-parallel region (after a row-parallel layer, in place of g):
/// forward, reduce-scatter the partial output y_partial (B, T, C): rank r gets the SUM of its
/// rows, (N/tp, C); ...
Tensor scatter_sequence(const Tensor& y_partial, comm::Communicator& tp);
/// ... backward, all-gather the rows' gradients dy_sp (N/tp, C) into the whole (N, C) gradient.
Tensor scatter_sequence_backward(const Tensor& dy_sp, comm::Communicator& tp);

/// Given. LayerNorm backward on this rank's token rows: din += the input gradient of the rows
/// (din = dresidual + ... when the residual's gradient is given); the weight and bias gradients,
/// partial sums over the ranks' rows, are computed apart, all-reduced over `tp` (2 all-reduces
/// of C) and then added to ln's gradients (they accumulate).
void layernorm_backward_rows(nn::LayerNorm& ln, Tensor& din, const Tensor& dout, const Tensor& in,
                             const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                             comm::Communicator& tp);

/// The same model with sequence parallelism: between the regions every rank keeps only its
/// N/tp token rows (LayerNorm, bias, residual, the blocks' inputs); nn::Block and nn::GPT run
/// unchanged on those rows, and these mappings turn them into the whole (N, C) a region needs
/// and back. The vocabulary pieces are TensorParallel's (the embedding's all-reduce, then this
/// rank's rows: split_rows).
class SequenceParallel : public TensorParallel {
 public:
  explicit SequenceParallel(comm::Communicator& tp) : TensorParallel(tp) {}
  /// Step 5b. What replaces f and g: a block must move 2 all-gathers and 2 reduce-scatters of
  /// N*C forward and no all-reduce of activations. enter: this rank's rows (N/tp, C) -> the
  /// whole (N, C); enter_backward: the whole input's gradient (a partial sum; (B, T, C) from a
  /// block, (N, C) from the head) -> our rows of the sum (N/tp, C); leave: a partial (B, T, C)
  /// output -> our rows of the sum (N/tp, C); leave_backward: our rows of the output's gradient
  /// (N/tp, C) -> the whole gradient (N, C).
  Tensor enter(const Tensor& x) const override;
  Tensor enter_backward(const Tensor& dx) const override;
  Tensor leave(const Tensor& y) const override;
  Tensor leave_backward(const Tensor& dy) const override;
  /// Given (with step 5a's sequence_rows and scatter_sequence_backward): the embedding's output
  /// (every row on every rank, after its all-reduce) -> a copy of this rank's rows; backward:
  /// our rows' gradient -> every row's (an all-gather).
  Tensor split_rows(const Tensor& x) const override;
  Tensor split_rows_backward(const Tensor& dx) const override;
  /// Given: layernorm_backward_rows (LayerNorm weights see only our rows: their gradients are
  /// all-reduced, 2 vectors of C per LayerNorm).
  void layernorm_backward(nn::LayerNorm& ln, Tensor& din, const Tensor& dout, const Tensor& in,
                          const Tensor& mean, const Tensor& rstd,
                          const Tensor& dresidual) const override;
};

// ---- The tensor-parallel GPT (given: the wiring of the steps above) ---------------------------

struct TPOptions {
  DType dtype = DType::f32;
  /// Where parameters and activations live: the CPU or this rank's GPU (train::rank_device).
  /// Token ids must be on it too.
  Device device = Device::cpu();
  /// bf16 with dtype f32: mixed precision, as nn::GPTOptions::compute_dtype (fp32 master weights
  /// and gradients, a bf16 compute copy of the weights, bf16 activations and collectives of them).
  DType compute_dtype = DType::f32;
  uint64_t seed = 1337;
  /// Sequence parallel (step 5) between the tensor-parallel regions of every block and around
  /// ln_f; B*T must divide by tp.
  bool sequence_parallel = false;
};

/// Given. This rank's share of the tensor-parallel GPT: the library's nn::GPT (the same
/// parameter names, order and initial values as the single device) with every block cut by
/// cut_block, wte (and the tied head) holding this rank's vocabulary rows (vocab_range), and
/// the mappings TensorParallel on tp (SequenceParallel with sequence_parallel). Train it as any
/// nn::GPT: forward(tokens, targets, acts), backward(acts). check_tp first.
std::unique_ptr<nn::GPT> make_tp_gpt(const ModelConfig& config, comm::Communicator& tp,
                                     const TPOptions& options = {});

// ---- Step 6: measure ------------------------------------------------------------------------

/// Step 6a. The bytes of activations one rank holds after the forward of make_tp_gpt's model on
/// a (B, T) batch, exactly nn::GPTActivations::nbytes: activations in `dtype` (bf16 in mixed
/// precision), LayerNorm statistics in ops::stats_dtype(dtype) (fp32 for bf16), with or without
/// sequence parallelism. Predicted from the shapes, not measured.
std::size_t activation_bytes_formula(const ModelConfig& config, int64_t B, int64_t T, int tp,
                                     DType dtype, bool sequence_parallel = false);
/// Step 6b. The payload bytes one training step (forward + backward) of make_tp_gpt's model
/// submits per rank, exactly as the byte counters count them (common/comm/stats.hpp: all-reduce
/// the tensor, all-gather its output, reduce-scatter its input), with or without sequence
/// parallelism. Activations (and their gradients) travel in `dtype`; the cross-entropy's per-row
/// numbers and the LayerNorm weight gradients in ops::stats_dtype(dtype) (fp32 in mixed
/// precision). Predicted from the shapes and the model's collectives, not measured.
std::size_t comm_bytes_formula(const ModelConfig& config, int64_t B, int64_t T,
                               DType dtype, bool sequence_parallel = false);

}  // namespace scalelab::lab07
