// Lab 09: ZeRO stages 1-3: shards, a sharded AdamW, gradients reduced to their owners, parameters
// gathered unit by unit.
#include "zero.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"
#include "ddp.hpp"

namespace scalelab::lab09 {

namespace {

// The loss of the whole global batch: the average of the ranks' means (equal row counts).
double global_loss(double local, comm::Communicator& comm) {
  Tensor l = Tensor::from_vector({local}, {1}, DType::f64);
  comm.all_reduce(l, comm::ReduceOp::sum);
  return l.item() / comm.size();
}

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
  SCALELAB_REQUIRE(numel >= 0, "a layout of {} elements", numel);
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
  // HINT: optim::groups_in_range(params, lo, hi, values, grads): values and grads start at lo.
  return optim::groups_in_range(params, s.lo, s.hi, params.padded_values().flat(s.lo, s.real()),
                                shard_grads);
  // END SOLUTION
}

void all_gather_parameters(nn::ParameterSet& params, const nn::ShardRange& s,
                           comm::Communicator& comm) {
  trace::Scope scope("all_gather_parameters", "comm");
  // BEGIN SOLUTION step 2: every rank holds every rank's updated shard again, in one collective
  // HINT: mixed precision (--precision bf16): the layers compute with params.compute_values(), a
  // HINT: bf16 copy of the values, which must equal cast(values) again (params.refresh_compute()).
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

Zero2::Zero2(const ModelConfig& config, nn::GPTOptions options, comm::Communicator& comm,
             optim::AdamWConfig adamw, const ModelBuilder& build)
    : Trainer(comm) {
  options.storage.pad_to = comm.size();
  options.storage.grads = nn::Storage::per_unit;  // GPT binds a unit's gradients when needed
  model_ = make_model(config, options, build);
  nn::ParameterSet& ps = model_->params();
  // BEGIN SOLUTION step 3: this rank's shard, a gradient buffer for it alone, AdamW over it
  // HINT: with per-unit gradients there is no flat gradient buffer to take a view of.
  shard_ = shard_range(ps.numel(), comm.rank(), comm.size());
  grad_shard_ = Tensor::zeros({shard_.size}, ps.dtype(), ps.device());
  adamw_ = std::make_unique<optim::AdamW>(shard_groups(ps, shard_, grad_shard_), adamw);
  // END SOLUTION
}

void Zero2::on_ready(const std::vector<nn::Parameter*>& done) {
  nn::ParameterSet& ps = model_->params();
  // BEGIN SOLUTION step 3: a unit whose gradients are final: each owner gets its summed piece
  // HINT: ps.unit_of(p), ps.units()[u] (its parameters [first, last), its elements [lo, hi)),
  // HINT: ps.unit_grads(u), ps.release_grads(u).
  for (const nn::Parameter* p : done) {
    const std::size_t u = ps.unit_of(p);
    const nn::Unit& unit = ps.units()[u];
    if (++ready_[u] < unit.last - unit.first) continue;  // the unit is not final yet
    const Tensor g = ps.unit_grads(u);
    std::vector<comm::Work> works;
    for (int q = 0; q < comm_.size(); ++q) {  // the owners of the unit's elements
      const nn::ShardRange owner = shard_range(ps.numel(), q, comm_.size());
      const int64_t b = std::max(unit.lo, owner.lo), e = std::min(unit.hi, owner.hi);
      if (b < e) works.push_back(comm_.reduce_async(g.flat(b - unit.lo, e - b), q));
    }
    // Wait before copying and releasing: a reduce reads (and on the root writes) the unit's
    // buffer while it runs. Keeping the Works and releasing later would let the reduces overlap
    // the next layers' backward (lab 04's trick) at the price of more units alive at once.
    comm::wait_all(works);
    const int64_t b = std::max(unit.lo, shard_.lo), e = std::min(unit.hi, shard_.hi);
    if (b < e) {  // my piece: the sum over the ranks arrived here
      Tensor dst = grad_shard_.flat(b - shard_.lo, e - b);
      dst.copy_from(g.flat(b - unit.lo, e - b));
    }
    ps.release_grads(u);  // the full unit gradient is gone: only the shard stays
  }
  // END SOLUTION
}

double Zero2::forward_backward(const data::Batch& global) {
  const data::Batch mine = my_rows(global, comm_, model_->device());
  model_->set_backward_hook([this](const std::vector<nn::Parameter*>& done) { on_ready(done); });
  double loss = 0;
  // BEGIN SOLUTION step 3: the averaged gradient of my shard, from forward and backward
  ready_.clear();
  ops::fill(grad_shard_, 0.0);
  loss = model_->forward(mine.x, mine.y);
  model_->backward();
  ops::scale(grad_shard_, 1.0 / comm_.size());
  // END SOLUTION
  model_->set_backward_hook({});
  return global_loss(loss, comm_);
}

void Zero2::step(double lr) {
  // BEGIN SOLUTION step 3: as stage 1: update my shard, every rank holds every shard
  adamw_->step(lr);
  all_gather_parameters(model_->params(), shard_, comm_);
  // END SOLUTION
}

Tensor Zero2::full_parameters() { return model_->params().values(); }

Held Zero2::held() const {
  nn::ParameterSet& ps = model_->params();
  std::size_t grads = grad_shard_.defined() ? grad_shard_.nbytes() : 0;
  for (std::size_t u = 0; u < ps.units().size(); ++u)
    if (ps.grads_bound(u)) grads += bytes_of(ps.units()[u].numel(), ps.dtype());
  return {flat_parameter_bytes(ps), grads, adamw_ ? adamw_->state_bytes() : 0};
}

// ---- step 4: ZeRO-3 -------------------------------------------------------------------------------

Zero3::Zero3(const ModelConfig& config, nn::GPTOptions options, comm::Communicator& comm,
             optim::AdamWConfig adamw, const ModelBuilder& build)
    : Trainer(comm) {
  // Mixed precision (compute_dtype bf16): the same per-unit storage; a gathered unit is bound as
  // its bf16 compute buffer (ParameterSet::bind_compute), never as fp32 values.
  options.storage.values = nn::Storage::per_unit;
  options.storage.grads = nn::Storage::per_unit;
  options.on_init = [this](const nn::Unit& unit, const Tensor& values) {
    keep_initial_shard(unit, values);
  };
  model_ = make_model(config, options, build);
  nn::ParameterSet& ps = model_->params();
  // BEGIN SOLUTION step 4: per unit a gradient shard; one AdamW over every unit's shard
  // HINT: keep_initial_shard has filled shards_ and values_ by now (GPTOptions::on_init).
  std::vector<optim::Group> groups;
  for (std::size_t u = 0; u < ps.units().size(); ++u) {
    const nn::Unit& unit = ps.units()[u];
    const nn::ShardRange& s = shards_.at(u);
    grads_.push_back(Tensor::zeros({s.size}, ps.dtype(), ps.device()));
    for (optim::Group& g :
         optim::groups_in_range(ps, unit.lo + s.lo, unit.lo + s.hi, values_[u], grads_[u]))
      groups.push_back(std::move(g));
  }
  adamw_ = std::make_unique<optim::AdamW>(std::move(groups), adamw);
  // END SOLUTION
}

void Zero3::keep_initial_shard(const nn::Unit& unit, const Tensor& values) {
  // BEGIN SOLUTION step 4: keep this rank's shard of the unit's initial values
  const nn::ShardRange s = shard_range(unit.numel(), comm_.rank(), comm_.size());
  Tensor mine = Tensor::zeros({s.size}, values.dtype(), values.device());
  if (s.real() > 0) {
    Tensor dst = mine.flat(0, s.real());
    dst.copy_from(values.flat(s.lo, s.real()));
  }
  shards_.push_back(s);
  values_.push_back(mine);
  // END SOLUTION
}

bool Zero3::mixed() const { return model_->params().mixed(); }

Zero3::Gather Zero3::start_gather(std::size_t u) {
  Gather g{u};
  // BEGIN SOLUTION step 4: start gathering unit u's shards from every rank; return at once
  // HINT: mixed() (--precision bf16): gather what the layers read, the 2-byte weights (the
  // HINT: paper's): a bf16 cast of the fp32 shard, kept in g.send while the gather runs.
  const nn::ShardRange& s = shards_.at(u);
  g.send = values_[u];
  if (mixed()) {  // the fp32 master shard stays here; the wire carries its bf16 cast
    g.send = Tensor::empty({s.size}, DType::bf16, values_[u].device());
    ops::cast(g.send, values_[u]);
  }
  g.buffer = Tensor::empty({s.size * comm_.size()}, g.send.dtype(), g.send.device());
  g.work = comm_.all_gather_async(g.send, g.buffer);
  // END SOLUTION
  return g;
}

void Zero3::finish_gather(Gather& g) {
  nn::ParameterSet& ps = model_->params();
  // BEGIN SOLUTION step 4: the gathered unit bound in the model, ready for its layers
  // HINT: mixed(): bind the unit's bf16 compute buffer (ps.bind_compute) instead of its values:
  // HINT: the layers read Parameter::compute_value(), and the fp32 values stay unbound.
  g.work.wait();
  Tensor v = mixed() ? ps.bind_compute(g.unit) : ps.bind_values(g.unit);
  v.copy_from(g.buffer.flat(0, ps.units()[g.unit].numel()));
  g.buffer = g.send = Tensor();  // the padded staging buffer (and the sent cast) are done
  // END SOLUTION
  note_gathered();
}

void Zero3::release(std::size_t u) {
  // BEGIN SOLUTION step 4: free a gathered unit
  // HINT: mixed(): what finish_gather bound is the compute buffer (ps.release_compute).
  if (mixed()) model_->params().release_compute(u);
  else model_->params().release_values(u);
  // END SOLUTION
}

void Zero3::reduce_scatter_grads(std::size_t u) {
  nn::ParameterSet& ps = model_->params();
  // BEGIN SOLUTION step 4: my shard of the unit's averaged gradient; the unit's gradients freed
  const nn::ShardRange& s = shards_.at(u);
  const Tensor g = ps.unit_grads(u);
  Tensor padded = Tensor::zeros({s.size * comm_.size()}, g.dtype(), g.device());
  Tensor real = padded.flat(0, g.numel());
  real.copy_from(g);
  ps.release_grads(u);
  comm_.reduce_scatter(padded, grads_[u]);
  ops::scale(grads_[u], 1.0 / comm_.size());
  // END SOLUTION
}

std::size_t Zero3::gathered_bytes(std::size_t u) const {
  const nn::ParameterSet& ps = model_->params();
  const int64_t n = ps.units()[u].numel();
  return (ps.values_bound(u) ? bytes_of(n, ps.dtype()) : 0) +
         (mixed() && ps.compute_bound(u) ? bytes_of(n, DType::bf16) : 0);
}

void Zero3::note_gathered() {
  std::size_t now = 0;
  for (std::size_t u = 0; u < model_->params().units().size(); ++u) now += gathered_bytes(u);
  peak_gathered_ = std::max(peak_gathered_, now);
}

double Zero3::forward_backward(const data::Batch& global) {
  nn::GPT& m = *model_;
  const data::Batch mine = my_rows(global, comm_, m.device());
  const int L = static_cast<int>(m.config().n_layer);
  const std::size_t emb = m.embedding_unit(), head = m.head_unit();
  peak_gathered_ = 0;
  nn::GPTActivations acts;
  double loss = 0;
  // BEGIN SOLUTION step 4: unit by unit: gathered before use, freed after; the next one prefetched
  // HINT: the model piece by piece, and the order of the units: README.md#step-4.
  acts.inputs.assign(L, Tensor());
  acts.blocks.assign(L, nn::BlockActivations());
  Gather g = start_gather(emb);
  finish_gather(g);
  Gather next = start_gather(m.block_unit(0));  // in flight while the embedding runs
  Tensor x;
  {
    trace::Scope scope("embed");
    x = m.embed(mine.x, acts);  // (B, T, C)
  }
  release(emb);
  for (int i = 0; i < L; ++i) {
    Gather cur = std::move(next);
    finish_gather(cur);
    next = start_gather(i + 1 < L ? m.block_unit(i + 1) : head);  // prefetch
    trace::Scope scope("block forward");
    acts.inputs[i] = x;
    x = m.block(i).forward(x, acts.blocks[i]);
    release(m.block_unit(i));
  }
  finish_gather(next);  // the head
  Gather tied = start_gather(emb);  // the head's matmul uses wte
  finish_gather(tied);
  loss = m.head_forward(x, mine.y, acts);
  // backward: the head and the embedding are still gathered
  next = start_gather(m.block_unit(L - 1));
  Tensor d = m.head_backward(acts);  // writes ln_f's and the tied wte's gradients
  release(head);
  release(emb);  // embed_backward needs the tokens, not wte's values
  reduce_scatter_grads(head);
  for (int i = L - 1; i >= 0; --i) {
    const std::size_t u = m.block_unit(i);
    Gather cur = std::move(next);
    finish_gather(cur);
    if (i > 0) next = start_gather(m.block_unit(i - 1));
    m.params().bind_grads(u);  // zeroed
    {
      trace::Scope scope("block backward");
      d = m.block(i).backward(d, acts.inputs[i], acts.blocks[i]);
    }
    acts.blocks[i].reset();
    acts.inputs[i] = Tensor();
    release(u);
    reduce_scatter_grads(u);
  }
  m.embed_backward(d, acts);  // wte's gradient is final only now
  reduce_scatter_grads(emb);
  // END SOLUTION
  return global_loss(loss, comm_);
}

void Zero3::step(double lr) {
  // BEGIN SOLUTION step 4: update the shards (the next forward gathers what it needs)
  adamw_->step(lr);
  // END SOLUTION
}

Tensor Zero3::full_parameters() {
  // The fp32 master shards themselves (not start_gather, which sends bf16 in mixed precision).
  nn::ParameterSet& ps = model_->params();
  Tensor all = Tensor::empty({ps.numel()}, ps.dtype(), ps.device());
  for (std::size_t u = 0; u < ps.units().size(); ++u) {
    Tensor buffer = Tensor::empty({shards_.at(u).size * comm_.size()}, ps.dtype(), ps.device());
    comm_.all_gather(values_[u], buffer);
    Tensor dst = all.flat(ps.units()[u].lo, ps.units()[u].numel());
    dst.copy_from(buffer.flat(0, ps.units()[u].numel()));
  }
  return all;
}

Held Zero3::held() const {
  nn::ParameterSet& ps = model_->params();
  Held h;
  for (std::size_t u = 0; u < values_.size(); ++u) {
    h.params += values_[u].nbytes() + gathered_bytes(u);  // bound units: none between steps
    h.grads += (u < grads_.size() ? grads_[u].nbytes() : 0) +
               (ps.grads_bound(u) ? bytes_of(ps.units()[u].numel(), ps.dtype()) : 0);
  }
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
