#include "common/nn/parameter.hpp"

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

void ParameterSet::bind(std::vector<Parameter*> params, DType dtype, Device device,
                        uint64_t seed) {
  params_ = std::move(params);
  offsets_.clear();
  int64_t total = 0;
  for (Parameter* p : params_) {
    offsets_.push_back(total);
    total += p->numel();
  }
  values_ = Tensor::empty({total}, dtype, device);
  grads_ = Tensor::zeros({total}, dtype, device);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    p.value = values_.flat(offsets_[i], p.numel()).view(p.shape());
    p.grad = grads_.flat(offsets_[i], p.numel()).view(p.shape());
    init_parameter(p, seed);
  }
}

Parameter& ParameterSet::get(const std::string& name) const {
  for (Parameter* p : params_)
    if (p->name == name) return *p;
  SCALELAB_CHECK(false, "no parameter named '{}'", name);
  throw;  // unreachable
}

void ParameterSet::zero_grad() {
  if (grads_.defined() && grads_.numel() > 0) ops::fill(grads_, 0.0);
}

}  // namespace scalelab::nn
