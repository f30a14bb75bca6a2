#pragma once
/// @file expert_parallel.hpp
/// Lab 12: expert parallelism. A mixture-of-experts GPT (model tiny-moe or small-moe: every
/// other block's MLP is E experts and a router) whose experts live on different ranks: each rank
/// of an `ep` group holds E/ep of them, routes its own tokens, sends each token to the rank
/// holding its expert with an all-to-all of variable counts, and gets the outputs back the same
/// way.
///
/// The library's single-device layer is nn::MoE (common/nn/moe.hpp): read its comment for the
/// shapes, the capacity, the gates and the balancing loss; it is the twin every step is checked
/// against. You write the functions marked "step K" in expert_parallel.cpp; the ones marked
/// "Given" are in ep_model.cpp. Tests (tests/12_expert_parallel) touch only this.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"
#include "common/nn/mappings.hpp"
#include "common/nn/moe.hpp"
#include "common/tensor.hpp"

namespace scalelab::lab12 {

// ---- step 1: the router ------------------------------------------------------------------------

/// One routing of N tokens (one group: this rank's rows), what dispatch and combine read.
struct Routing {
  Tensor probs;    ///< (N, E) softmax of the router logits (the router's dtype: f32 or f64)
  Tensor values;   ///< (N, k) the k largest probabilities, largest first
  Tensor indices;  ///< (N, k) i32 their experts
  Tensor gates;    ///< (N, k) the gate weights: k = 1 the probability, k >= 2 renormalised
  /// (N*k) i32: pair n*k+j's row in the dispatched layout, -1 if dropped. ops::moe_route writes
  /// it as (N, k): make it (N, k) for moe_route, store it as .view({N * k}).
  Tensor dest;
  std::vector<int64_t> assigned;  ///< (E) pairs sent to each expert, before dropping
  std::vector<int64_t> kept;      ///< (E) pairs each expert keeps: min(assigned, capacity)
  int64_t capacity = 0;           ///< pairs an expert may take: ceil(cf N k / E), at most N k
  int64_t dropped = 0;            ///< pairs over the capacity
  double aux = 0;                 ///< the balancing loss aux_coef E sum_e f_e P_e
};

/// Routes N tokens from their router logits (N, E) (f32 or f64) as `config` says (top_k,
/// capacity_factor, aux_coef): softmax, top-k, gates, each pair's row under the capacity
/// (ops::moe_route, one group), the counts and the balancing loss.
Routing route(const Tensor& logits, const MoEConfig& config);

/// Sets dlogits (N, E) from the gates' gradient dgates (N*k): through the gates (and their
/// renormalisation) to the probabilities, plus the balancing loss's gradient times aux_scale,
/// then through the softmax.
void route_backward(Tensor& dlogits, const Tensor& dgates, const Routing& r,
                    const MoEConfig& config, double aux_scale);

// ---- step 2: dispatch and combine on one device --------------------------------------------

/// The dispatched rows (M, C), M = sum(r.kept): row r.dest[p] is token p/k's row of x (N, C),
/// for every kept pair p. Experts' rows in order (expert 0's first).
Tensor dispatch(const Tensor& x, const Routing& r);
/// dx (N, C) += the gradient of x from the dispatched rows' gradient dxd (M, C).
void dispatch_backward(Tensor& dx, const Tensor& dxd, const Routing& r);
/// y (N, C): y[n] = sum over n's kept pairs p of gates[p] * ye[dest[p]]; a token with no kept
/// pair gets 0 (the block's residual carries it). ye (M, C): the experts' outputs.
Tensor combine(const Tensor& ye, const Routing& r);
/// The backward of combine: dye (M, C) (set) and dgates (N*k) (set, the router's dtype) from dy
/// (N, C).
void combine_backward(Tensor& dye, Tensor& dgates, const Tensor& dy, const Tensor& ye,
                      const Routing& r);

// ---- step 3: expert parallelism ------------------------------------------------------------

/// Who sends whom how many rows, for one exchange over the ep group (ep ranks, E/ep experts
/// each: rank o holds experts [o E/ep, (o+1) E/ep)).
struct Exchange {
  std::vector<int64_t> send_rows;  ///< (ep) rows of my dispatched layout going to each rank
  std::vector<int64_t> recv_rows;  ///< (ep) rows coming from each rank
  /// (ep x E/ep) rows from rank s for my i-th expert, at [s * E/ep + i]
  std::vector<int64_t> from_rank;
};

/// Step 3, first exchange: rows_per_expert (E) of my dispatched layout; every rank learns how
/// many rows each rank sends for each of its experts (an all_to_all of the counts).
Exchange exchange_counts(const std::vector<int64_t>& rows_per_expert, comm::Communicator& ep);
/// My dispatched rows xd (M, C), all E experts', to the ranks holding them; returns the rows
/// of MY experts from every rank, grouped by expert (expert i's rows from rank 0, rank 1, ...;
/// then expert i+1's): (R, C), R = sum(x.recv_rows). One all_to_all with per-peer counts.
Tensor send_to_experts(const Tensor& xd, const Exchange& x, comm::Communicator& ep);
/// The way back: my experts' outputs (R, C), grouped as send_to_experts gave them -> my
/// tokens' outputs (M, C) in my dispatched layout. One all_to_all with per-peer counts.
Tensor return_from_experts(const Tensor& ye, const Exchange& x, comm::Communicator& ep);

/// The experts of an MoE block under expert parallelism (the mappings' experts_forward, see
/// nn::Mappings): exchange the counts, send the rows, run MY experts (moe.run_experts) on what
/// came, send the outputs back. `kept` keeps what ep_experts_backward needs.
Tensor ep_experts_forward(const nn::MoE& moe, const Tensor& xd,
                          const std::vector<int64_t>& rows_per_expert, std::vector<Tensor>& kept,
                          comm::Communicator& ep);
/// The backward: the outputs' gradient dye (M, C) goes to the experts (the forward's exchange
/// again), their backward runs (moe.run_experts_backward: their gradients +=) and the inputs'
/// gradient comes back. Returns dxd (M, C).
Tensor ep_experts_backward(nn::MoE& moe, const Tensor& dye,
                           const std::vector<int64_t>& rows_per_expert,
                           const std::vector<Tensor>& kept, comm::Communicator& ep);

// ---- step 4 (optional): ep beside dp ---------------------------------------------------------

/// After the backward of a step whose loss was scaled by 1/world on every rank: every gradient
/// summed over the ranks that hold the same parameter. The non-expert parameters are on every
/// rank (sum over `world`); an expert's on the ranks of `edp` (the ranks with the same ep
/// index: world / ep of them).
void reduce_gradients(nn::GPT& model, comm::Communicator& world, comm::Communicator& edp);

// ---- given (ep_model.cpp) --------------------------------------------------------------------

/// Given. Refuses (UsageError, one line, every rank) what cannot run: top-k above E or below 1,
/// E not divisible by ep, a capacity factor that is not a finite number above 0, ep not dividing
/// the world, a dense model. `ep_given`: false when ep is the default (every rank), which the
/// message then says.
void check_ep(const MoEConfig& config, int ep, int world, bool ep_given = true);

/// Given. The mappings of an expert-parallel GPT: every MoE block's experts through
/// ep_experts_forward / ep_experts_backward over `ep`.
std::shared_ptr<const nn::Mappings> make_ep_mappings(comm::Communicator& ep);

/// Given. The groups of world = (world/ep) x ep ranks, ep innermost: my ep group (same dp
/// index, consecutive ranks) and my edp group (same ep index).
struct EpGroups {
  comm::Communicator ep;   ///< the ranks exchanging tokens: experts split over them
  comm::Communicator edp;  ///< the ranks holding my experts (replicas of them)
};
EpGroups make_ep_groups(comm::Communicator& world, int ep);

/// Given. The GPTOptions of this rank's share: its experts (ep rank of ep), one routing group.
nn::GPTOptions ep_model_options(nn::GPTOptions options, const comm::Communicator& ep);

/// Given. One training step's forward and backward on this rank's rows of the global batch x, y
/// (B, T) (rank r of the world: rows [r B/world, (r+1) B/world)): returns the mean loss (the
/// language model's plus the balancing losses) over every rank, and leaves in the model the
/// gradients of it, reduced as the single device has them (reduce_gradients; when ep is the
/// world, the non-expert gradients summed over it).
double ep_forward_backward(nn::GPT& model, const Tensor& x, const Tensor& y,
                           comm::Communicator& world, EpGroups& groups);

/// Given. What one MoE forward of this rank computes in GEMMs, 2 M N K each: the router on
/// `tokens` rows (2 tokens C E) and each of MY experts on the rows it received (4 C H per row:
/// fc and proj). `rows_mine`: rows of each of my experts.
int64_t moe_forward_flops(int64_t tokens, int64_t C, int64_t E,
                          const std::vector<int64_t>& rows_mine);

}  // namespace scalelab::lab12
