#pragma once
// GPT (nanoGPT / GPT-2 shape): token + position embedding, n_layer Blocks, a final LayerNorm and a
// LM head tied to the token embedding, trained with cross-entropy.
//
// Built for the later labs (design.md "common/"):
//  - parameters and gradients are views into one flat buffer each (params().values()/grads()),
//    in a stable order: wte, wpe, blocks.0..., ln_f (and lm_head.weight if untied);
//  - set_backward_hook() is called as each layer's gradients become final (DDP overlap);
//  - every block's activations are its own allocations (block(i).free_activations(), then
//    block(i).forward(block_input(i)) recomputes them: activation checkpointing);
//  - a GPT can hold blocks [first_block, last_block) only (a pipeline stage): the embedding lives
//    on the stage with block 0, the head on the stage with the last block;
//  - tp_size > 1 keeps a 1/tp share of every block's heads and MLP (tensor parallel; see
//    attention.hpp for what the caller must reduce).
//
//   nn::GPT model(model_config("tiny"), {.device = Device::cpu(), .seed = 1});
//   double loss = model.forward(tokens, targets);   // tokens, targets (B, T) i32
//   model.zero_grad(); ... model.backward();         // grads in model.params().grads()
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/model_config.hpp"
#include "common/nn/block.hpp"
#include "common/nn/embedding.hpp"
#include "common/nn/layernorm.hpp"

namespace scalelab::nn {

struct GPTOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  uint64_t seed = 1337;
  int first_block = 0;
  int last_block = -1;  // -1: n_layer
  int tp_rank = 0, tp_size = 1;
};

/// What the head saves for backward.
struct HeadActivations {
  Tensor x;                        // (B, T, C) input of ln_f (the last block's output)
  Tensor lnf, lnf_mean, lnf_rstd;  // (B, T, C), (B*T), (B*T)
  Tensor probs;                    // (B*T, V) softmax of the logits
  Tensor targets;                  // (B, T) i32
  void reset() { *this = HeadActivations{}; }
};

class GPT {
 public:
  explicit GPT(const ModelConfig& config, const GPTOptions& options = {});
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const ModelConfig& config() const { return config_; }
  const GPTOptions& options() const { return options_; }
  Device device() const { return options_.device; }
  bool has_embedding() const { return first_ == 0; }
  bool has_head() const { return last_ == config_.n_layer; }
  int first_block() const { return first_; }
  int last_block() const { return last_; }

  ParameterSet& params() { return params_; }
  const std::vector<Parameter*>& parameters() const { return params_.list(); }
  int64_t num_parameters() const { return params_.numel(); }
  void zero_grad() { params_.zero_grad(); }
  void set_backward_hook(BackwardHook hook) { hook_ = std::move(hook); }

  // ---- the whole model (a GPT holding every block) ----
  /// Mean cross-entropy of predicting targets (B, T) from tokens (B, T); keeps activations.
  double forward(const Tensor& tokens, const Tensor& targets);
  /// Gradients of loss_scale * (the mean loss of the last forward), accumulated (+=).
  void backward(double loss_scale = 1.0);

  // ---- the pieces (pipeline stages, checkpointing, tensor parallel drivers) ----
  /// (B, T, C) embeddings of tokens (B, T). Needs has_embedding().
  Tensor embed(const Tensor& tokens);
  /// Runs blocks [first, last) on x (B, T, C), keeping each block's input; returns the output.
  Tensor forward_blocks(const Tensor& x);
  /// ln_f, logits, loss: the mean cross-entropy. Needs has_head().
  double head_forward(const Tensor& x, const Tensor& targets);
  /// Returns the gradient w.r.t. the head's input x (B, T, C) of loss_scale * mean loss.
  Tensor head_backward(double loss_scale = 1.0);
  /// Back through blocks [first, last) from the gradient of their output; returns the gradient
  /// w.r.t. their input.
  Tensor backward_blocks(const Tensor& dout);
  /// Accumulates wte/wpe gradients from the gradient of the embeddings (B, T, C).
  void embed_backward(const Tensor& dx);

  /// Logits (B, T, V) of tokens (B, T), keeping no activations (generation, evaluation).
  Tensor logits(const Tensor& tokens);
  /// Mean loss of tokens -> targets without keeping activations (evaluation).
  double loss(const Tensor& tokens, const Tensor& targets);

  /// Block by global index (first_block() <= i < last_block()).
  Block& block(int i) { return *blocks_.at(i - first_); }
  /// The input of block i saved by forward_blocks.
  const Tensor& block_input(int i) const { return block_inputs_.at(i - first_); }
  /// Releases every saved activation (blocks, block inputs, head, tokens).
  void free_activations();
  /// Bytes of activations held right now: each block's own, each block's input, and the head's
  /// (its input, ln_f's output and statistics, the probabilities).
  std::size_t activation_bytes() const;

  std::optional<Embedding> embedding;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::optional<LayerNorm> ln_f;
  std::optional<Parameter> lm_head;  // only on a head stage without the embedding (untied copy)

 private:
  const Tensor& head_weight() const;
  Tensor& head_grad();
  void fire(const std::vector<Parameter*>& done) {
    if (hook_) hook_(done);
  }

  ModelConfig config_;
  GPTOptions options_;
  int first_ = 0, last_ = 0;
  ParameterSet params_;
  BackwardHook hook_;
  Tensor tokens_;                     // saved by embed()
  std::vector<Tensor> block_inputs_;  // saved by forward_blocks()
  HeadActivations head_;
};

/// Generates `n` tokens after `prompt` by sampling from softmax(logits / temperature) with a
/// seeded generator (temperature 0: greedy). The model needs both ends (embedding and head).
std::vector<int32_t> generate(GPT& model, std::vector<int32_t> prompt, int n,
                              double temperature, uint64_t seed);

}  // namespace scalelab::nn
