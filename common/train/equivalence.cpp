#include "common/train/equivalence.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace scalelab::train {

Diff compare(const Tensor& got, const Tensor& want) {
  SCALELAB_CHECK(got.numel() == want.numel(), "compare: {} vs {} elements", got.numel(),
                 want.numel());
  Diff d;
  d.got_ = got.to_vector();
  d.want_ = want.to_vector();
  d.n = static_cast<int64_t>(d.got_.size());
  d.shape = want.shape();
  double scale = 0;
  for (int64_t i = 0; i < d.n; ++i) {
    const double g = d.got_[i], w = d.want_[i], a = std::fabs(g - w);
    if (g != w || std::isnan(g) != std::isnan(w)) d.bitwise = false;
    if (a > d.max_abs || std::isnan(a)) {
      d.max_abs = std::isnan(a) ? INFINITY : a;
      d.worst_index = i;
    }
    scale = std::max(scale, std::fabs(w));
  }
  d.max_rel = scale > 0 ? d.max_abs / scale : (d.max_abs > 0 ? INFINITY : 0.0);
  return d;
}

bool Diff::rtol_atol_ok(double rtol, double atol) const {
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::fabs(got_[i] - want_[i]);
    if (!(a <= atol + rtol * std::fabs(want_[i]))) return false;
  }
  return true;
}

namespace {

// " = [1, 4] of (2, 8)": a flat (row-major) index as the tensor's index, where a flat index alone
// leaves the reader to divide (a tensor of one dimension, or a shape that does not hold `flat`,
// gives "").
std::string index_in_shape(int64_t flat, const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (shape.size() < 2 || flat < 0 || flat >= numel) return "";
  std::vector<int64_t> index(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    index[i] = flat % shape[i];
    flat /= shape[i];
  }
  return fmt::format(" = [{}] of ({})", fmt::join(index, ", "), fmt::join(shape, ", "));
}

}  // namespace

std::string Diff::str() const {
  if (bitwise) return fmt::format("bitwise equal ({} elements)", n);
  // max_rel is max |diff| / max |want|: "0.0118 of max |want|", not max |want| itself
  if (worst_index < 0)
    return fmt::format("max |diff| {:.3g}, {:.3g} of max |want|", max_abs, max_rel);
  return fmt::format("max |diff| {:.3g} at element {}{} (got {:.9g}, want {:.9g}), {:.3g} of max "
                     "|want|", max_abs, worst_index, index_in_shape(worst_index, shape),
                     got_[worst_index], want_[worst_index], max_rel);
}

bool TwinCheck::add(double loss, double twin) {
  // A nan compares false with everything: without this, a diverged run reported the largest
  // difference of its finite steps beside a failed verdict.
  if (!std::isfinite(loss) || !std::isfinite(twin)) {
    diverged = true;
    ok = false;
    return false;
  }
  const double diff = std::abs(loss - twin);
  worst = std::max(worst, diff);
  const bool within = diff <= tolerance * std::abs(twin);
  ok = ok && within;
  return within;
}

std::string TwinCheck::verdict() const {
  if (diverged)
    return "NOT FINITE: the loss became nan or inf, training diverged (is --lr too large?)";
  return fmt::format("{} {:g} relative", ok ? "within" : "MORE THAN", tolerance);
}

bool on_every_rank(bool ok, comm::Communicator& comm) {
  Tensor flag = Tensor::from_vector({ok ? 1.0 : 0.0}, {1}, DType::f64);
  comm.all_reduce(flag, comm::ReduceOp::min);
  return flag.item() == 1.0;
}

double max_divergence_from_rank0(const Tensor& t, comm::Communicator& comm) {
  Tensor root = t.to(Device::cpu());
  comm.broadcast(root, 0);
  Tensor mine = t.to(Device::cpu());
  const Diff d = compare(mine, root);
  Tensor worst = Tensor::from_vector({d.max_abs}, {1}, DType::f64);
  comm.all_reduce(worst, comm::ReduceOp::max);
  return worst.item();
}

}  // namespace scalelab::train
