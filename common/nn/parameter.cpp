#include "common/nn/parameter.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "common/ops/ops.hpp"

namespace scalelab::nn {

int64_t Shard::count() const {
  int64_t n = 0;
  for (auto [b, e] : ranges) n += e - b;
  return n;
}

std::vector<int64_t> Parameter::shape() const {
  std::vector<int64_t> s = full_shape;
  if (!shard.whole()) s.at(shard.dim) = shard.count();
  return s;
}

int64_t Parameter::numel() const {
  int64_t n = 1;
  for (int64_t d : shape()) n *= d;
  return n;
}

namespace {
// FNV-1a: a stable hash of the parameter's name (std::hash may differ between libraries).
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Standard normals by Box-Muller from a 64-bit Mersenne twister: the same numbers with every
// standard library (std::normal_distribution is implementation-defined).
std::vector<double> normals(uint64_t seed, int64_t n) {
  std::mt19937_64 rng(seed);
  std::vector<double> out(n);
  const double two_pi = 6.283185307179586;
  for (int64_t i = 0; i < n; i += 2) {
    double u1 = (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;          // [0, 1)
    double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = r * std::cos(two_pi * u2);
    if (i + 1 < n) out[i + 1] = r * std::sin(two_pi * u2);
  }
  return out;
}
}  // namespace

void init_parameter(Parameter& p, uint64_t seed) {
  const std::vector<int64_t> shape = p.shape();
  std::vector<double> full;
  int64_t full_n = 1;
  for (int64_t d : p.full_shape) full_n *= d;
  switch (p.init) {
    case Init::zeros: full.assign(full_n, 0.0); break;
    case Init::ones: full.assign(full_n, 1.0); break;
    case Init::normal: {
      const std::string& key = p.init_key.empty() ? p.name : p.init_key;
      full = normals(seed ^ fnv1a(key), full_n);
      for (double& x : full) x *= p.init_std;
      break;
    }
  }
  // keep the shard: rows of a (R, C) matrix, columns, or a 1-d range
  std::vector<double> local;
  local.reserve(p.numel());
  if (p.shard.whole()) {
    local = std::move(full);
  } else {
    const int64_t R = p.full_shape[0];
    const int64_t C = p.full_shape.size() > 1 ? full_n / R : 1;
    if (p.shard.dim == 0) {
      for (auto [b, e] : p.shard.ranges)
        for (int64_t r = b; r < e; ++r)
          for (int64_t c = 0; c < C; ++c) local.push_back(full[r * C + c]);
    } else {
      for (int64_t r = 0; r < R; ++r)
        for (auto [b, e] : p.shard.ranges)
          for (int64_t c = b; c < e; ++c) local.push_back(full[r * C + c]);
    }
  }
  Tensor host = Tensor::from_vector(local, shape, p.value.dtype());
  p.value.copy_from(host);
}

ShardRange shard_range(int64_t numel, int rank, int n) {
  SCALELAB_CHECK(n >= 1 && rank >= 0 && rank < n, "shard {} of {}", rank, n);
  ShardRange r;
  r.size = (numel + n - 1) / n;  // ceil: the padding goes at the end of the last shards
  r.lo = std::min<int64_t>(static_cast<int64_t>(rank) * r.size, numel);
  r.hi = std::min<int64_t>(static_cast<int64_t>(rank) * r.size + r.size, numel);
  return r;
}

void ParameterSet::bind(std::vector<Parameter*> params, DType dtype, Device device,
                        uint64_t seed,
                        const std::vector<std::pair<std::string, std::size_t>>& units,
                        StorageOptions storage,
                        const std::function<void(const Unit&, const Tensor& values)>& on_init) {
  SCALELAB_CHECK(storage.pad_to >= 1, "pad_to {} < 1", storage.pad_to);
  params_ = std::move(params);
  storage_ = storage;
  dtype_ = dtype;
  device_ = device;
  offsets_.clear();
  int64_t total = 0;
  for (Parameter* p : params_) {
    offsets_.push_back(total);
    total += p->numel();
  }
  numel_ = total;
  padded_numel_ = (total + storage.pad_to - 1) / storage.pad_to * storage.pad_to;

  // units: consecutive runs of parameters
  units_.clear();
  std::size_t next = 0;
  for (const auto& [name, count] : units) {
    units_.push_back(Unit{name, next, next + count, 0, 0});
    next += count;
  }
  if (units.empty()) units_.push_back(Unit{"all", 0, params_.size(), 0, 0}), next = params_.size();
  SCALELAB_CHECK(next == params_.size(), "units cover {} parameters of {}", next, params_.size());
  for (Unit& u : units_) {
    u.lo = u.first < params_.size() ? offsets_[u.first] : total;
    u.hi = u.last < params_.size() ? offsets_[u.last] : total;
  }
  unit_values_.assign(units_.size(), Tensor());
  unit_grads_.assign(units_.size(), Tensor());
  unit_compute_.assign(units_.size(), Tensor());

  values_ = values_real_ = grads_ = grads_real_ = compute_ = Tensor();
  mixed_ = storage.compute_dtype == DType::bf16 && dtype != DType::bf16;
  // per-unit values: no flat copy; each unit's compute buffer comes with bind_compute
  const bool flat_copy = mixed_ && storage.values == Storage::flat;
  if (storage.values == Storage::flat) {
    values_ = Tensor::zeros({padded_numel_}, dtype, device);  // zeros: the padding
    values_real_ = values_.flat(0, total);
  }
  if (storage.grads == Storage::flat) {
    grads_ = Tensor::zeros({padded_numel_}, dtype, device);
    grads_real_ = grads_.flat(0, total);
  }
  if (flat_copy) compute_ = Tensor::zeros({padded_numel_}, DType::bf16, device);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    p.value = values_.defined() ? values_.flat(offsets_[i], p.numel()).view(p.shape()) : Tensor();
    p.grad = grads_.defined() ? grads_.flat(offsets_[i], p.numel()).view(p.shape()) : Tensor();
    p.compute = flat_copy ? compute_.flat(offsets_[i], p.numel()).view(p.shape()) : Tensor();
  }
  // initial values, unit by unit: a per_unit set holds one unit's values at a time here
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (storage.values == Storage::per_unit) bind_values(u);
    for (std::size_t i = units_[u].first; i < units_[u].last; ++i) init_parameter(*params_[i], seed);
    if (on_init) on_init(units_[u], unit_values(u));
    if (storage.values == Storage::per_unit) release_values(u);
  }
  refresh_compute();
}

