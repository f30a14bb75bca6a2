#pragma once
/// @file activation_checkpointing.hpp
/// Lab 06 contract: activation checkpointing (recomputation). Forward keeps only the INPUT of a
/// checkpointed block and frees the rest of its activations; backward runs that block's forward
/// again from the saved input just before the block's backward. Memory for compute: about one
/// extra forward per step, and the gradients do not change at all (bitwise, on the CPU).
///
/// A forward's activations live in an nn::GPTActivations the caller owns (acts.inputs[i] and
/// acts.blocks[i] for block i): each tensor is its own allocation, counted by the allocator, so
/// every memory figure here is measured. Freeing a block's activations is acts.blocks[i].reset().
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/data/sampler.hpp"
#include "common/nn/gpt.hpp"

namespace scalelab::lab06 {

/// What to recompute.
///   none       keep everything (no recomputation)
///   every      checkpoint every block (keep only block inputs)
///   every:K    checkpoint blocks 0, K, 2K, ... (the others keep their activations)
///   selective  keep every block, but drop and recompute the two cheap, big pieces: the
///              attention probabilities (B*NH, T, T) and the GELU output (B, T, 4C)
struct Policy {
  enum Kind { none, every, every_kth, selective } kind = none;
  int k = 1;  // for every_kth
  /// Given (policy_text.cpp). "none", "every", "every:2", "selective"
  std::string str() const;
};

/// Given (policy_text.cpp). Parses the forms above; scalelab::UsageError for anything else (K
/// must be a positive integer; whether K fits the model is checked by make_plan).
Policy parse_policy(const std::string& text);

/// Per block (index 0 .. n_layer-1): recompute the whole block, or only its selective pieces.
struct Plan {
  std::vector<bool> full;       // checkpoint the block: keep only its input
  std::vector<bool> selective;  // keep the block but drop attention probabilities and GELU out
};

/// What a checkpointed forward leaves for backward.
struct Saved {
  Plan plan;
  /// acts.inputs[i]: the input of block i (B, T, C); acts.blocks[i]: what block i saved (empty,
  /// !defined(), when it is checkpointed); acts.tokens and acts.head: the embedding's and head's.
  nn::GPTActivations acts;
};

// ---- Step 1: forward -------------------------------------------------------------------------

/// Step 1. The whole model's forward under `plan` (plan.full and plan.selective have one entry
/// per block): embed, then for each block i save its input in saved.acts.inputs[i], run it into
/// saved.acts.blocks[i], and free those activations if plan.full[i] (reset()) or drop their
/// selective pieces if plan.selective[i] (drop_selective, step 3); then the head. Returns the
/// mean loss, bitwise the loss of model.forward(tokens, targets), on the model's device (a
/// Scalar: reading it is a copy to the host, left to the step line that prints it).
Scalar forward(nn::GPT& model, const data::Batch& batch, const Plan& plan, Saved& saved);

// ---- Step 2: backward ------------------------------------------------------------------------

/// Step 2. The whole model's backward after forward(): the head, then blocks from last to first:
/// a block without activations is first recomputed from saved.acts.inputs[i] (its output is
/// thrown away; it fills saved.acts.blocks[i] again), a block with dropped selective pieces gets
/// them back (recompute_selective), then block.backward(dout, input, activations); after its
/// backward a block's activations are used up: free them (any plan; so memory falls as backward
/// proceeds, and a recomputed block never holds its activations past its own backward). Then the
/// embedding. Gradients accumulate (+=) as GPT::backward's do, and are bitwise those of
/// model.forward + model.backward.
void backward(nn::GPT& model, Saved& saved);

// ---- Step 3: policies ------------------------------------------------------------------------

/// Step 3a. The plan of `policy` for `n_layer` blocks (see Policy). scalelab::UsageError (one
/// line) when every:K has K < 1 or K > n_layer (a checkpoint interval larger than the model).
Plan make_plan(const Policy& policy, int n_layer);

/// Step 3b. Frees a block's attention probabilities (acts.attn.att) and GELU output
/// (acts.mlp.g), keeping everything else.
void drop_selective(nn::BlockActivations& acts);

/// Step 3b. Recomputes exactly what drop_selective freed, from what the block kept (q and k; the
/// GELU input h), with the same ops as the block's forward so the values are bitwise the same.
void recompute_selective(nn::BlockActivations& acts);

// ---- Step 4: the estimate --------------------------------------------------------------------

/// Step 4a. The lecture's activation memory of a transformer in 16-bit precision with dropout
/// (Korthikanti et al. 2022, no recomputation), in bytes:
///   m_act = L * s * b * h * (34 + 5 * a * s / h)
/// L layers, s sequence length, b batch, h hidden size, a heads.
double lecture_activation_bytes(double L, double s, double b, double h, double a);

/// Step 4b. The same count for THIS model (fp32, no dropout) under `plan`: the bytes the blocks
/// hold after forward(), inputs included (the head and embedding are not counted), block by
/// block: what a block that keeps everything holds (nn::BlockActivations), what a checkpointed
/// one and a selective one hold instead (README.md, step 4).
std::size_t model_activation_bytes(const ModelConfig& config, int64_t batch, int64_t seq,
                                   const Plan& plan);

/// Given (held_bytes.cpp). The bytes the blocks hold right now: every block's activations plus
/// its input (the head's and the embedding's are not counted).
std::size_t held_activation_bytes(const Saved& saved);

}  // namespace scalelab::lab06
