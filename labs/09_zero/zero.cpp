// Starter generated from solutions/09_zero/zero.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash c8f1e98c3248c411 (lets make-labs see your edits).
// Lab 09: ZeRO stages 1-3: shards, a sharded AdamW, gradients reduced to their owners, parameters
// gathered unit by unit.
#include "zero.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"
#include "common/train/global_loss.hpp"
#include "ddp.hpp"

namespace scalelab::lab09 {

namespace {

data::Batch my_rows(const data::Batch& global, comm::Communicator& comm, Device device) {
  return lab03::local_batch(global, comm.rank(), comm.size()).to(device);
}

std::size_t bytes_of(int64_t elements, DType dtype) {
  return static_cast<std::size_t>(elements) * dtype_size(dtype);
}

// The flat values a rank keeps (padded) and, in mixed precision, their bf16 compute copy: both
// live between steps, so both are "parameters" in the held table (stages 0-2).
std::size_t flat_parameter_bytes(nn::ParameterSet& ps) {
  return ps.padded_values().nbytes() +
         (ps.compute_values().defined() ? ps.compute_values().nbytes() : 0);
}

}  // namespace

nn::ShardRange shard_range(int64_t numel, int rank, int n) {
  SCALELAB_REQUIRE(n >= 1, "the number of shards must be at least 1, got {}", n);
  SCALELAB_REQUIRE(rank >= 0 && rank < n, "shard {} does not exist: there are {} (0..{})", rank,
                   n, n - 1);
  SCALELAB_REQUIRE(numel >= 0, "a layout of {} elements: the size must not be negative", numel);
  nn::ShardRange s;
  // TODO step 1: n shards of one size cover numel; lo, hi: the real elements of mine
  throw scalelab::NotImplemented(
      "lab 09 step 1: n shards of one size cover numel; lo, hi: the real elements of mine (README.md#step-1)");
  return s;
}

// ---- stage 0: lab 03's DDP (given) -------------------------------------------------------------

Ddp::Ddp(const ModelConfig& config, nn::GPTOptions options, comm::Communicator& comm,
         optim::AdamWConfig adamw)
    : Trainer(comm) {
  model_ = std::make_unique<nn::GPT>(config, options);
  adamw_ = std::make_unique<optim::AdamW>(optim::groups(model_->parameters()), adamw);
}

double Ddp::forward_backward(const data::Batch& global) {
  return lab03::forward_backward(*model_, global, comm_);
}

void Ddp::step(double lr) { adamw_->step(lr); }

Tensor Ddp::full_parameters() { return model_->params().values(); }

Held Ddp::held() const {
  nn::ParameterSet& ps = model_->params();
  return {flat_parameter_bytes(ps), ps.padded_grads().nbytes(), adamw_->state_bytes()};
}

// ---- step 2: ZeRO-1 -------------------------------------------------------------------------------

std::vector<optim::Group> shard_groups(nn::ParameterSet& params, const nn::ShardRange& s,
                                       const Tensor& shard_grads) {
  // TODO step 2: optimizer groups for the real elements of this rank's shard only
  throw scalelab::NotImplemented(
      "lab 09 step 2: optimizer groups for the real elements of this rank's shard only (README.md#step-2)");
}

void all_gather_parameters(nn::ParameterSet& params, const nn::ShardRange& s,
                           comm::Communicator& comm) {
  trace::Scope scope("all_gather_parameters", "comm");
  // TODO step 2: every rank holds every rank's updated shard again, in one collective
  throw scalelab::NotImplemented(
      "lab 09 step 2: every rank holds every rank's updated shard again, in one collective (README.md#step-2)");
}

Zero1::Zero1(const ModelConfig& config, nn::GPTOptions options, comm::Communicator& comm,
             optim::AdamWConfig adamw)
    : Trainer(comm) {
  options.storage.pad_to = comm.size();  // n equal shards
  model_ = std::make_unique<nn::GPT>(config, options);
  nn::ParameterSet& ps = model_->params();
  // TODO step 2: this rank's shard, and an AdamW whose state covers that shard alone
  // HINT: stage 1 keeps the whole gradient buffer, ps.padded_grads().
  throw scalelab::NotImplemented(
      "lab 09 step 2: this rank's shard, and an AdamW whose state covers that shard alone (README.md#step-2)");
}

double Zero1::forward_backward(const data::Batch& global) {
  // TODO step 2: as DDP: this rank's rows, the averaged gradient on every rank
  throw scalelab::NotImplemented(
      "lab 09 step 2: as DDP: this rank's rows, the averaged gradient on every rank (README.md#step-2)");
}

void Zero1::step(double lr) {
  // TODO step 2: update my shard; then every rank holds every updated shard
  throw scalelab::NotImplemented(
      "lab 09 step 2: update my shard; then every rank holds every updated shard (README.md#step-2)");
}

Tensor Zero1::full_parameters() { return model_->params().values(); }

Held Zero1::held() const {
  nn::ParameterSet& ps = model_->params();
  return {flat_parameter_bytes(ps), ps.padded_grads().nbytes(), adamw_->state_bytes()};
}

// ---- step 3: ZeRO-2 -------------------------------------------------------------------------------

void reduce_unit_to_owners(nn::ParameterSet& ps, std::size_t u, const nn::ShardRange& mine,
                           Tensor& grad_shard, comm::Communicator& comm) {
  // TODO step 3: a unit whose gradients are final: each owner adds its summed piece
  throw scalelab::NotImplemented(
      "lab 09 step 3: a unit whose gradients are final: each owner adds its summed piece (README.md#step-3)");
}

Zero2::Zero2(const ModelConfig& config, nn::GPTOptions options, comm::Communicator& comm,
             optim::AdamWConfig adamw, const ModelBuilder& build)
    : Trainer(comm) {
  options.storage.pad_to = comm.size();
  options.storage.grads = nn::Storage::per_unit;  // GPT binds a unit's gradients when needed
  model_ = make_model(config, options, build);
  // the policy: this rank's shard, its gradient buffer, reduce_unit_to_owners after each unit
  policy_ = std::make_shared<GradientRelease>(*model_, comm);
  model_->add_block_policy(policy_);
  nn::ParameterSet& ps = model_->params();
  // TODO step 3: an AdamW whose state covers this rank's shard alone
  // HINT: with per-unit gradients there is no flat gradient buffer: the policy's grad_shard().
  throw scalelab::NotImplemented(
      "lab 09 step 3: an AdamW whose state covers this rank's shard alone (README.md#step-3)");
}

double Zero2::forward_backward(const data::Batch& global) {
  const data::Batch mine = my_rows(global, comm_, model_->device());
  policy_->begin();
  const Scalar loss = model_->forward(mine.x, mine.y);
  model_->backward();  // the policy reduces each unit as its backward ends
  policy_->finish();   // the average: 1/n
  return train::global_loss(loss, comm_);
}

void Zero2::step(double lr) {
  // TODO step 3: as stage 1: update my shard, every rank holds every shard
  throw scalelab::NotImplemented(
      "lab 09 step 3: as stage 1: update my shard, every rank holds every shard (README.md#step-3)");
}

Tensor Zero2::full_parameters() { return model_->params().values(); }

Held Zero2::held() const {
  nn::ParameterSet& ps = model_->params();
  std::size_t grads = policy_->grad_shard().defined() ? policy_->grad_shard().nbytes() : 0;
  for (std::size_t u = 0; u < ps.units().size(); ++u)
    if (ps.grads_bound(u)) grads += bytes_of(ps.units()[u].numel(), ps.dtype());
  return {flat_parameter_bytes(ps), grads, adamw_ ? adamw_->state_bytes() : 0};
}

// ---- step 4: ZeRO-3 -------------------------------------------------------------------------------

UnitGather start_unit_gather(const nn::ParameterSet& ps, std::size_t u, const Tensor& shard,
                             comm::Communicator& comm) {
  UnitGather g{u};
  // TODO step 4: start gathering unit u's shards from every rank; return at once
  // HINT: ps.mixed() (--precision bf16): gather what the layers read, the 2-byte weights (the
  // HINT: paper's): a bf16 cast of the fp32 shard, kept in g.send while the gather runs.
  throw scalelab::NotImplemented(
      "lab 09 step 4: start gathering unit u's shards from every rank; return at once (README.md#step-4)");
  return g;
}

void finish_unit_gather(nn::ParameterSet& ps, UnitGather& g) {
  // TODO step 4: the gathered unit bound in the model, ready for its layers
  // HINT: ps.mixed(): bind the unit's bf16 compute buffer (ps.bind_compute) instead of its
  // HINT: values: the layers read Parameter::compute_value(), and the fp32 values stay unbound.
  throw scalelab::NotImplemented(
      "lab 09 step 4: the gathered unit bound in the model, ready for its layers (README.md#step-4)");
}

void release_unit(nn::ParameterSet& ps, std::size_t u) {
  // TODO step 4: free a gathered unit
  // HINT: ps.mixed(): what finish_unit_gather bound is the compute buffer (ps.release_compute).
  throw scalelab::NotImplemented(
      "lab 09 step 4: free a gathered unit (README.md#step-4)");
}

void reduce_scatter_unit(nn::ParameterSet& ps, std::size_t u, Tensor& grad_shard,
                         comm::Communicator& comm) {
  // TODO step 4: my shard of the unit's summed gradient added in; the unit's freed
  throw scalelab::NotImplemented(
      "lab 09 step 4: my shard of the unit's summed gradient added in; the unit's freed (README.md#step-4)");
}

Zero3::Zero3(const ModelConfig& config, nn::GPTOptions options, comm::Communicator& comm,
             optim::AdamWConfig adamw, const ModelBuilder& build)
    : Trainer(comm) {
  // Mixed precision (compute_dtype bf16): the same per-unit storage; a gathered unit is bound as
  // its bf16 compute buffer (ParameterSet::bind_compute), never as fp32 values.
  policy_ = std::make_shared<GatherRelease>(comm);
  model_ = make_model(config, policy_->prepare(options), build);
  policy_->attach(*model_);
  model_->add_block_policy(policy_);
  adamw_ = std::make_unique<optim::AdamW>(policy_->optimizer_groups(), adamw);
}

bool Zero3::mixed() const { return model_->params().mixed(); }

double Zero3::forward_backward(const data::Batch& global) {
  const data::Batch mine = my_rows(global, comm_, model_->device());
  policy_->begin();
  nn::GPTActivations acts;
  const Scalar loss = model_->forward(mine.x, mine.y, acts);  // each unit gathered, freed
  model_->backward(acts);  // gathered again, freed, its gradient reduce-scattered
  policy_->finish();
  return train::global_loss(loss, comm_);
}

void Zero3::step(double lr) {
  // TODO step 4: update the shards (the next forward gathers what it needs)
  throw scalelab::NotImplemented(
      "lab 09 step 4: update the shards (the next forward gathers what it needs) (README.md#step-4)");
}

Tensor Zero3::full_parameters() { return policy_->full_parameters(); }

Held Zero3::held() const {
  Held h = policy_->held();
  h.optimizer = adamw_ ? adamw_->state_bytes() : 0;
  return h;
}

// ---- the factory (given) ----------------------------------------------------------------------------

std::unique_ptr<Trainer> make_trainer(int stage, const ModelConfig& config,
                                      nn::GPTOptions options, comm::Communicator& comm,
                                      optim::AdamWConfig adamw) {
  switch (stage) {
    case 0: return std::make_unique<Ddp>(config, options, comm, adamw);
    case 1: return std::make_unique<Zero1>(config, options, comm, adamw);
    case 2: return std::make_unique<Zero2>(config, options, comm, adamw);
    case 3: return std::make_unique<Zero3>(config, options, comm, adamw);
    default: break;
  }
  throw UsageError(fmt::format("unknown ZeRO stage {} (0: DDP, 1, 2 or 3)", stage));
}

// ---- step 5: the paper's formulas ---------------------------------------------------------------------

Held paper_memory(int stage, int64_t psi, int n, DType precision) {
  SCALELAB_REQUIRE(stage >= 0 && stage <= 3, "unknown ZeRO stage {}", stage);
  SCALELAB_REQUIRE(n >= 1 && psi >= 0, "paper_memory of {} parameters over {} ranks", psi, n);
  SCALELAB_REQUIRE(precision == DType::f32 || precision == DType::bf16,
                   "paper_memory: precision f32 or bf16, got {}", dtype_name(precision));
  Held h;
  // TODO step 5: the paper's bytes per rank by kind, as in the README's first table
  throw scalelab::NotImplemented(
      "lab 09 step 5: the paper's bytes per rank by kind, as in the README's first table (README.md#step-5)");
  return h;
}

Held layout_memory(int stage, int64_t psi, int n, DType precision) {
  // fp32: the paper's formula mapped to fp32 IS our layout. bf16: the fp32 master, gradients
  // and m, v are kept (and sharded) as in fp32; at stages 0-2 the bf16 compute copy comes on
  // top, whole; stage 3 gathers its bf16 units during a step only and keeps none between steps.
  Held h = paper_memory(stage, psi, n);
  if (precision == DType::bf16 && stage <= 2) h.params += bytes_of(psi, DType::bf16);
  return h;
}

std::size_t paper_comm_bytes(int stage, int64_t psi, DType precision) {
  SCALELAB_REQUIRE(stage >= 0 && stage <= 3, "unknown ZeRO stage {}", stage);
  SCALELAB_REQUIRE(precision == DType::f32 || precision == DType::bf16,
                   "paper_comm_bytes: precision f32 or bf16, got {}", dtype_name(precision));
  // TODO step 5: the payload bytes one step of the stage shows on the byte counters
  throw scalelab::NotImplemented(
      "lab 09 step 5: the payload bytes one step of the stage shows on the byte counters (README.md#step-5)");
}

}  // namespace scalelab::lab09
