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
  // BEGIN SOLUTION step 1: run the blocks, keeping inputs, freeing checkpointed activations
  // HINT: model.block(i).forward(x, acts.blocks[i]) returns the block's output and fills its
  // HINT: activations; acts.blocks[i].reset() frees them.
  for (int i = 0; i < L; ++i) {
    trace::Scope scope("block forward");
    acts.inputs[i] = x;
    x = model.block(i).forward(x, acts.blocks[i]);
    if (plan.full[i]) acts.blocks[i].reset();  // keep only the input
    else if (plan.selective[i]) drop_selective(acts.blocks[i]);
  }
  // END SOLUTION
  trace::Scope scope("head");
  return model.head_forward(x, batch.y, acts);
}

void backward(nn::GPT& model, Saved& saved) {
  const int L = static_cast<int>(model.config().n_layer);
  nn::GPTActivations& acts = saved.acts;
  Tensor d = model.head_backward(acts);  // (B, T, C) gradient of the last block's output
  // BEGIN SOLUTION step 2: recompute each block that needs it just before its backward
  // HINT: a checkpointed block's activations are empty (acts.blocks[i].defined() is false): run
  // HINT: its forward on acts.inputs[i] again, then backward; then free its activations.
  for (int i = L - 1; i >= 0; --i) {
    nn::Block& block = model.block(i);
    nn::BlockActivations& a = acts.blocks[i];
    if (!a.defined()) {
      trace::Scope scope("recompute");
      block.forward(acts.inputs[i], a);  // the output is not needed: only the activations
    } else if (saved.plan.selective[i]) {
      trace::Scope scope("recompute selective");
      recompute_selective(a);
    }
    trace::Scope scope("block backward");
    d = block.backward(d, acts.inputs[i], a);
    a.reset();  // used up, whatever the plan
    acts.inputs[i] = Tensor();
  }
  // END SOLUTION
  model.embed_backward(d, acts);
  acts.reset();
}

Plan make_plan(const Policy& policy, int n_layer) {
  Plan plan{std::vector<bool>(n_layer, false), std::vector<bool>(n_layer, false)};
  // BEGIN SOLUTION step 3: which blocks are checkpointed under each policy
  switch (policy.kind) {
    case Policy::none: break;
    case Policy::every:
      plan.full.assign(n_layer, true);
      break;
    case Policy::every_kth:
      SCALELAB_REQUIRE(policy.k >= 1 && policy.k <= n_layer,
                       "checkpoint interval {} is outside 1..{} (the model has {} layers)",
                       policy.k, n_layer, n_layer);
      for (int i = 0; i < n_layer; i += policy.k) plan.full[i] = true;
      break;
    case Policy::selective:
      plan.selective.assign(n_layer, true);
      break;
  }
  // END SOLUTION
  return plan;
}

void drop_selective(nn::BlockActivations& a) {
  // BEGIN SOLUTION step 3: free the attention probabilities and the GELU output
  a.attn.att = Tensor();
  a.mlp.g = Tensor();
  // END SOLUTION
}

void recompute_selective(nn::BlockActivations& a) {
  // BEGIN SOLUTION step 3: att = causal_softmax(q k^T / sqrt(hs)), g = gelu(h), as forward does
  // HINT: see CausalSelfAttention::forward and MLP::forward in common/nn: same ops, same order.
  const int64_t B = a.attn.q.size(0), NH = a.attn.q.size(1), T = a.attn.q.size(2),
                hs = a.attn.q.size(3);
  const DType dt = a.attn.q.dtype();
  const Device dev = a.attn.q.device();
  Tensor preatt = Tensor::empty({B * NH, T, T}, dt, dev);  // (BH, T, T)
  ops::batched_matmul(preatt, a.attn.q.view({B * NH, T, hs}), a.attn.k.view({B * NH, T, hs}),
                      false, true);
  a.attn.att = Tensor::empty({B * NH, T, T}, dt, dev);
  ops::causal_softmax_forward(a.attn.att, preatt, 1.0 / std::sqrt(static_cast<double>(hs)));
  a.mlp.g = Tensor::empty(a.mlp.h.shape(), dt, dev);  // (B, T, 4C)
  ops::gelu_forward(a.mlp.g, a.mlp.h);
  // END SOLUTION
}

double lecture_activation_bytes(double L, double s, double b, double h, double a) {
  // BEGIN SOLUTION step 4: the lecture's formula
  return L * s * b * h * (34.0 + 5.0 * a * s / h);
  // END SOLUTION
}

std::size_t model_activation_bytes(const ModelConfig& config, int64_t batch, int64_t seq,
                                   const Plan& plan) {
  std::size_t total = 0;
  // BEGIN SOLUTION step 4: this fp32 model's count, block by block
  // HINT: count the tensors a block's activations hold (nn::BlockActivations, common/nn/) and
  // HINT: its input, by the plan's choice for the block.
  const std::size_t sbh = static_cast<std::size_t>(seq * batch * config.n_embd);
  const std::size_t sb = static_cast<std::size_t>(seq * batch);
  const std::size_t att = static_cast<std::size_t>(config.n_head * seq * seq * batch) * 4;
  for (std::size_t i = 0; i < plan.full.size(); ++i) {
    if (plan.full[i]) {
      total += sbh * 4;  // the input only
    } else {
      std::size_t block = sbh * 64 + att + sb * 16;
      if (plan.selective[i]) block -= att + sbh * 4 * 4;  // no probabilities, no GELU output
      total += block;
    }
  }
  // END SOLUTION
  return total;
}

}  // namespace scalelab::lab06
