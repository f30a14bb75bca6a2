#pragma once
/// @file moe.hpp
/// A mixture-of-experts layer (Switch Transformer, GShard; Megatron-core's MoELayer), the MLP of
/// an MoE block (GPTOptions::moe, ModelConfig::moe), explicit forward and backward:
///
///   x (N, C) ─ router ─ softmax ─ top-k ─ gates        (fp32: the router's logits x W_r^T)
///            └ dispatch: each kept (token, choice) pair becomes a row of its expert's block
///              ─ experts (Mappings::experts_forward: each an MLP on its rows)
///              ─ combine: y[n] = sum over n's kept pairs of gate x its expert's row
///
/// Routing (ops::moe_route): the N rows form `groups` equal groups (the ranks' rows under expert
/// parallelism; GShard's groups); in a group every expert takes at most
/// capacity = min(ceil(capacity_factor * (N / groups) * k / E), (N / groups) * k) pairs, first
/// choices first (a capacity above the group's pairs would change nothing). A dropped
/// pair gets no row, and a token whose every choice is dropped gets y = 0: the block's residual
/// carries it through unchanged. Gates: k = 1, the chosen probability itself (Switch); k >= 2,
/// the chosen probabilities renormalised over the k (Mixtral, DeepSeek).
///
/// The balancing loss (Switch, eq. 4; per group, then averaged over the groups):
/// aux = aux_coef * E * sum_e f_e P_e, f_e = the share of the group's N_g k pairs routed to e
/// (before dropping), P_e = the mean over the group's tokens of the router probability of e. Its
/// gradient reaches the router through P (f counts, it has none): d aux / d p[n, e] = aux_coef *
/// E * f_e / (N_g * groups).
///
/// The dispatched layout (what an expert sees): rows of expert 0, then expert 1, ...; within an
/// expert, group 0's rows, then group 1's, each in arrival order. Under expert parallelism
/// (lab 12) the mappings' experts_forward sends each block of rows to the rank holding its
/// expert; on one device it runs every expert here.
#include <cstdint>
#include <string>
#include <vector>

#include "common/model_config.hpp"
#include "common/nn/parameter.hpp"
#include "common/scalar.hpp"

namespace scalelab::nn {

class Mappings;

/// Which blocks are MoE blocks and which experts a model holds (GPTOptions::moe).
struct MoEOptions {
  /// The routing; n_expert 0 (the default): the model config's (ModelConfig::moe).
  MoEConfig config = {};
  /// The MoE blocks (global indices); empty: every `config.every`-th (i % every == every - 1).
  std::vector<int> blocks = {};
  /// Routing groups of a forward's rows (capacity and the balancing loss are per group): 1, or
  /// the number of ranks whose rows a single-device twin stands for.
  int64_t groups = 1;
  /// This model's experts are [ep_rank E/ep_size, (ep_rank + 1) E/ep_size) (expert parallel).
  int ep_rank = 0;
  int ep_size = 1;  ///< the expert-parallel group's size (E divisible by it)
};

/// What an MoE forward saves for its backward (llm.c style: the caller owns it).
struct MoEActivations {
  Tensor x;         ///< (N, C) the layer's input rows (the dispatch and the router read them)
  Tensor xr;        ///< (N, C) the router's input in the router dtype (x itself unless bf16)
  Tensor probs;     ///< (N, E) the router's softmax (router dtype)
  Tensor values;    ///< (N, k) the chosen probabilities
  Tensor indices;   ///< (N, k) i32 the chosen experts, best first
  Tensor gates;     ///< (N, k) the gate weights (values renormalised when k >= 2)
  Tensor dest;      ///< (N*k) i32 each pair's dispatched row, -1 if dropped
  Tensor pairs;     ///< (N*k) i32 each pair's token: n for pair n*k + j
  Tensor ye;        ///< (M, C) the experts' outputs in the dispatched layout
  std::vector<Tensor> kept;              ///< what Mappings::experts_forward keeps
  std::vector<int64_t> assigned;         ///< (groups x E, group-major) pairs before dropping
  std::vector<int64_t> kept_counts;      ///< (groups x E) pairs kept
  std::vector<int64_t> rows_per_expert;  ///< (E) rows of each expert in the dispatched layout
  int64_t capacity = 0;  ///< per group and expert
  int64_t dropped = 0;   ///< pairs dropped (over the capacity)
  /// The balancing loss, coefficient included, on the layer's device (a host read waits for
  /// the queue: it is read with the loss it joins, when someone prints that).
  Scalar aux;
  /// Frees everything.
  void reset() { *this = MoEActivations{}; }
  /// Bytes of the tensors held (the memory tables).
  std::size_t nbytes() const;
};

/// The expert capacity of a group of `tokens` tokens: ceil(capacity_factor * tokens * k / E), at
/// most the group's tokens * k pairs (so any finite factor gives a capacity, 1e300 too).
int64_t expert_capacity(int64_t tokens, const MoEConfig& config);

/// The mixture-of-experts sub-layer of an MoE block: the router and this model's experts.
class MoE {
 public:
  /// Parameters `name`.router.weight (E, C) and the experts' `name`.fc.weight (E, 4C, C),
  /// .fc.bias (E, 4C), .proj.weight (E, C, 4C), .proj.bias (E, C), of which this model keeps
  /// experts [ep_rank E/ep, (ep_rank+1) E/ep) (drawn whole and cut, like every shard).
  MoE(const std::string& name, int64_t n_embd, int64_t n_layer, const MoEOptions& options);

