#pragma once
/// @file model_config.hpp
/// Named GPT configurations. All are byte-level (vocab 256).
///   tiny     the tests: 2 layers, 2 heads, 32 wide, context 16 (~34k parameters)
///   small    the CPU demo: 4 layers, 4 heads, 128 wide, context 64 (~0.8M parameters)
///   gpt-85m  the workshop's GPU run: 12 layers, 12 heads, 768 wide, context 1024 (~86M)
///   tiny-moe, small-moe   the same with a mixture of experts in every other block (blocks 1, 3,
///            ...): 4 experts (tiny) or 8 (small), each as large as the dense MLP, top-2 routing,
///            capacity factor 1.25, balancing-loss coefficient 0.01 (lab 12)
#include <cstdint>
#include <string>
#include <vector>

namespace scalelab {

/// The mixture of experts of a model's MoE blocks (Switch Transformer, GShard): E experts, each
/// an MLP of the dense block's size; a router sends each token to its top-k experts, an expert
/// takes at most capacity = ceil(capacity_factor * tokens * k / E) of a group's tokens (never more
/// than the group's tokens * k pairs), and the
/// balancing loss aux_coef * E * sum_e f_e P_e joins the language-model loss.
struct MoEConfig {
  int64_t n_expert = 0;          ///< E; 0: a dense model (no MoE block)
  int64_t top_k = 1;             ///< k: the experts each token goes to (1 or 2)
  int64_t every = 2;             ///< block i is an MoE block when i % every == every - 1
  double capacity_factor = 1.25; ///< an expert's capacity relative to an even share
  double aux_coef = 0.01;        ///< the balancing loss's coefficient
  /// True when the model has MoE blocks.
  bool enabled() const { return n_expert > 0; }
};

/// The shape of a GPT: what every lab's model, formula and planner is computed from.
struct ModelConfig {
  std::string name;          ///< "tiny", "small", "gpt-85m"
  int64_t vocab_size = 256;  ///< V: token ids (bytes here)
  int64_t block_size = 0;    ///< T at most: the longest context (positions in wpe)
  int64_t n_layer = 0;       ///< L: transformer blocks
  int64_t n_head = 0;        ///< NH: attention heads per block
  int64_t n_embd = 0;        ///< C: the width of the residual stream
  MoEConfig moe = {};        ///< the mixture of experts of its MoE blocks (none by default)
};

/// The config named `name`; throws UsageError naming the known ones otherwise.
ModelConfig model_config(const std::string& name);

/// "tiny, small, gpt-85m"
std::vector<std::string> model_config_names();

/// Number of parameters of the full model (tied LM head counted once; every expert of an MoE
/// model, and its routers).
int64_t parameter_count(const ModelConfig& c);

}  // namespace scalelab
