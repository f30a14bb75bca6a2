#pragma once
/// @file reference.hpp
/// The single-device run every parallel lab is checked against: the same model config, the same
/// seed, the same GLOBAL batch, on one rank. Tests of labs 03-06 compute it inside the test, on
/// every rank, and compare their parallel result with it (common/train/equivalence.hpp). The
/// programs train theirs beside the run instead, with AdamW: train::SingleDeviceTwin (twin.hpp).
#include <cstdint>
#include <vector>

#include "common/data/sampler.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"

namespace scalelab::train {

/// Loss and gradients of one forward + backward of a fresh GPT(config, seed) on `batch`.
struct Reference {
  double loss = 0;  ///< the mean loss of the batch
  Tensor grads;     ///< flat, in the model's parameter order
};
/// The single-device model's loss and gradients on `batch`: what a parallel step must match.
Reference single_device_step(const ModelConfig& config, uint64_t seed, const data::Batch& batch);

/// `steps` steps of plain SGD (lr, no momentum: rounding differences stay as small as they
/// start, unlike AdamW's) on the sampler's global batches 0..steps-1. Returns the loss of each
/// step and the final parameters (flat).
struct SgdRun {
  std::vector<double> losses;  ///< the loss of each step
  Tensor params;               ///< the parameters after the last step, flat
};
/// The single-device model trained with plain SGD (see SgdRun).
SgdRun single_device_sgd(const ModelConfig& config, uint64_t seed, const data::Sampler& sampler,
                         int steps, double lr);

/// A hermetic corpus for tests: `n` byte tokens from a seeded generator, with some structure (a
/// repeated phrase) so the loss moves when a model trains on it.
std::vector<uint16_t> synthetic_corpus(int64_t n, uint64_t seed);

/// A small config for tests: `tiny` with `n_layer` layers.
ModelConfig test_config(int64_t n_layer = 2);

}  // namespace scalelab::train
