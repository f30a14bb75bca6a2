#include "common/train/divergence.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace scalelab::train {

namespace {

// Keys: forward entries by (micro-batch, layer, tensor), the head as layer n_layer; gradients
// after every forward entry, by the unit's place in backward and the parameter's from its end.
constexpr int64_t kPerLayer = 32;
constexpr int64_t kBackward = int64_t{1} << 40;
constexpr double kNone = 1e300;  // "no divergence on this rank" in the min all-reduce
constexpr int kNameChars = 96, kDims = 8;

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

std::vector<int64_t> iota(int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (int64_t i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

// The heads whose rows of part `part` (0 q, 1 k, 2 v) of the fused (3C, C) qkv weight the block
// holds, in the order it holds them.
std::vector<int64_t> heads_of(const nn::Block& b, int part) {
  const nn::Parameter& w = b.attn.qkv.weight;
  const int64_t C = w.full_shape.at(1), hs = b.attn.head_size();
  if (w.shard.whole()) return iota(0, C / hs);
  std::vector<int64_t> heads;
  for (auto [lo, hi] : w.shard.ranges)
    for (int64_t r = std::max(lo, part * C); r < std::min(hi, (part + 1) * C); ++r)
      if ((r - part * C) % hs == 0) heads.push_back((r - part * C) / hs);
  return heads;
}

// The columns of (..., C) that the heads' outputs fill.
std::vector<int64_t> head_columns(const std::vector<int64_t>& heads, int64_t hs) {
  std::vector<int64_t> cols;
  for (int64_t h : heads)
    for (int64_t c = 0; c < hs; ++c) cols.push_back(h * hs + c);
  return cols;
}

// The rows (dim 0) or columns of a weight a Shard keeps, or all `n` of them.
std::vector<int64_t> shard_indices(const nn::Shard& s, int64_t n) {
  if (s.whole()) return iota(0, n);
  std::vector<int64_t> v;
  for (auto [lo, hi] : s.ranges)
    for (int64_t i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

// What each forward tensor is called in a report.
std::string describe(const std::string& name, int layer) {
  const auto ends = [&](const char* s) {
    const std::string t = s;
    return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
  };
  if (ends(".res2")) return name + " (x + attention output)";
  if (ends(".input"))
    return name + (layer == 0 ? " (the embedding's output)"
                              : fmt::format(" (block {}'s output)", layer - 1));
  if (name == "head.x") return name + " (ln_f's input: the last block's output)";
  if (name == "head.probs") return name + " (softmax of the logits)";
  return name;
}

std::vector<int64_t> unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    const int64_t n = std::max<int64_t>(shape[d], 1);
    idx[d] = flat % n;
    flat /= n;
  }
  return idx;
}

std::string lookup_name(const RecordedTensor& e) { return (e.backward ? "d:" : "f:") + e.name; }

// One entry's comparison with the twin.
struct Verdict {
  bool compared = false, ok = true;
  int64_t worst = -1, twin_flat = -1;  // worst element (local), and where it is in the twin
  double got = 0, want = 0, allowed = 0;
  int64_t numel = 0, expected = 0;
};

// The twin's flat indices of the elements `e` holds, in its order; false if they do not fit.
bool twin_indices(const RecordedTensor& e, const RecordedTensor& t, std::vector<int64_t>& out) {
  std::vector<int64_t> view = t.view.empty() ? t.shape : t.view;
  int64_t total = 1;
  for (int64_t d : view) total *= d;
  if (total != static_cast<int64_t>(t.values.size())) return false;
  std::vector<std::vector<int64_t>> sel = e.select;
  if (sel.empty()) sel.resize(view.size());
  if (sel.size() != view.size()) return false;
  for (std::size_t d = 0; d < view.size(); ++d) {
    if (sel[d].empty()) sel[d] = iota(0, view[d]);
    for (int64_t i : sel[d])
      if (i < 0 || i >= view[d]) return false;
  }
  std::vector<int64_t> strides(view.size(), 1);
  for (int d = static_cast<int>(view.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * view[d + 1];
  out.clear();
  std::vector<std::size_t> at(view.size(), 0);  // odometer over the selections
  int64_t count = 1;
  for (const auto& s : sel) count *= static_cast<int64_t>(s.size());
  const int64_t lo = e.flat_hi < 0 ? 0 : e.flat_lo, hi = e.flat_hi < 0 ? count : e.flat_hi;
  if (lo < 0 || hi > count || lo > hi) return false;
  for (int64_t n = 0; n < count; ++n) {
    if (n >= lo && n < hi) {
      int64_t f = 0;
      for (std::size_t d = 0; d < view.size(); ++d) f += sel[d][at[d]] * strides[d];
      out.push_back(f);
    }
    for (int d = static_cast<int>(view.size()) - 1; d >= 0; --d) {
      if (++at[d] < sel[d].size()) break;
      at[d] = 0;
    }
  }
  return true;
}

Verdict judge(const RecordedTensor& e, const RecordedTensor& t, const DivergenceTolerance& tol) {
  Verdict v;
  v.compared = true;
  v.numel = static_cast<int64_t>(e.values.size());
  std::vector<int64_t> idx;
  if (!twin_indices(e, t, idx) || idx.size() != e.values.size()) {
    v.ok = false;
    v.expected = static_cast<int64_t>(idx.size());
    return v;
  }
  v.expected = v.numel;
  double scale = 0;
  for (int64_t f : idx) scale = std::max(scale, std::fabs(t.values[f]));
  double worst = -1;
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const double g = e.values[i], w = t.values[idx[i]], a = std::fabs(g - w);
    const double allowed = tol.rtol * std::fabs(w) + tol.atol * scale;
    if (a <= allowed) continue;  // a nan fails here
    const double excess = std::isnan(a) ? INFINITY : a;
    if (excess > worst) {
      worst = excess;
      v.ok = false;
      v.worst = static_cast<int64_t>(i);
      v.twin_flat = idx[i];
      v.got = g;
      v.want = w;
      v.allowed = allowed;
    }
  }
  return v;
}

std::string index_str(const std::vector<int64_t>& idx) {
  return fmt::format("({})", fmt::join(idx, ", "));
}

}  // namespace

DivergenceTolerance DivergenceTolerance::for_precision(DType precision) {
  if (precision == DType::bf16) return {3e-2, 1e-2};
  return {1e-4, 1e-5};
}

void watch(nn::GPT& model, std::shared_ptr<DivergenceRecorder> recorder) {
  recorder->n_layer_ = model.config().n_layer;
  if (recorder->forwards_.size() < static_cast<std::size_t>(recorder->n_layer_ + 1))
    recorder->forwards_.assign(recorder->n_layer_ + 1, 0);
  std::shared_ptr<nn::BlockPolicy> others = model.shared_block_policy();
  if (!others) {
    model.set_block_policy(std::move(recorder));
    return;
  }
  model.set_block_policy(std::make_shared<nn::PolicyList>(
      std::vector<std::shared_ptr<nn::BlockPolicy>>{std::move(recorder), std::move(others)}));
}

void DivergenceRecorder::add(RecordedTensor e, const Tensor& t) {
  if (!t.defined()) return;
  e.shape = t.shape();
  e.values = t.to_vector();
  entries_.push_back(std::move(e));
}

namespace {
// The fused attention path keeps the QKV output whole, (B, T, 3 NH hs), in place of q, k and v:
// part `part` (0 q, 1 k, 2 v) of it in the unfused layout (B, NH, T, hs), read on the host, so a
// run on either path is compared with a twin on the other (no tensor allocated on the way).
std::vector<double> qkv_part(const std::vector<double>& qkv, int64_t B, int64_t T, int64_t NH,
                             int64_t hs, int part) {
  std::vector<double> out(static_cast<std::size_t>(B * NH * T * hs));
  const int64_t C = NH * hs;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < hs; ++d)
          out[((b * NH + h) * T + t) * hs + d] = qkv[(b * T + t) * 3 * C + part * C + h * hs + d];
  return out;
}
}  // namespace

void DivergenceRecorder::after_forward(const nn::Block& block, const Tensor& input,
                                       nn::BlockActivations& a, int64_t /*seq_len*/) {
  const bool fused = !a.attn.q.defined() && a.attn.qkv.defined();
  // (without q or qkv: nothing to place the rows by)
  if (stopped_ || (!a.attn.q.defined() && !fused)) return;
  const int layer = block.index;
  const int m = forwards_.at(layer)++;
  const Tensor& q = fused ? a.attn.qkv : a.attn.q;
  const int64_t nh = fused ? static_cast<int64_t>(heads_of(block, 0).size()) : q.size(1);
  const int64_t b = q.size(0), t = fused ? q.size(1) : q.size(2);
  const int64_t hs = fused ? q.size(2) / (3 * nh) : q.size(3);
  const int64_t C = block.ln1.weight.full_shape.at(0);
  const std::vector<int64_t> batch = iota(rows_.first_row + m * b, rows_.first_row + (m + 1) * b);
  const std::vector<int64_t> pos = rows_.positions.empty() ? iota(0, t) : rows_.positions;
  const bool whole_sequence = rows_.positions.empty();
  const std::string p = fmt::format("blocks.{}.", layer);
  auto entry = [&](int tid, const std::string& name, std::vector<int64_t> view,
                   std::vector<std::vector<int64_t>> select) {
    RecordedTensor e;
    e.key = ((int64_t{m} * (n_layer_ + 1)) + layer) * kPerLayer + tid;
    e.name = p + name;
    e.layer = layer;
    e.micro_batch = m;
    e.view = std::move(view);
    e.select = std::move(select);
    return e;
  };
  // the rows a rank keeps between regions (all of them, or its sequence-parallel share)
  auto rows = [&](int tid, const std::string& name, const Tensor& x, int64_t width) {
    RecordedTensor e = width > 0 ? entry(tid, name, {b, t, width}, {batch, pos, {}})
                                 : entry(tid, name, {b, t}, {batch, pos});
    if (rows_.seq_size > 1) {
      const int64_t n = b * t, w = std::max<int64_t>(width, 1);
      e.flat_lo = n * rows_.seq_rank / rows_.seq_size * w;
      e.flat_hi = n * (rows_.seq_rank + 1) / rows_.seq_size * w;
    }
    add(std::move(e), x);
  };
  const std::vector<int64_t> qh = heads_of(block, 0);
  rows(0, "input", input, C);
  rows(1, "ln1", a.ln1, C);
  rows(2, "ln1_mean", a.ln1_mean, 0);
  rows(3, "ln1_rstd", a.ln1_rstd, 0);
  const std::vector<double> qkv = fused ? a.attn.qkv.to_vector() : std::vector<double>{};
  const Tensor* parts[3] = {&a.attn.q, &a.attn.k, &a.attn.v};
  const char* names[3] = {"attn.q", "attn.k", "attn.v"};
  for (int j = 0; j < 3; ++j) {
    RecordedTensor e =
        entry(4 + j, names[j], {b, nh, t, hs}, {batch, heads_of(block, j), pos, {}});
    if (!fused) {
      add(std::move(e), *parts[j]);
      continue;
    }
    e.shape = {b, nh, t, hs};
    e.values = qkv_part(qkv, b, t, nh, hs, j);
    entries_.push_back(std::move(e));
  }
  // a rank's probabilities over its own positions only mean something with the whole sequence
  if (whole_sequence) add(entry(7, "attn.att", {b, nh, t, t}, {batch, qh, pos, pos}), a.attn.att);
  // a core of the mappings' own may keep its log-sum-exps in its own layout (lab 11's ring:
  // chunk-major): only the fused op's (B NH, T) is placed
  if (a.attn.lse.defined() && a.attn.lse.shape() == std::vector<int64_t>{b * nh, t})
    add(entry(8, "attn.lse", {b, nh, t}, {batch, qh, pos}), a.attn.lse);
  add(entry(9, "attn.y", {b, t, nh * hs}, {batch, pos, head_columns(qh, hs)}), a.attn.y);
  rows(10, "res2", a.res2, C);
  rows(11, "ln2", a.ln2, C);
  rows(12, "ln2_mean", a.ln2_mean, 0);
  rows(13, "ln2_rstd", a.ln2_rstd, 0);
  if (a.mlp.h.defined()) {
    const int64_t H = a.mlp.h.size(-1);
    const std::vector<int64_t> units =
        shard_indices(block.mlp.fc.weight.shard, block.mlp.fc.weight.full_shape.at(0));
    add(entry(14, "mlp.h", {b, t, H}, {batch, pos, units}), a.mlp.h);
    add(entry(15, "mlp.g", {b, t, H}, {batch, pos, units}), a.mlp.g);
  }
}

void DivergenceRecorder::after_head_forward(const nn::GPT& model, const nn::HeadActivations& h) {
  if (stopped_) return;
  const int layer = static_cast<int>(n_layer_);
  const int m = forwards_.at(layer)++;
  const int64_t b = h.targets.size(0), t = h.targets.size(1), C = model.config().n_embd;
  const std::vector<int64_t> batch = iota(rows_.first_row + m * b, rows_.first_row + (m + 1) * b);
  const std::vector<int64_t> pos = rows_.positions.empty() ? iota(0, t) : rows_.positions;
  auto entry = [&](int tid, const std::string& name, std::vector<int64_t> view,
                   std::vector<std::vector<int64_t>> select, bool seq_rows) {
    RecordedTensor e;
    e.key = ((int64_t{m} * (n_layer_ + 1)) + layer) * kPerLayer + tid;
    e.name = "head." + name;
    e.layer = layer;
    e.micro_batch = m;
    if (seq_rows && rows_.seq_size > 1) {
      const int64_t n = b * t, w = view.size() > 2 ? view[2] : 1;
      e.flat_lo = n * rows_.seq_rank / rows_.seq_size * w;
      e.flat_hi = n * (rows_.seq_rank + 1) / rows_.seq_size * w;
    }
    e.view = std::move(view);
    e.select = std::move(select);
    return e;
  };
  add(entry(0, "x", {b, t, C}, {batch, pos, {}}, true), h.x);
  add(entry(1, "lnf", {b, t, C}, {batch, pos, {}}, true), h.lnf);
  add(entry(2, "lnf_mean", {b, t}, {batch, pos}, true), h.lnf_mean);
  add(entry(3, "lnf_rstd", {b, t}, {batch, pos}, true), h.lnf_rstd);
  if (h.probs.defined()) {
    const int64_t V = h.probs.size(1);
    add(entry(4, "probs", {b, t, V}, {batch, pos, iota(model.vocab_lo(), model.vocab_hi())},
              false),
        h.probs);
  }
}

void DivergenceRecorder::param_entry(const nn::GPT& model, std::size_t i,
                                     const Tensor& values, int64_t lo, int64_t hi) {
  nn::GPT& m = const_cast<nn::GPT&>(model);  // params() is not const; nothing is changed
  const nn::Parameter& p = *model.parameters()[i];
  const auto& units = m.params().units();
  std::size_t u = 0;
  while (u + 1 < units.size() && !(units[u].first <= i && i < units[u].last)) ++u;
  const std::string& unit = units[u].name;
  int64_t place = 0;  // the unit's place in backward: the head, the blocks from the last, ...
  int layer = -1;
  if (unit == "head") {
    layer = static_cast<int>(n_layer_);
  } else if (unit.rfind("blocks.", 0) == 0) {
    layer = std::stoi(unit.substr(7));
    place = 1 + (n_layer_ - 1 - layer);
  } else {
    place = n_layer_ + 1;
  }
  RecordedTensor e;
  e.key = kBackward + place * 256 + static_cast<int64_t>(units[u].last - 1 - i);
  e.name = p.init_key.empty() ? p.name : p.init_key;  // a last stage's lm_head.weight is wte's
  e.backward = true;
  e.layer = layer;
  e.view = p.full_shape;
  if (!p.shard.whole()) {
    e.select.resize(p.full_shape.size());
    e.select.at(p.shard.dim) = shard_indices(p.shard, p.full_shape.at(p.shard.dim));
  }
  e.flat_lo = lo;
  e.flat_hi = hi;
  add(std::move(e), values);
}

void DivergenceRecorder::record_gradients(const nn::GPT& model) {
  const auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i)
    if (params[i]->grad.defined()) param_entry(model, i, params[i]->grad, 0, -1);
}

void DivergenceRecorder::record_gradient_shard(const nn::GPT& model, const Tensor& shard,
                                               int64_t lo, int64_t hi) {
  nn::GPT& m = const_cast<nn::GPT&>(model);
  const Tensor flat = shard.to(Device::cpu());
  const auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const int64_t o = m.params().offset(i), n = params[i]->numel();
    const int64_t a = std::max(lo, o), e = std::min(hi, o + n);
    if (a >= e) continue;
    param_entry(model, i, flat.flat(a - lo, e - a), a - o, e - o);
  }
}