void ParameterSet::refresh_compute() {
  if (compute_.defined() && compute_.numel() > 0) ops::cast(compute_, values_);
}

Tensor& ParameterSet::values() {
  SCALELAB_CHECK(values_real_.defined(), "values(): this set keeps its values per unit");
  return values_real_;
}
Tensor& ParameterSet::grads() {
  SCALELAB_CHECK(grads_real_.defined(), "grads(): this set keeps its gradients per unit");
  return grads_real_;
}
Tensor& ParameterSet::padded_values() {
  SCALELAB_CHECK(values_.defined(), "padded_values(): this set keeps its values per unit");
  return values_;
}
Tensor& ParameterSet::padded_grads() {
  SCALELAB_CHECK(grads_.defined(), "padded_grads(): this set keeps its gradients per unit");
  return grads_;
}

std::size_t ParameterSet::unit_of(const Parameter* p) const {
  for (std::size_t u = 0; u < units_.size(); ++u)
    for (std::size_t i = units_[u].first; i < units_[u].last; ++i)
      if (params_[i] == p) return u;
  SCALELAB_CHECK(false, "parameter '{}' is not in this set", p->name);
  throw;  // unreachable
}

bool ParameterSet::values_bound(std::size_t u) const {
  return storage_.values == Storage::flat || unit_values_.at(u).defined();
}
bool ParameterSet::grads_bound(std::size_t u) const {
  return storage_.grads == Storage::flat || unit_grads_.at(u).defined();
}

namespace {
// Points field (value, grad or compute) of the unit's parameters at consecutive views of `buffer`.
void point_into(std::vector<Parameter*>& params, const std::vector<int64_t>& offsets,
                const Unit& u, const Tensor& buffer, Tensor Parameter::*field) {
  for (std::size_t i = u.first; i < u.last; ++i) {
    Parameter& p = *params[i];
    p.*field = buffer.defined() ? buffer.flat(offsets[i] - u.lo, p.numel()).view(p.shape())
                                : Tensor();
  }
}
}  // namespace

