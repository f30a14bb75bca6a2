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
  // BEGIN SOLUTION step 1: n shards of one size cover numel; lo, hi: the real elements of mine
  s.size = (numel + n - 1) / n;
  s.lo = std::min(static_cast<int64_t>(rank) * s.size, numel);
  s.hi = std::min(static_cast<int64_t>(rank) * s.size + s.size, numel);
  // END SOLUTION
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
  // BEGIN SOLUTION step 2: optimizer groups for the real elements of this rank's shard only
  return optim::groups_in_range(params, s.lo, s.hi, params.padded_values().flat(s.lo, s.real()),
                                shard_grads);
  // END SOLUTION
}

void all_gather_parameters(nn::ParameterSet& params, const nn::ShardRange& s,
                           comm::Communicator& comm) {
  trace::Scope scope("all_gather_parameters", "comm");
  // BEGIN SOLUTION step 2: every rank holds every rank's updated shard again, in one collective
  Tensor& all = params.padded_values();
  // Shard r's chunk starts at r * size in the padded layout (s.lo is clamped to numel).
  const Tensor mine = all.flat(comm.rank() * s.size, s.size).clone();  // in and out must not overlap
  comm.all_gather(mine, all);
  // Mixed precision: the gathered fp32 masters are what changed, all of them (every shard was
  // stepped by its owner), so the whole bf16 copy is recast here: one cast of the whole copy.
  // Fusing the own shard's cast into AdamW (Group::compute) would save 1/n of this cast for a
  // second code path; the cast is cheap beside the all-gather of the same elements.
  params.refresh_compute();
  // END SOLUTION
}

Zero1::Zero1(const ModelConfig& config, nn::GPTOptions options, comm::Communicator& comm,
             optim::AdamWConfig adamw)
    : Trainer(comm) {
  options.storage.pad_to = comm.size();  // n equal shards
  model_ = std::make_unique<nn::GPT>(config, options);
  nn::ParameterSet& ps = model_->params();
  // BEGIN SOLUTION step 2: this rank's shard, and an AdamW whose state covers that shard alone
  // HINT: stage 1 keeps the whole gradient buffer, ps.padded_grads().
  shard_ = shard_range(ps.numel(), comm.rank(), comm.size());
  adamw_ = std::make_unique<optim::AdamW>(
      shard_groups(ps, shard_, ps.padded_grads().flat(shard_.lo, shard_.size)), adamw);
  // END SOLUTION
}

double Zero1::forward_backward(const data::Batch& global) {
  // BEGIN SOLUTION step 2: as DDP: this rank's rows, the averaged gradient on every rank
  return lab03::forward_backward(*model_, global, comm_);
  // END SOLUTION
}

void Zero1::step(double lr) {
  // BEGIN SOLUTION step 2: update my shard; then every rank holds every updated shard
  adamw_->step(lr);
  all_gather_parameters(model_->params(), shard_, comm_);
  // END SOLUTION
}

Tensor Zero1::full_parameters() { return model_->params().values(); }

Held Zero1::held() const {
  nn::ParameterSet& ps = model_->params();
  return {flat_parameter_bytes(ps), ps.padded_grads().nbytes(), adamw_->state_bytes()};
}

// ---- step 3: ZeRO-2 -------------------------------------------------------------------------------

void reduce_unit_to_owners(nn::ParameterSet& ps, std::size_t u, const nn::ShardRange& mine,
                           Tensor& grad_shard, comm::Communicator& comm) {
  // BEGIN SOLUTION step 3: a unit whose gradients are final: each owner adds its summed piece
  const nn::Unit& unit = ps.units()[u];
  const Tensor g = ps.unit_grads(u);
  std::vector<comm::Work> works;
  for (int q = 0; q < comm.size(); ++q) {  // the owners of the unit's elements
    const nn::ShardRange owner = shard_range(ps.numel(), q, comm.size());
    const int64_t b = std::max(unit.lo, owner.lo), e = std::min(unit.hi, owner.hi);
    if (b < e) works.push_back(comm.reduce_async(g.flat(b - unit.lo, e - b), q));
  }
  // Wait before adding and releasing: a reduce reads (and on the root writes) the unit's buffer
  // while it runs. Keeping the Works and releasing later would let the reduces overlap the next
  // layers' backward (lab 04's trick) at the price of more units alive at once.
  comm::wait_all(works);
  const int64_t b = std::max(unit.lo, mine.lo), e = std::min(unit.hi, mine.hi);
  if (b < e) {  // my piece: the sum over the ranks arrived here; += over micro-batches
    Tensor dst = grad_shard.flat(b - mine.lo, e - b);
    ops::add(dst, dst, g.flat(b - unit.lo, e - b));
  }
  ps.release_grads(u);  // the full unit gradient is gone: only the shard stays
  // END SOLUTION
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
  // BEGIN SOLUTION step 3: an AdamW whose state covers this rank's shard alone
  // HINT: with per-unit gradients there is no flat gradient buffer: the policy's grad_shard().
  adamw_ = std::make_unique<optim::AdamW>(
      shard_groups(ps, policy_->shard(), policy_->grad_shard()), adamw);
  // END SOLUTION
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
  // BEGIN SOLUTION step 3: as stage 1: update my shard, every rank holds every shard
  adamw_->step(lr);
  all_gather_parameters(model_->params(), policy_->shard(), comm_);
  // END SOLUTION
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
  // BEGIN SOLUTION step 4: start gathering unit u's shards from every rank; return at once
  // HINT: ps.mixed() (--precision bf16): gather what the layers read, the 2-byte weights (the
  // HINT: paper's): a bf16 cast of the fp32 shard, kept in g.send while the gather runs.
  g.send = shard;
  if (ps.mixed()) {  // the fp32 master shard stays here; the wire carries its bf16 cast
    g.send = Tensor::empty({shard.numel()}, DType::bf16, shard.device());
    ops::cast(g.send, shard);
  }
  g.buffer = Tensor::empty({shard.numel() * comm.size()}, g.send.dtype(), g.send.device());
  g.work = comm.all_gather_async(g.send, g.buffer);
  // END SOLUTION
  return g;
}

