// Starter generated from solutions/06_activation_checkpointing/activation_checkpointing.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 2566b6575d1501b6 (lets make-labs see your edits).
// Lab 06: activation checkpointing: keep block inputs, recompute in backward, policies.
#include "activation_checkpointing.hpp"

#include <cmath>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"

namespace scalelab::lab06 {

// Policy::str() and parse_policy (given): policy_text.cpp. held_activation_bytes (given):
// held_bytes.cpp.

Scalar forward(nn::GPT& model, const data::Batch& batch, const Plan& plan, Saved& saved) {
  const int L = static_cast<int>(model.config().n_layer);
  SCALELAB_CHECK(static_cast<int>(plan.full.size()) == L &&
                     static_cast<int>(plan.selective.size()) == L,
                 "a plan for {} blocks, the model has {}", plan.full.size(), L);
  saved.plan = plan;
  nn::GPTActivations& acts = saved.acts;
  acts.reset();
  acts.inputs.assign(L, Tensor());
  acts.blocks.assign(L, nn::BlockActivations());
  Tensor x;
  {
    trace::Scope scope("embed");
    x = model.embed(batch.x, acts);  // (B, T, C)
  }
  // TODO step 1: run the blocks, keeping inputs, freeing checkpointed activations
  // HINT: model.block(i).forward(x, acts.blocks[i]) returns the block's output and fills its
  // HINT: activations; acts.blocks[i].reset() frees them.
  throw scalelab::NotImplemented(
      "lab 06 step 1: run the blocks, keeping inputs, freeing checkpointed activations (README.md#step-1)");
  trace::Scope scope("head");
  return model.head_forward(x, batch.y, acts);
}

void backward(nn::GPT& model, Saved& saved) {
  const int L = static_cast<int>(model.config().n_layer);
  nn::GPTActivations& acts = saved.acts;
  Tensor d = model.head_backward(acts);  // (B, T, C) gradient of the last block's output
  // TODO step 2: recompute each block that needs it just before its backward
  // HINT: a checkpointed block's activations are empty (acts.blocks[i].defined() is false): run
  // HINT: its forward on acts.inputs[i] again, then backward; then free its activations.
  throw scalelab::NotImplemented(
      "lab 06 step 2: recompute each block that needs it just before its backward (README.md#step-2)");
  model.embed_backward(d, acts);
  acts.reset();
}

Plan make_plan(const Policy& policy, int n_layer) {
  Plan plan{std::vector<bool>(n_layer, false), std::vector<bool>(n_layer, false)};
  // TODO step 3: which blocks are checkpointed under each policy
  throw scalelab::NotImplemented(
      "lab 06 step 3: which blocks are checkpointed under each policy (README.md#step-3)");
  return plan;
}

void drop_selective(nn::BlockActivations& a) {
  // TODO step 3: free the attention probabilities and the GELU output
  throw scalelab::NotImplemented(
      "lab 06 step 3: free the attention probabilities and the GELU output (README.md#step-3)");
}

void recompute_selective(nn::BlockActivations& a) {
  // TODO step 3: att = causal_softmax(q k^T / sqrt(hs)), g = gelu(h), as forward does
  // HINT: see CausalSelfAttention::forward and MLP::forward in common/nn: same ops, same order.
  throw scalelab::NotImplemented(
      "lab 06 step 3: att = causal_softmax(q k^T / sqrt(hs)), g = gelu(h), as forward does (README.md#step-3)");
}

double lecture_activation_bytes(double L, double s, double b, double h, double a) {
  // TODO step 4: the lecture's formula
  throw scalelab::NotImplemented(
      "lab 06 step 4: the lecture's formula (README.md#step-4)");
}

std::size_t model_activation_bytes(const ModelConfig& config, int64_t batch, int64_t seq,
                                   const Plan& plan) {
  std::size_t total = 0;
  // TODO step 4: this fp32 model's count, block by block
  // HINT: count the tensors a block's activations hold (nn::BlockActivations, common/nn/) and
  // HINT: its input, by the plan's choice for the block.
  throw scalelab::NotImplemented(
      "lab 06 step 4: this fp32 model's count, block by block (README.md#step-4)");
  return total;
}

}  // namespace scalelab::lab06