Tensor ParameterSet::bind_values(std::size_t u) {
  SCALELAB_CHECK(storage_.values == Storage::per_unit, "bind_values(): flat storage is always bound");
  SCALELAB_CHECK(!unit_values_.at(u).defined(), "unit {} values bound twice", units_[u].name);
  unit_values_[u] = Tensor::empty({units_[u].numel()}, dtype_, device_);
  point_into(params_, offsets_, units_[u], unit_values_[u], &Parameter::value);
  return unit_values_[u];
}

void ParameterSet::release_values(std::size_t u) {
  SCALELAB_CHECK(storage_.values == Storage::per_unit, "release_values(): flat storage");
  unit_values_.at(u) = Tensor();
  point_into(params_, offsets_, units_[u], Tensor(), &Parameter::value);
}

Tensor ParameterSet::bind_grads(std::size_t u) {
  SCALELAB_CHECK(storage_.grads == Storage::per_unit, "bind_grads(): flat storage is always bound");
  SCALELAB_CHECK(!unit_grads_.at(u).defined(), "unit {} gradients bound twice", units_[u].name);
  unit_grads_[u] = Tensor::zeros({units_[u].numel()}, dtype_, device_);
  point_into(params_, offsets_, units_[u], unit_grads_[u], &Parameter::grad);
  return unit_grads_[u];
}

void ParameterSet::release_grads(std::size_t u) {
  SCALELAB_CHECK(storage_.grads == Storage::per_unit, "release_grads(): flat storage");
  unit_grads_.at(u) = Tensor();
  point_into(params_, offsets_, units_[u], Tensor(), &Parameter::grad);
}

Tensor ParameterSet::unit_values(std::size_t u) const {
  if (storage_.values == Storage::flat) return values_.flat(units_.at(u).lo, units_[u].numel());
  return unit_values_.at(u);
}

Tensor ParameterSet::unit_grads(std::size_t u) const {
  if (storage_.grads == Storage::flat) return grads_.flat(units_.at(u).lo, units_[u].numel());
  return unit_grads_.at(u);
}

Tensor ParameterSet::bind_compute(std::size_t u) {
  SCALELAB_CHECK(mixed_, "bind_compute(): this set computes in its own dtype (no bf16 copy)");
  SCALELAB_CHECK(storage_.values == Storage::per_unit,
                 "bind_compute(): flat values have one flat compute copy, always bound");
  SCALELAB_CHECK(!unit_compute_.at(u).defined(), "unit {} compute copy bound twice",
                 units_[u].name);
  unit_compute_[u] = Tensor::empty({units_[u].numel()}, DType::bf16, device_);
  point_into(params_, offsets_, units_[u], unit_compute_[u], &Parameter::compute);
  return unit_compute_[u];
}

void ParameterSet::release_compute(std::size_t u) {
  SCALELAB_CHECK(mixed_ && storage_.values == Storage::per_unit,
                 "release_compute(): only per-unit values in mixed precision have one per unit");
  unit_compute_.at(u) = Tensor();
  point_into(params_, offsets_, units_[u], Tensor(), &Parameter::compute);
}

Tensor ParameterSet::unit_compute(std::size_t u) const {
  if (compute_.defined()) return compute_.flat(units_.at(u).lo, units_[u].numel());
  return unit_compute_.at(u);
}

bool ParameterSet::compute_bound(std::size_t u) const {
  if (!mixed_) return values_bound(u);
  return storage_.values == Storage::flat || unit_compute_.at(u).defined();
}

Parameter& ParameterSet::get(const std::string& name) const {
  for (Parameter* p : params_)
    if (p->name == name) return *p;
  SCALELAB_CHECK(false, "no parameter named '{}'", name);
  throw;  // unreachable
}

void ParameterSet::zero_grad() {
  if (grads_.defined() && grads_.numel() > 0) ops::fill(grads_, 0.0);
  for (Tensor& g : unit_grads_)
    if (g.defined() && g.numel() > 0) ops::fill(g, 0.0);
}

}  // namespace scalelab::nn