DivergenceRecorder record_twin(const ModelConfig& config, nn::GPTOptions options,
                               const data::Batch& batch) {
  options.first_block = 0;
  options.last_block = -1;
  options.tp_rank = 0;
  options.tp_size = 1;
  options.cut_block = {};
  options.vocab_lo = 0;
  options.vocab_hi = -1;
  options.storage = {};
  options.on_init = {};
  nn::GPT model(config, options);
  auto rec = std::make_shared<DivergenceRecorder>();
  watch(model, rec);
  nn::GPTActivations acts;
  model.forward(batch.x.to(options.device), batch.y.to(options.device), acts);
  model.zero_grad();
  model.backward(acts);
  rec->record_gradients(model);
  model.set_block_policy(nullptr);
  return std::move(*rec);
}

Divergence find_divergence(const DivergenceRecorder& mine, const DivergenceRecorder& twin,
                           DType precision, comm::Communicator& comm) {
  Divergence d;
  d.tolerance = DivergenceTolerance::for_precision(precision);
  std::map<std::string, const RecordedTensor*> twins;
  for (const RecordedTensor& t : twin.entries()) twins.emplace(lookup_name(t), &t);
  // this rank's verdicts, and its first entry out of tolerance
  std::vector<std::pair<const RecordedTensor*, Verdict>> judged;
  const RecordedTensor* first = nullptr;
  Verdict first_v;
  for (const RecordedTensor& e : mine.entries()) {
    auto it = twins.find(lookup_name(e));
    if (it == twins.end()) continue;  // the twin has no such tensor (another attention path)
    Verdict v;
    try {
      v = judge(e, *it->second, d.tolerance);
    } catch (const std::exception&) {  // still take part in the collectives below
      v.compared = true;
      v.ok = false;
    }
    judged.emplace_back(&e, v);
    if (!v.ok && (first == nullptr || e.key < first->key)) {
      first = &e;
      first_v = v;
    }
  }
  // 1. the first key out of tolerance, over every rank
  Tensor key = Tensor::from_vector({first ? static_cast<double>(first->key) : kNone}, {1},
                                   DType::f64);
  comm.all_reduce(key, comm::ReduceOp::min);
  const double K = key.item();
  d.found = K < kNone;
  // 2. how many matched before it, how many were compared, which ranks diverge first there
  const int n = comm.size();
  // [matched, compared, first divergence on rank r (n), tensors rank r compared (n)]
  std::vector<double> counts(2 + 2 * n, 0.0);
  for (const auto& [e, v] : judged) {
    counts[1] += 1;
    if (static_cast<double>(e->key) < K) counts[0] += 1;
  }
  if (d.found && first && static_cast<double>(first->key) == K) counts[2 + comm.rank()] = 1;
  counts[2 + n + comm.rank()] = static_cast<double>(judged.size());
  Tensor c = Tensor::from_vector(counts, {static_cast<int64_t>(counts.size())}, DType::f64);
  comm.all_reduce(c, comm::ReduceOp::sum);
  d.matched = static_cast<int64_t>(c.item(0));
  d.compared = static_cast<int64_t>(c.item(1));
  for (int r = 0; r < n; ++r)
    d.compared_by_rank.push_back(static_cast<int64_t>(c.item(2 + n + r)));
  for (int r = 0; r < n; ++r)
    if (c.item(2 + r) > 0) d.ranks.push_back(r);
  if (!d.found) return d;
  d.rank = d.ranks.front();
  // 3. the lowest such rank's details: name, micro-batch, element, values
  std::vector<double> detail(kNameChars + 10 + 2 * (kDims + 1), 0.0);
  if (comm.rank() == d.rank) {
    for (std::size_t i = 0; i < first->name.size() && i < kNameChars; ++i)
      detail[i] = static_cast<unsigned char>(first->name[i]);
    double* x = detail.data() + kNameChars;
    x[0] = first->backward;
    x[1] = first->layer;
    x[2] = first->micro_batch;
    x[3] = first_v.got;
    x[4] = first_v.want;
    x[5] = first_v.allowed;
    x[6] = static_cast<double>(first_v.numel);
    x[7] = static_cast<double>(first_v.expected);
    x[8] = first_v.worst >= 0;
    double* idx = x + 10;
    if (first_v.worst >= 0) {
      const std::vector<int64_t> local = unravel(first_v.worst, first->shape);
      const RecordedTensor& t = *twins.at(lookup_name(*first));
      const std::vector<int64_t> in_twin =
          unravel(first_v.twin_flat, t.view.empty() ? t.shape : t.view);
      idx[0] = static_cast<double>(std::min<std::size_t>(local.size(), kDims));
      for (std::size_t i = 0; i < local.size() && i < kDims; ++i) idx[1 + i] = local[i];
      idx[kDims + 1] = static_cast<double>(std::min<std::size_t>(in_twin.size(), kDims));
      for (std::size_t i = 0; i < in_twin.size() && i < kDims; ++i)
        idx[kDims + 2 + i] = in_twin[i];
    }
  }
  Tensor det = Tensor::from_vector(detail, {static_cast<int64_t>(detail.size())}, DType::f64);
  comm.all_reduce(det, comm::ReduceOp::sum);
  for (int i = 0; i < kNameChars; ++i) {
    const int ch = static_cast<int>(det.item(i));
    if (ch == 0) break;
    d.tensor.push_back(static_cast<char>(ch));
  }
  auto x = [&](int i) { return det.item(kNameChars + i); };
  d.backward = x(0) != 0;
  d.layer = static_cast<int>(x(1));
  d.micro_batch = static_cast<int>(x(2));
  d.got = x(3);
  d.want = x(4);
  d.allowed = x(5);
  d.numel = static_cast<int64_t>(x(6));
  d.expected = static_cast<int64_t>(x(7));
  if (x(8) != 0) {
    const int nl = static_cast<int>(x(10)), nt = static_cast<int>(x(11 + kDims));
    for (int i = 0; i < nl; ++i) d.index.push_back(static_cast<int64_t>(x(11 + i)));
    for (int i = 0; i < nt; ++i) d.twin_index.push_back(static_cast<int64_t>(x(12 + kDims + i)));
  }
  if (!d.backward) d.tensor = describe(d.tensor, d.layer);
  return d;
}

