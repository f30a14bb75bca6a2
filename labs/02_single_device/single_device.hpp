#pragma once
/// @file single_device.hpp
/// Lab 02 contract: the training loop of one device, the baseline every parallel lab is checked
/// against. You write the step (zero grads, forward, loss, backward, update), the learning-rate
/// schedule and gradient clipping, evaluation, the throughput figures (tokens/s, MFU) and the
/// memory formula. The model, optimizer, data and checkpoint files are given (common/ and below).
#include <cstdint>
#include <string>
#include <vector>

#include "common/data/sampler.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"
#include "common/optim/optim.hpp"

namespace scalelab::lab02 {

/// Hyper-parameters of a run (the driver's options).
struct TrainConfig {
  double max_lr = 2e-3;   ///< peak learning rate, reached at the end of warmup
  double min_lr = 1e-4;   ///< floor of the cosine decay
  int64_t warmup = 20;    ///< linear warmup steps
  int64_t steps = 500;    ///< total steps; the cosine reaches min_lr here
  double clip = 1.0;      ///< max global gradient norm; <= 0 disables clipping
};

// ---- Step 1: one training step ------------------------------------------------------------

/// Step 1. One optimisation step on `batch` (x, y (B, T) i32 on the model's device): zero the
/// gradients, forward (the mean cross-entropy), backward, then — if clip > 0 — clip the
/// gradients' global norm to `clip` with clip_gradients (step 2), and take one AdamW step at
/// learning rate `lr`. Returns the loss of the forward (before the update).
double train_step(nn::GPT& model, optim::AdamW& opt, const data::Batch& batch, double lr,
                  double clip);

// ---- Step 2: schedule and clipping --------------------------------------------------------

/// Step 2a. The learning rate of `step` (from 0), nanoGPT's schedule:
///   step < warmup:           max_lr * (step + 1) / (warmup + 1)
///   warmup <= step < steps:  min_lr + 0.5 (1 + cos(pi r)) (max_lr - min_lr),
///                            r = (step - warmup) / (steps - warmup)
///   step >= steps:           min_lr
double learning_rate(int64_t step, const TrainConfig& config);

/// Step 2b. Global-norm clipping: the norm is sqrt of the sum over ALL gradients of their squared
/// elements; when it exceeds max_norm, every gradient is multiplied by max_norm / (norm + 1e-6)
/// (PyTorch's clip_grad_norm_). Returns the norm before clipping (a double converts to the
/// Scalar: the reference keeps the norm on the gradients' device, README.md#step-2).
Scalar clip_gradients(nn::GPT& model, double max_norm);

// ---- Step 3: evaluation -------------------------------------------------------------------

/// Step 3. The mean validation loss over batches 0 .. n_batches-1 of `val` (each weighted
/// equally), computed without keeping activations or touching gradients (GPT::loss).
double evaluate(nn::GPT& model, const data::Sampler& val, int n_batches);

// ---- Step 4: throughput -------------------------------------------------------------------

/// Step 4a. Tokens processed per second: tokens / seconds (0 if seconds <= 0).
double tokens_per_second(int64_t tokens, double seconds);

/// Step 4b. Training FLOPs per token: 6 N + 12 L H Q T, with N the parameter count without the
/// position embedding (parameter_count(config) - block_size * n_embd), L layers, H heads of
/// size Q = n_embd / n_head, and T the context length of the batches.
double flops_per_token(const ModelConfig& config, int64_t T);

/// Step 4c. Model FLOPs utilisation: achieved FLOP/s over the peak, in [0, 1];
/// 0 when peak_tflops <= 0 (unknown).
double mfu(double tokens_per_s, double flops_per_token, double peak_tflops);

// ---- Step 5: memory -----------------------------------------------------------------------

/// Bytes by kind, as the lecture's formula predicts them.
struct MemoryEstimate {
  int64_t weights = 0;      ///< N parameters
  int64_t gradients = 0;    ///< one gradient per parameter
  int64_t optimizer = 0;    ///< AdamW's m and v
  int64_t activations = 0;  ///< what forward keeps for backward (see below)
  int64_t total() const { return weights + gradients + optimizer + activations; }
};

/// Step 5. The memory of training `config` on batches (B, T) in elements of `bytes_per_element`
/// bytes. N = parameter_count(config). Activations are what this library's GPT keeps between
/// forward and backward, in elements:
///   per block:  16 B T C  +  4 B T  +  B H T^2     (C = n_embd, H = n_head)
///     (ln1, q, k, v, merged heads, residual, ln2: 7 BTC; the MLP's pre- and post-GELU: 8 BTC;
///      the block's input: BTC; two LayerNorms' mean and rstd: 4 BT; attention probabilities)
///   head:  2 B T C  +  2 B T  +  B T V   (its input: the last block's output; ln_f's output,
///          mean and rstd; the softmax probabilities)
/// This is what GPT::activation_bytes() measures after a forward, to the element.
int64_t activation_elements(const ModelConfig& config, int64_t B, int64_t T);
MemoryEstimate estimate_memory(const ModelConfig& config, int64_t B, int64_t T,
                               int64_t bytes_per_element = 4);

// ---- Given: checkpoints --------------------------------------------------------------------

/// Writes the step to resume at, the parameters and AdamW's state to `path` (via path.tmp and a
/// rename, so an interrupted write never leaves a torn checkpoint).
void save_checkpoint(const std::string& path, nn::GPT& model, optim::AdamW& opt,
                     int64_t next_step);

/// Loads a checkpoint written by save_checkpoint for the same model config into model and opt;
/// returns the step to resume at. UsageError if the file is missing or was written for another
/// model.
int64_t load_checkpoint(const std::string& path, nn::GPT& model, optim::AdamW& opt);

}  // namespace scalelab::lab02
