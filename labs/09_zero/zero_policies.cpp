// Lab 09, given: ZeRO-2 and ZeRO-3 as policies at nn::GPT's unit hooks (nn::BlockPolicy). Not an
// exercise: they call your step 1, 3 and 4 functions (shard_range, reduce_unit_to_owners,
// start_unit_gather, finish_unit_gather, release_unit, reduce_scatter_unit) at the points the
// model's own pieces name, so any driver gets ZeRO: this lab's Zero2 / Zero3 (one batch), and
// lab 10's pipeline schedules (every micro-batch's forward and backward, every chunk).
#include <algorithm>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"
#include "zero.hpp"

namespace scalelab::lab09 {

namespace {
std::size_t bytes_of(int64_t elements, DType dtype) {
  return static_cast<std::size_t>(elements) * dtype_size(dtype);
}
}  // namespace

// ---- ZeRO-2: a unit's gradient reduced to its owners as soon as its backward is done ----------

GradientRelease::GradientRelease(nn::GPT& model, comm::Communicator& comm)
    : model_(model), comm_(comm) {
  nn::ParameterSet& ps = model.params();
  SCALELAB_CHECK(ps.padded_numel() % comm.size() == 0,
                 "ZeRO-2 over {} ranks needs the model built with storage.pad_to = {}",
                 comm.size(), comm.size());
  shard_ = shard_range(ps.numel(), comm.rank(), comm.size());
  grad_shard_ = Tensor::zeros({shard_.size}, ps.dtype(), ps.device());
}

void GradientRelease::after_unit_backward(const nn::GPT& /*model*/, std::size_t unit) {
  if (std::find(held_.begin(), held_.end(), unit) != held_.end()) return;  // finish() does it
  trace::Scope scope("reduce_unit_to_owners", "comm");
  reduce_unit_to_owners(model_.params(), unit, shard_, grad_shard_, comm_);
  ++reductions_;
}

void GradientRelease::begin() {
  ops::fill(grad_shard_, 0.0);
  reductions_ = 0;
}

void GradientRelease::finish() {
  nn::ParameterSet& ps = model_.params();
  for (std::size_t u : held_)
    if (ps.grads_bound(u)) {
      reduce_unit_to_owners(ps, u, shard_, grad_shard_, comm_);
      ++reductions_;
    }
  ops::scale(grad_shard_, 1.0 / comm_.size());  // the sums over the ranks: their average
}

// ---- ZeRO-3: a unit gathered before each use, freed after, the next one prefetched ------------

nn::GPTOptions GatherRelease::prepare(nn::GPTOptions options) {
  options.storage.values = nn::Storage::per_unit;
  options.storage.grads = nn::Storage::per_unit;
  options.on_init = [this](const nn::Unit& unit, const Tensor& values) {
    keep_initial_shard(unit, values);
  };
  return options;
}

void GatherRelease::keep_initial_shard(const nn::Unit& unit, const Tensor& values) {
  const nn::ShardRange s = shard_range(unit.numel(), comm_.rank(), comm_.size());
  Tensor mine = Tensor::zeros({s.size}, values.dtype(), values.device());
  if (s.real() > 0) {
    Tensor dst = mine.flat(0, s.real());
    dst.copy_from(values.flat(s.lo, s.real()));
  }
  shards_.push_back(s);
  values_.push_back(mine);
  grads_.push_back(Tensor::zeros({s.size}, values.dtype(), values.device()));
}

void GatherRelease::attach(nn::GPT& model) {
  SCALELAB_CHECK(shards_.size() == model.params().units().size(),
                 "GatherRelease: build the model with prepare(options) (its on_init keeps the "
                 "shards), then attach it");
  model_ = &model;
}

bool GatherRelease::tied_head(std::size_t u) const {
  // The head of a model that also holds the embedding multiplies by wte: it needs that unit too.
  return model_->has_head() && model_->has_embedding() && !model_->lm_head &&
         u == model_->head_unit();
}

std::size_t GatherRelease::gathered_bytes(std::size_t u) const {
  const nn::ParameterSet& ps = model_->params();
  const int64_t n = ps.units()[u].numel();
  return (ps.values_bound(u) ? bytes_of(n, ps.dtype()) : 0) +
         (ps.mixed() && ps.compute_bound(u) ? bytes_of(n, DType::bf16) : 0);
}

void GatherRelease::prefetch(std::size_t u) {
  nn::ParameterSet& ps = model_->params();
  if (ps.compute_bound(u)) return;
  for (const UnitGather& g : in_flight_)
    if (g.unit == u) return;
  in_flight_.push_back(start_unit_gather(ps, u, values_.at(u), comm_));
  if (!model_->evaluating()) ++gathers_;  // the step's figure: an evaluation is not a step
}

void GatherRelease::gather(std::size_t u) {
  nn::ParameterSet& ps = model_->params();
  if (ps.compute_bound(u)) return;  // still gathered (the tied embedding, used twice)
  prefetch(u);  // no-op when its prefetch is in flight
  const auto it = std::find_if(in_flight_.begin(), in_flight_.end(),
                               [u](const UnitGather& g) { return g.unit == u; });
  UnitGather g = std::move(*it);
  in_flight_.erase(it);
  finish_unit_gather(ps, g);
  if (model_->evaluating()) return;  // the step's figures count training passes only
  std::size_t now = 0;
  for (std::size_t v = 0; v < ps.units().size(); ++v) now += gathered_bytes(v);
  peak_gathered_ = std::max(peak_gathered_, now);
}

void GatherRelease::release(std::size_t u) {
  if (model_->params().compute_bound(u)) release_unit(model_->params(), u);
}

// A training forward and an evaluation pass (model.evaluating(): GPT::logits / loss) alike: the
// unit gathered, the next one prefetched (the evaluation runs the same units in the same order);
// the head, last, prefetches nothing, so no gather is left in flight for a backward that an
// evaluation never runs, and after_unit_forward leaves nothing gathered.
void GatherRelease::before_unit_forward(const nn::GPT& /*model*/, std::size_t unit) {
  gather(unit);
  if (tied_head(unit)) gather(model_->embedding_unit());
  // the next unit of this model is gathered while this one computes
  if (unit + 1 < model_->params().units().size()) prefetch(unit + 1);
}

void GatherRelease::after_unit_forward(const nn::GPT& /*model*/, std::size_t unit) {
  release(unit);
  if (tied_head(unit)) release(model_->embedding_unit());
}

void GatherRelease::before_unit_backward(const nn::GPT& /*model*/, std::size_t unit) {
  const bool embedding = model_->has_embedding() && unit == model_->embedding_unit();
  if (!embedding) gather(unit);  // the embedding's backward reads the tokens, not wte
  if (tied_head(unit)) gather(model_->embedding_unit());
  const bool previous_is_embedding = model_->has_embedding() && unit == 1;
  if (unit > 0 && !embedding && !previous_is_embedding) prefetch(unit - 1);
}

void GatherRelease::after_unit_backward(const nn::GPT& /*model*/, std::size_t unit) {
  release(unit);
  if (tied_head(unit)) release(model_->embedding_unit());
  if (std::find(held_.begin(), held_.end(), unit) != held_.end()) return;  // finish() does it
  trace::Scope scope("reduce_scatter_unit", "comm");
  reduce_scatter_unit(model_->params(), unit, grads_.at(unit), comm_);
}

void GatherRelease::begin() {
  for (Tensor& g : grads_) ops::fill(g, 0.0);
  peak_gathered_ = 0;
  gathers_ = 0;
}

void GatherRelease::finish() {
  nn::ParameterSet& ps = model_->params();
  for (UnitGather& g : in_flight_) {  // a prefetch nothing used (none in the model's drivers)
    finish_unit_gather(ps, g);
    release_unit(ps, g.unit);
  }
  in_flight_.clear();
  for (std::size_t u : held_)
    if (ps.grads_bound(u)) reduce_scatter_unit(ps, u, grads_.at(u), comm_);
  for (Tensor& g : grads_) ops::scale(g, 1.0 / comm_.size());  // sums over the ranks: average
}

std::vector<optim::Group> GatherRelease::optimizer_groups() {
  nn::ParameterSet& ps = model_->params();
  std::vector<optim::Group> groups;
  for (std::size_t u = 0; u < ps.units().size(); ++u) {
    const nn::Unit& unit = ps.units()[u];
    const nn::ShardRange& s = shards_.at(u);
    for (optim::Group& g :
         optim::groups_in_range(ps, unit.lo + s.lo, unit.lo + s.hi, values_[u], grads_[u]))
      groups.push_back(std::move(g));
  }
  return groups;
}

Tensor GatherRelease::full_parameters() {
  // The fp32 master shards themselves (not start_unit_gather, which sends bf16 when mixed).
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

Held GatherRelease::held() const {
  const nn::ParameterSet& ps = model_->params();
  Held h;
  for (std::size_t u = 0; u < values_.size(); ++u) {
    h.params += values_[u].nbytes() + gathered_bytes(u);  // bound units: none between steps
    h.grads += grads_[u].nbytes() +
               (ps.grads_bound(u) ? bytes_of(ps.units()[u].numel(), ps.dtype()) : 0);
  }
  return h;
}

}  // namespace scalelab::lab09
