// Lab 10, given: a plan's step and optimizer. Zero1Optimizer (ZeRO-1 over dp, from lab 09's
// shard_groups and all_gather_parameters), check_runnable (which ZeRO stages, schedules and
// checkpointing the 3D step runs together) and Trainer3D (one rank's model, built by your
// build_3d_model, with the step and optimizer of the plan's ZeRO stage: your step_3d for ZeRO 0
// and 1, lab 09's trainers for 2 and 3). Not an exercise: read it to see where your step 2 and
// step 3 are called when the program trains and when the planner's plans are checked.
#include "3d_parallel.hpp"

#include "common/errors.hpp"
#include "zero.hpp"  // lab 09: shard_groups, all_gather_parameters

namespace scalelab::lab10 {

// ---- given: ZeRO-1 over dp ------------------------------------------------------------------------

Zero1Optimizer::Zero1Optimizer(nn::GPT& model, comm::Communicator& dp, optim::AdamWConfig adamw)
    : model_(model), dp_(dp) {
  nn::ParameterSet& ps = model.params();
  SCALELAB_CHECK(ps.padded_numel() % dp.size() == 0,
                 "ZeRO-1 over dp {} needs the model built with storage.pad_to = {}", dp.size(),
                 dp.size());
  shard_ = nn::shard_range(ps.numel(), dp.rank(), dp.size());
  adamw_ = std::make_unique<optim::AdamW>(
      lab09::shard_groups(ps, shard_, ps.padded_grads().flat(shard_.lo, shard_.size)), adamw);
}

void Zero1Optimizer::step(double lr) {
  adamw_->step(lr);
  lab09::all_gather_parameters(model_.params(), shard_, dp_);
}

// ---- given: a plan's step and optimizer ------------------------------------------------------------

void check_runnable(const Plan& p) {
  SCALELAB_REQUIRE(p.zero_stage >= 0 && p.zero_stage <= 3, "--zero must be 0, 1, 2 or 3, got {}",
                   p.zero_stage);
  if (p.zero_stage >= 2) {
    SCALELAB_REQUIRE(p.grid.pp == 1, "ZeRO-{} needs pp = 1 (got pp {}): with a pipeline every "
                     "micro-batch would reduce (ZeRO-2) or gather (ZeRO-3) every unit; use ZeRO-1",
                     p.zero_stage, p.grid.pp);
    SCALELAB_REQUIRE(p.micro_batches == 1, "ZeRO-{} runs one micro-batch per replica (got {}): "
                     "lab 09's trainers do not accumulate", p.zero_stage, p.micro_batches);
  }
  SCALELAB_REQUIRE(!(p.zero_stage == 3 && p.checkpoint), "ZeRO-3 with checkpointing is not "
                   "run: lab 09's ZeRO-3 drives the blocks itself and does not recompute");
}

Trainer3D::Trainer3D(const ModelConfig& config, Groups& g, const Plan& plan,
                     nn::GPTOptions options, optim::AdamWConfig adamw)
    : g_(g), plan_(plan) {
  check_runnable(plan);
  SCALELAB_CHECK(plan.grid.dp == g.shape.dp && plan.grid.tp == g.shape.tp &&
                 plan.grid.pp == g.shape.pp, "a plan for another grid than the groups'");
  if (plan.zero_stage <= 1) {
    if (plan.zero_stage == 1) options.storage.pad_to = g.shape.dp;  // dp equal shards
    own_ = build_3d_model(config, g, options, plan.checkpoint);
    model_ = own_.get();
    if (plan.zero_stage == 1)
      zero1_ = std::make_unique<Zero1Optimizer>(*own_, g.dp, adamw);
    else
      adamw_ = std::make_unique<optim::AdamW>(optim::groups(own_->parameters()), adamw);
    return;
  }
  // lab 09's trainers build the model with the storage they need, through our builder
  const lab09::ModelBuilder build = [&config, &g, ckpt = plan.checkpoint](
                                        const nn::GPTOptions& o) {
    return build_3d_model(config, g, o, ckpt);
  };
  if (plan.zero_stage == 2)
    zero_ = std::make_unique<lab09::Zero2>(config, options, g.dp, adamw, build);
  else
    zero_ = std::make_unique<lab09::Zero3>(config, options, g.dp, adamw, build);
  model_ = &zero_->model();
}

Trainer3D::~Trainer3D() = default;

double Trainer3D::step(const data::Batch& global, lab08::ExecStats* stats) {
  if (!zero_) return step_3d(*model_, g_, global, plan_.micro_batches, stats);
  if (stats != nullptr) *stats = lab08::ExecStats{};
  return zero_->forward_backward(global);  // pp = 1, m = 1: no schedule to time
}

void Trainer3D::optimizer_step(double lr) {
  if (zero1_) zero1_->step(lr);
  else if (adamw_) adamw_->step(lr);
  else zero_->step(lr);
}

std::size_t Trainer3D::optimizer_state_bytes() const {
  if (zero1_) return zero1_->state_bytes();
  if (adamw_) return adamw_->state_bytes();
  return plan_.zero_stage == 2 ? static_cast<lab09::Zero2&>(*zero_).optimizer().state_bytes()
                               : static_cast<lab09::Zero3&>(*zero_).optimizer().state_bytes();
}

Tensor Trainer3D::parameters() {
  return zero_ ? zero_->full_parameters() : model_->params().values();
}

}  // namespace scalelab::lab10
