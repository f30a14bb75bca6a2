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

/// Step 2a. The learning rate of `step` (from 0), nanoGPT's schedule: over the first `warmup`
/// steps it rises linearly towards max_lr (step 0 already trains: its rate is above 0), reaching
/// max_lr at step `warmup`; from there a half cosine takes it down to min_lr at step `steps`;
/// min_lr after. (The formulas: README.md#step-2, "Stuck?".)
double learning_rate(int64_t step, const TrainConfig& config);

/// Step 2b. Global-norm clipping: the norm is sqrt of the sum over ALL gradients of their squared
/// elements; when it exceeds max_norm, every gradient is multiplied by max_norm / (norm + 1e-6)
/// (PyTorch's clip_grad_norm_). Returns the norm before clipping. The norm stays on the
/// gradients' device: a train_step that clips reads no more numbers back to the host than one
/// that does not (graded; README.md#step-2).
Scalar clip_gradients(nn::GPT& model, double max_norm);

// ---- Step 3: evaluation -------------------------------------------------------------------

/// Step 3. The mean validation loss over batches 0 .. n_batches-1 of `val` (each weighted
/// equally), computed without keeping activations or touching gradients (GPT::loss).
double evaluate(nn::GPT& model, const data::Sampler& val, int n_batches);

// ---- Step 4: throughput -------------------------------------------------------------------

/// Step 4a. Tokens processed per second: tokens / seconds (0 if seconds <= 0).
double tokens_per_second(int64_t tokens, double seconds);

/// Step 4b. Training FLOPs per token at context T: the multiply-adds of one token's forward and
/// backward through every matmul of the model (every parameter but the position embedding, a
/// lookup), plus attention's two products over the T positions of the context, which no
/// parameter accounts for (PaLM's estimate, nanoGPT's estimate_mfu; README.md#step-4). The dense
/// count: with mixture-of-experts blocks it counts every expert, not the top_k a token runs
/// through (common/metrics.hpp's flops_per_token counts those; the program says which it prints).
double flops_per_token(const ModelConfig& config, int64_t T);

/// Step 4c. Model FLOPs utilisation: achieved FLOP/s over the peak, a ratio (not clamped: it can
/// exceed 1 when the peak given or measured is below what the device really does); 0 when
/// peak_tflops <= 0 (unknown).
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

/// Step 5. The memory of training `config` on batches (B, T), every number (weights, gradients,
/// AdamW's two moments, activations) `bytes_per_element` bytes wide. N = parameter_count(config).
/// activation_elements: the elements this library's (dense) GPT keeps between forward and
/// backward: per block, its input, the LayerNorms' outputs and statistics, q, k, v, the merged
/// heads, the residual, the MLP before and after GELU, the attention probabilities; in the head,
/// its input, ln_f's output and statistics and the softmax probabilities. Exactly what
/// GPT::activation_bytes() measures after a forward (README.md#step-5). Mixture-of-experts blocks
/// keep more (the router's and the experts' tensors): the formula counts dense blocks.
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