std::string Divergence::first_line() const {
  if (!found) {
    // every rank records its own share of each tensor: at 2 ranks the count is twice one model's
    const auto& by = compared_by_rank;
    std::string per_rank;
    if (by.size() > 1 && std::all_of(by.begin(), by.end(), [&](int64_t k) { return k == by[0]; }))
      per_rank = fmt::format(" ({} on each of {} ranks)", by[0], by.size());
    else if (by.size() > 1) {
      std::vector<std::string> each;
      for (std::size_t r = 0; r < by.size(); ++r)
        each.push_back(fmt::format("{} on rank {}", by[r], r));
      per_rank = fmt::format(" ({})", fmt::join(each, ", "));
    }
    return fmt::format("no divergence: {} tensors{} within tolerance of the single-device twin",
                       compared, per_rank);
  }
  std::string where = ranks.size() > 1
                          ? fmt::format("ranks {} (rank {} shown)", fmt::join(ranks, ", "), rank)
                          : fmt::format("rank {}", rank);
  if (micro_batch >= 0) where += fmt::format(", micro-batch {}", micro_batch);
  std::string what;
  if (index.empty()) {
    what = fmt::format("holds {} elements where the twin's share has {}", numel, expected);
  } else {
    what = fmt::format("element {} = {:.6g} where the twin has {:.6g} at {} (|diff| {:.3g} > "
                       "{:.3g})", index_str(index), got, want, index_str(twin_index),
                       std::fabs(got - want), allowed);
  }
  return fmt::format("first divergence: {}, {}, {}: {}; {} tensors before it matched ({} "
                     "compared)",
                     backward ? tensor + " gradient" : tensor,
                     backward ? "backward" : "forward", where, what, matched, compared);
}

std::string Divergence::str() const {
  return fmt::format("{}\n  tolerance: |got - twin| <= {:g} |twin| + {:g} max|twin| of the "
                     "tensor, element by element", first_line(), tolerance.rtol,
                     tolerance.atol);
}

}  // namespace scalelab::train