void finish_unit_gather(nn::ParameterSet& ps, UnitGather& g) {
  // BEGIN SOLUTION step 4: the gathered unit bound in the model, ready for its layers
  // HINT: ps.mixed(): bind the unit's bf16 compute buffer (ps.bind_compute) instead of its
  // HINT: values: the layers read Parameter::compute_value(), and the fp32 values stay unbound.
  g.work.wait();
  Tensor v = ps.mixed() ? ps.bind_compute(g.unit) : ps.bind_values(g.unit);
  v.copy_from(g.buffer.flat(0, ps.units()[g.unit].numel()));
  g.buffer = g.send = Tensor();  // the padded staging buffer (and the sent cast) are done
  // END SOLUTION
}

void release_unit(nn::ParameterSet& ps, std::size_t u) {
  // BEGIN SOLUTION step 4: free a gathered unit
  // HINT: ps.mixed(): what finish_unit_gather bound is the compute buffer (ps.release_compute).
  if (ps.mixed()) ps.release_compute(u);
  else ps.release_values(u);
  // END SOLUTION
}

void reduce_scatter_unit(nn::ParameterSet& ps, std::size_t u, Tensor& grad_shard,
                         comm::Communicator& comm) {
  // BEGIN SOLUTION step 4: my shard of the unit's summed gradient added in; the unit's freed
  const Tensor g = ps.unit_grads(u);
  Tensor padded = Tensor::zeros({grad_shard.numel() * comm.size()}, g.dtype(), g.device());
  Tensor real = padded.flat(0, g.numel());
  real.copy_from(g);
  ps.release_grads(u);
  Tensor mine = Tensor::empty({grad_shard.numel()}, g.dtype(), g.device());
  comm.reduce_scatter(padded, mine);
  ops::add(grad_shard, grad_shard, mine);  // += over micro-batches
  // END SOLUTION
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
  // BEGIN SOLUTION step 4: update the shards (the next forward gathers what it needs)
  adamw_->step(lr);
  // END SOLUTION
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
  // BEGIN SOLUTION step 5: the paper's bytes per rank by kind, as in the README's first table
  const bool mixed = precision == DType::bf16;
  const double P = static_cast<double>(psi), N = n;
  const double params = mixed ? 2 : 4, grads = mixed ? 2 : 4, state = mixed ? 12 : 8;
  h.params = static_cast<std::size_t>(stage >= 3 ? params * P / N : params * P);
  h.grads = static_cast<std::size_t>(stage >= 2 ? grads * P / N : grads * P);
  h.optimizer = static_cast<std::size_t>(stage >= 1 ? state * P / N : state * P);
  // END SOLUTION
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
  // BEGIN SOLUTION step 5: the payload bytes one step of the stage shows on the byte counters
  const std::size_t unit = static_cast<std::size_t>(psi) * 4;
  if (stage == 3 && precision == DType::bf16)
    return 2 * bytes_of(psi, DType::bf16) + unit;  // all_gather x 2 in bf16 + reduce_scatter
  switch (stage) {
    case 0: return unit;      // all_reduce(grads)
    case 1: return 2 * unit;  // all_reduce(grads) + all_gather(params)
    case 2: return 2 * unit;  // reduce to owners + all_gather(params)
    default: return 3 * unit;  // all_gather x 2 + reduce_scatter
  }
  // END SOLUTION
}

}  // namespace scalelab::lab09
