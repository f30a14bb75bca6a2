#include "grid3d_checks.hpp"

#include <fmt/format.h>

#include "common/ops/ops.hpp"

namespace scalelab::lab10test {

ModelConfig config() {
  ModelConfig c = kLab.config();
  c.n_head = 4;  // head size 8: tp = 4 keeps one head per rank
  return c;
}

std::vector<lab10::GridShape> grids_for(int world) {
  // One grid per world size in picotron's order too: the step must not depend on the layout.
  constexpr auto pico = lab10::GridOrder::picotron;
  if (world == 8) return {{2, 2, 2}, {1, 2, 4}, {2, 4, 1}, {4, 1, 2}, {2, 2, 2, pico}};
  if (world == 4) return {{1, 2, 2}, {2, 1, 2}, {2, 2, 1}, {2, 1, 2, pico}};
  if (world == 2) return {{1, 1, 2}, {2, 1, 1}, {1, 2, 1}};
  return {{1, 1, 1}};
}

std::string name(const lab10::GridShape& s) {
  return fmt::format("dp {} x tp {} x pp {} ({})", s.dp, s.tp, s.pp, comm::grid_order_name(s.order));
}

std::unique_ptr<nn::GPT> reference_model(const data::Batch& batch, const nn::GPTOptions& options) {
  auto ref = std::make_unique<nn::GPT>(config(), options);
  ref->zero_grad();
  ref->forward(batch.x, batch.y);
  ref->backward();
  return ref;
}

namespace {

// The part of `full` (a whole parameter's values or gradients) that `shard` keeps, flattened.
void append_shard(std::vector<double>& out, const Tensor& full, const nn::Shard& shard) {
  const std::vector<double> v = full.to_vector();
  if (shard.whole()) {
    out.insert(out.end(), v.begin(), v.end());
    return;
  }
  const int64_t cols = full.dim() == 2 ? full.size(1) : 1;
  const int64_t rows = full.size(0);
  if (shard.dim == 0) {  // rows [a, b) of each range, in order
    for (const auto& [a, b] : shard.ranges)
      out.insert(out.end(), v.begin() + a * cols, v.begin() + b * cols);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)  // columns: each row keeps its ranges' columns
    for (const auto& [a, b] : shard.ranges)
      out.insert(out.end(), v.begin() + r * cols + a, v.begin() + r * cols + b);
}

}  // namespace

Tensor expected(const nn::GPT& local, nn::GPT& reference, bool grads) {
  std::vector<double> out;
  for (const nn::Parameter* p : local.parameters()) {
    const nn::Parameter& full =
        reference.params().get(p->name == "lm_head.weight" ? "wte.weight" : p->name);
    append_shard(out, grads ? full.grad : full.value, p->shard);
  }
  return Tensor::from_vector(out, {static_cast<int64_t>(out.size())}, DType::f64);
}

nn::GPTOptions own_options(const lab10::Groups& g, const nn::GPTOptions& base) {
  const ModelConfig c = config();
  const lab08::LayerRange r = lab08::stage_layers(static_cast<int>(c.n_layer), g.shape.pp,
                                                  g.coord.pp);
  const lab07::VocabRange v = lab07::vocab_range(c.vocab_size, g.coord.tp, g.shape.tp);
  nn::GPTOptions o = base;
  o.first_block = r.first;
  o.last_block = r.last;
  o.tp_rank = g.coord.tp;
  o.tp_size = g.shape.tp;
  o.vocab_lo = v.lo;
  o.vocab_hi = v.hi;
  return o;
}

std::unique_ptr<nn::GPT> own_model(lab10::Groups& g, int64_t pad_to, bool checkpoint,
                                   const nn::GPTOptions& base) {
  nn::GPTOptions o = own_options(g, base);
  o.storage.pad_to = pad_to;
  return own_stage(config(), o, g.tp, checkpoint);
}

std::unique_ptr<nn::GPT> own_stage(const ModelConfig& c, const nn::GPTOptions& options,
                                   comm::Communicator& tp, bool checkpoint) {
  auto model = std::make_unique<nn::GPT>(c, options);
  model->set_mappings(std::make_shared<lab07::TensorParallel>(tp));
  if (checkpoint) model->set_block_policy(std::make_shared<lab10::FullCheckpoint>());
  return model;
}

std::unique_ptr<nn::GPT> own_builder(const ModelConfig& c, lab10::Groups& g,
                                     nn::GPTOptions options, bool checkpoint) {
  SCALELAB_CHECK(c.n_layer == config().n_layer && c.vocab_size == config().vocab_size,
                 "own_builder builds the graders' config() only");
  return own_stage(c, own_options(g, options), g.tp, checkpoint);
}

int64_t all_reduce_bytes(const comm::CommStats& before, const std::string& group) {
  return comm::comm_total(comm::comm_stats() - before, group, "all_reduce").bytes;
}

int64_t tp_bytes(const nn::GPT& model, int64_t rows, bool checkpoint) {
  const ModelConfig c = config();
  const DType dt = model.compute_dtype();
  const int64_t elem = static_cast<int64_t>(dtype_size(dt));
  const int64_t stat = static_cast<int64_t>(dtype_size(ops::stats_dtype(dt)));
  const int64_t act = rows * c.block_size * c.n_embd * elem;  // one (rows, T, C) activation
  const int64_t blocks = model.last_block() - model.first_block();
  int64_t n = blocks * (checkpoint ? 6 : 4) * act;
  if (model.has_embedding()) n += act;
  if (model.has_head()) n += act + 3 * rows * c.block_size * stat;
  return n;
}

}  // namespace scalelab::lab10test
