#pragma once
/// @file optim.hpp
/// Optimizers over parameter groups: AdamW (PyTorch's, as nanoGPT), SGD with momentum, global-norm
/// gradient clipping and nanoGPT's cosine learning-rate schedule with linear warmup.
///
/// A group is a (value, grad) pair of views plus whether weight decay applies. From a model:
/// optim::groups(model.parameters()) (one group per parameter). ZeRO shards make their own groups
/// from slices of the flat buffers. Optimizer state (AdamW's m and v) is one flat allocation per
/// state, sliced per group like the parameters.
#include <cstdint>
#include <vector>

#include "common/nn/parameter.hpp"
#include "common/ops/ops.hpp"
#include "common/scalar.hpp"

namespace scalelab::optim {

/// What an optimizer updates: a slice of values with its gradients (a whole parameter, or the
/// part of it in a ZeRO shard).
struct Group {
  Tensor value;               ///< updated in place
  Tensor grad;                ///< read; the same shape as value
  bool weight_decay = false;  ///< decoupled weight decay applies (2-d weights, not biases or LayerNorms)
  /// Mixed precision: the parameter's bf16 compute copy, refreshed by every step (AdamW in the
  /// same pass as the update: ops::adamw_update's `compute`). Undefined: none.
  Tensor compute = {};
};

/// One group per parameter, weight decay as the parameter says (2-d weights), with the
/// parameter's compute copy when it has one (mixed precision).
std::vector<Group> groups(const std::vector<nn::Parameter*>& params);

/// Groups over elements [lo, hi) of a parameter set's flat layout only (a ZeRO shard): one group
/// per parameter that overlaps the range, cut to the overlap, weight decay as the parameter says.
/// `values` and `grads` hold the range's elements (element lo at index 0): slices of the flat
/// buffers (ZeRO-1), or this rank's own shard buffers (ZeRO-2 gradients, ZeRO-3 values). So
/// AdamW's m and v exist for hi - lo elements only.
std::vector<Group> groups_in_range(const nn::ParameterSet& set, int64_t lo, int64_t hi,
                                   const Tensor& values, const Tensor& grads);

/// AdamW's hyperparameters (nanoGPT's defaults).
struct AdamWConfig {
  double beta1 = 0.9;          ///< decay of the first moment m
  double beta2 = 0.95;         ///< decay of the second moment v
  double eps = 1e-8;           ///< added to sqrt(v) before dividing
  double weight_decay = 0.1;   ///< decoupled decay of the groups that take it
};

/// AdamW (PyTorch's): keeps m and v, one value each per element of its groups (8 bytes per
/// fp32 parameter: with value and gradient the 16 bytes that ZeRO shards).
class AdamW {
 public:
  /// Allocates m and v (zeros) for every element of `groups`.
  AdamW(std::vector<Group> groups, AdamWConfig config = {});
  /// One update of every group at learning rate lr (the step counter t goes up by one first).
  /// Groups that lie back to back in flat buffers (a model's parameters, a ZeRO shard) take one
  /// ops::adamw_update_segments over the whole buffers; others one update per group.
  void step(double lr);
  /// True when step() runs the one pass over the flat buffers.
  bool one_pass() const { return one_pass_; }
  /// Steps taken (the bias correction's t).
  int64_t steps() const { return t_; }
  /// Sets the step counter, after loading m and v from a checkpoint.
  void set_steps(int64_t t) { t_ = t; }
  /// The moments, flat, in group order (checkpoints; memory tables).
  Tensor& m() { return m_; }
  /// The second moments, flat, in group order.
  Tensor& v() { return v_; }
  /// Bytes of m and v: the optimizer state a rank holds.
  std::size_t state_bytes() const { return m_.nbytes() + v_.nbytes(); }
  /// The hyperparameters.
  const AdamWConfig& config() const { return config_; }

 private:
  std::vector<Group> groups_;
  AdamWConfig config_;
  Tensor m_, v_;
  std::vector<Tensor> gm_, gv_;  // per group views of m_, v_
  // the groups' values, gradients and compute copies as one view each, when they are back to
  // back (Tensor::span), and which of their elements decay
  Tensor values_, grads_, computes_;
  ops::DecaySegments segments_;
  bool one_pass_ = false;
  int64_t t_ = 0;
};

/// SGD with optional momentum and weight decay (what the multi-step equivalence tests use: no
/// state to compare with momentum 0).
class SGD {
 public:
  /// A momentum buffer only when momentum > 0.
  SGD(std::vector<Group> groups, double momentum = 0.0, double weight_decay = 0.0);
  /// One update of every group at learning rate lr.
  void step(double lr);
  /// Bytes of the momentum buffer (0 without momentum).
  std::size_t state_bytes() const { return buf_.defined() ? buf_.nbytes() : 0; }

 private:
  std::vector<Group> groups_;
  double momentum_, weight_decay_;
  Tensor buf_;
  std::vector<Tensor> gbuf_;
  bool first_ = true;
};

/// sqrt(sum of squares of every gradient) (a sum over groups in order, in double).
double grad_norm(const std::vector<Group>& groups);

/// Scales every gradient by max_norm / (norm + 1e-6) when the global norm exceeds max_norm
/// (PyTorch's clip_grad_norm_). Returns the norm before clipping, on the gradients' device: the
/// norm is summed, compared and applied there (ops::sum_squares_into, ops::clip_scale), so a
/// step that clips reads nothing back until someone reads the Scalar (on a GPU: once the trial
/// kernel "norm_on_device" is checked; until then two reads). The bits of grad_norm.
Scalar clip_grad_norm(const std::vector<Group>& groups, double max_norm);

/// nanoGPT's schedule: linear warmup to max_lr over `warmup` steps (lr * (step+1) / (warmup+1)),
/// then cosine decay to min_lr at `decay_steps`, min_lr after.
double cosine_lr(int64_t step, int64_t warmup, int64_t decay_steps, double max_lr, double min_lr);

}  // namespace scalelab::optim