  /// out (N, C) from x (N, C) (or (B, T, C)); fills `acts`. `m` runs the experts.
  void forward(Tensor& out, const Tensor& x, MoEActivations& acts, const Mappings& m) const;
  /// dx += the gradient of x from dout (N, C); the router's and the experts' gradients +=;
  /// `aux_scale` scales the balancing loss's gradient (the loss scale of the backward).
  void backward(Tensor& dx, const Tensor& dout, const MoEActivations& acts, const Mappings& m,
                double aux_scale);

  /// Runs this model's experts on `x` (M, C): rows_per_local[i] consecutive rows for its i-th
  /// expert (global expert first_expert() + i). Returns the outputs (M, C); appends to `kept`
  /// what run_experts_backward needs. What Mappings::experts_forward calls.
  Tensor run_experts(const Tensor& x, const std::vector<int64_t>& rows_per_local,
                     std::vector<Tensor>& kept) const;
  /// The backward of run_experts: returns dx (M, C) from dy (M, C); the experts' gradients +=.
  /// `kept` as run_experts filled it, from `first` on.
  Tensor run_experts_backward(const Tensor& dy, const std::vector<int64_t>& rows_per_local,
                              const std::vector<Tensor>& kept, std::size_t first = 0);

  /// The routing.
  const MoEConfig& config() const { return options_.config; }
  /// Routing groups of a forward's rows.
  int64_t groups() const { return options_.groups; }
  /// E, over every rank.
  int64_t n_expert() const { return options_.config.n_expert; }
  /// The experts this model holds: E / ep_size.
  int64_t local_experts() const { return n_expert() / options_.ep_size; }
  /// The global index of its first expert.
  int64_t first_expert() const { return options_.ep_rank * local_experts(); }
  /// router, then the experts' fc.weight, fc.bias, proj.weight, proj.bias.
  std::vector<Parameter*> parameters();
  /// The experts' parameters only (reduced over the ranks holding the same experts).
  std::vector<Parameter*> expert_parameters();

  Parameter router;       ///< (E, C), no bias; read in the router dtype (fp32 master values)
  Parameter fc_weight;    ///< (E_local, 4C, C)
  Parameter fc_bias;      ///< (E_local, 4C)
  Parameter proj_weight;  ///< (E_local, C, 4C)
  Parameter proj_bias;    ///< (E_local, C)

 private:
  MoEOptions options_;
  int64_t hidden_ = 0;
};

}  // namespace scalelab::nn
