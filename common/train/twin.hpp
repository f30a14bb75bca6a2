#pragma once
/// @file twin.hpp
/// The single-device twin of a parallel run: the GPT every lab's program checks its technique
/// against, built from the same config and options (seed, precision, device) and trained on the
/// same global batches with its own AdamW, on rank 0, step by step beside the run. Its losses go
/// to TwinCheck (equivalence.hpp); what differs is the technique's.
///
///     std::optional<train::SingleDeviceTwin> twin;
///     if (comm.rank() == 0) twin.emplace(config, session.model_options(run.seed));
///     ...
///     const double want = twin->step(global, lr);   // the whole global batch
#include <cstddef>

#include "common/data/sampler.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"
#include "common/optim/optim.hpp"

namespace scalelab::train {

/// The twin: its GPT and AdamW, stepped on the run's global batches.
class SingleDeviceTwin {
 public:
  /// Builds the GPT from `config` and `options` (the run's: same seed, precision and device).
  SingleDeviceTwin(const ModelConfig& config, const nn::GPTOptions& options);

  /// One training step on `batch` (the whole global batch; copied to the model's device when it
  /// lives elsewhere) at learning rate lr: zero the gradients, forward, backward, AdamW. Returns
  /// the loss of the forward, before the update, as a parallel step line prints its own.
  double step(const data::Batch& batch, double lr);

  /// Bytes of activations the last step's forward held (before its backward freed them).
  std::size_t activation_bytes() const { return activation_bytes_; }
  /// The twin's GPT (lab 09 loads the run's parameters into it for the validation loss).
  nn::GPT& model() { return model_; }

 private:
  nn::GPT model_;
  optim::AdamW adamw_;  // after model_: built from its parameters
  std::size_t activation_bytes_ = 0;
};

}  // namespace scalelab::train
