// Given code of lab 12 (not an exercise): the expert-parallel GPT is nn::GPT whose MoE blocks
// hold E/ep experts each (GPTOptions::moe) with these mappings plugged into the experts' hook
// (common/nn/mappings.hpp): the rest of the model (attention, LayerNorms, the router, the loss)
// runs on each rank's own rows unchanged, like data parallelism. One copy, in both builds.
#include <cmath>
#include <numeric>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"
#include "expert_parallel.hpp"

namespace scalelab::lab12 {

void check_ep(const MoEConfig& c, int ep, int world, bool ep_given) {
  SCALELAB_REQUIRE(c.enabled(), "--model: lab 12 needs a mixture-of-experts model (tiny-moe or "
                   "small-moe)");
  SCALELAB_REQUIRE(c.top_k >= 1 && c.top_k <= c.n_expert, "--top-k {}: choose 1 to the {} "
                   "experts", c.top_k, c.n_expert);
  SCALELAB_REQUIRE(std::isfinite(c.capacity_factor) && c.capacity_factor > 0,
                   "--capacity-factor {}: must be a finite number above 0", c.capacity_factor);
  SCALELAB_REQUIRE(ep >= 1 && world % ep == 0, "--ep {}: the expert-parallel group must divide "
                   "the {} ranks", ep, world);
  // without --ep, ep is every rank: say so, and which --ep would do
  SCALELAB_REQUIRE(ep_given || c.n_expert % ep == 0, "{} ranks: the {} experts do not split "
                   "evenly over them (without --ep, ep is every rank): give --ep {} (it divides "
                   "both) or run on a number of ranks that divides {}", world, c.n_expert,
                   std::gcd(c.n_expert, static_cast<int64_t>(world)), c.n_expert);
  SCALELAB_REQUIRE(c.n_expert % ep == 0, "--ep {}: the {} experts do not split evenly over {} "
                   "ranks", ep, c.n_expert, ep);
}

namespace {

class ExpertParallel final : public nn::Mappings {
 public:
  explicit ExpertParallel(comm::Communicator& ep) : ep_(ep) {}

  Tensor experts_forward(const nn::MoE& moe, const Tensor& xd,
                         const std::vector<int64_t>& rows_per_expert,
                         std::vector<Tensor>& kept) const override {
    trace::Scope span("ep_experts_forward");  // --trace: the exchanges and the experts
    return ep_experts_forward(moe, xd, rows_per_expert, kept, ep_);
  }

  Tensor experts_backward(nn::MoE& moe, const Tensor& dye,
                          const std::vector<int64_t>& rows_per_expert,
                          const std::vector<Tensor>& kept) const override {
    trace::Scope span("ep_experts_backward");
    return ep_experts_backward(moe, dye, rows_per_expert, kept, ep_);
  }

 private:
  comm::Communicator& ep_;
};

}  // namespace

std::shared_ptr<const nn::Mappings> make_ep_mappings(comm::Communicator& ep) {
  return std::make_shared<ExpertParallel>(ep);
}

EpGroups make_ep_groups(comm::Communicator& world, int ep) {
  const int r = world.rank();
  EpGroups g;
  g.ep = world.split(r / ep, r, fmt::format("ep{}", r / ep));
  g.edp = world.split(r % ep, r, fmt::format("edp{}", r % ep));
  return g;
}

nn::GPTOptions ep_model_options(nn::GPTOptions options, const comm::Communicator& ep) {
  options.moe.ep_rank = ep.rank();
  options.moe.ep_size = ep.size();
  options.moe.groups = 1;  // the rank's own rows are its routing group
  return options;
}

double ep_forward_backward(nn::GPT& model, const Tensor& x, const Tensor& y,
                           comm::Communicator& world, EpGroups& groups) {
  const int n = world.size(), r = world.rank();
  const int64_t b = x.size(0) / n;
  SCALELAB_CHECK(x.size(0) % n == 0, "a global batch of {} rows over {} ranks", x.size(0), n);
  const Tensor xs = x.rows(r * b, (r + 1) * b).to(model.device());
  const Tensor ys = y.rows(r * b, (r + 1) * b).to(model.device());
  model.zero_grad();
  // Each rank's mean over its rows; the batch's mean is the mean of the ranks' means, its
  // gradient the sum of theirs scaled by 1/n (the balancing losses too: one group per rank).
  const Scalar local = model.forward(xs, ys);  // read once, by the caller
  model.backward(1.0 / n);
  if (groups.edp.size() == 1) {
    // ep = the world: every expert is on one rank and already has every token's gradient; the
    // rest is replicated and summed (step 4 does this in general)
    for (nn::Parameter* p : model.parameters()) {
      bool expert = false;
      for (auto& blk : model.blocks_)
        if (blk->moe)
          for (nn::Parameter* q : blk->moe->expert_parameters()) expert = expert || q == p;
      if (!expert) world.all_reduce(p->grad);
    }
  } else {
    reduce_gradients(model, world, groups.edp);
  }
  Tensor loss = Tensor::from_vector({local}, {1}, DType::f64);
  world.all_reduce(loss);
  return loss.item() / n;
}

int64_t moe_forward_flops(int64_t tokens, int64_t C, int64_t E,
                          const std::vector<int64_t>& rows_mine) {
  int64_t flops = 2 * tokens * C * E;                            // router: (N, C) x (C, E)
  for (int64_t rows : rows_mine) flops += 2 * 2 * rows * C * 4 * C;  // fc and proj, H = 4C
  return flops;
}

}  // namespace scalelab::lab12
