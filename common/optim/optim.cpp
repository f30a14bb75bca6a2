#include "common/optim/optim.hpp"

#include <algorithm>
#include <cmath>

#include "common/ops/ops.hpp"
#include "common/ops/trial_kernels.hpp"
#include "common/trace.hpp"

namespace scalelab::optim {

std::vector<Group> groups(const std::vector<nn::Parameter*>& params) {
  std::vector<Group> g;
  for (nn::Parameter* p : params) g.push_back({p->value, p->grad, p->weight_decay, p->compute});
  return g;
}

std::vector<Group> groups_in_range(const nn::ParameterSet& set, int64_t lo, int64_t hi,
                                   const Tensor& values, const Tensor& grads) {
  SCALELAB_CHECK(0 <= lo && lo <= hi && hi <= set.numel(), "range [{}, {}) outside the {} "
                 "elements of the parameters", lo, hi, set.numel());
  SCALELAB_CHECK(values.numel() >= hi - lo && grads.numel() >= hi - lo, "range [{}, {}) needs {} "
                 "elements; values have {}, grads {}", lo, hi, hi - lo, values.numel(),
                 grads.numel());
  std::vector<Group> g;
  const auto& params = set.list();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const int64_t b = std::max(lo, set.offset(i)), e = std::min(hi, set.offset(i) + params[i]->numel());
    if (b >= e) continue;  // no overlap
    g.push_back({values.flat(b - lo, e - b), grads.flat(b - lo, e - b), params[i]->weight_decay});
  }
  return g;
}

namespace {
// One zeroed flat buffer shaped like the groups, and a view of it per group.
Tensor flat_state(const std::vector<Group>& groups, std::vector<Tensor>& views) {
  int64_t total = 0;
  for (const Group& g : groups) total += g.value.numel();
  DType dt = groups.empty() ? DType::f32 : groups[0].value.dtype();
  Device dev = groups.empty() ? Device::cpu() : groups[0].value.device();
  Tensor flat = Tensor::zeros({total}, dt, dev);
  int64_t off = 0;
  views.clear();
  for (const Group& g : groups) {
    views.push_back(flat.flat(off, g.value.numel()));
    off += g.value.numel();
  }
  return flat;
}
}  // namespace

AdamW::AdamW(std::vector<Group> groups, AdamWConfig config)
    : groups_(std::move(groups)), config_(config) {
  m_ = flat_state(groups_, gm_);
  v_ = flat_state(groups_, gv_);
  // One pass over flat buffers when the groups lie back to back in them (every compute copy too,
  // or none). The host does it always (the same updates, element by element); a GPU, where it is
  // one launch instead of one per parameter, unless "adamw_one_launch" is turned off
  // (common/ops/trial_kernels.hpp: checked on an H200, where it took 1.0 ms against 1.5).
  std::vector<Tensor> values, grads, computes;
  for (const Group& g : groups_) {
    values.push_back(g.value.view({-1}));
    grads.push_back(g.grad.view({-1}));
    if (g.compute.defined()) computes.push_back(g.compute.view({-1}));
  }
  values_ = Tensor::span(values);
  grads_ = Tensor::span(grads);
  computes_ = Tensor::span(computes);
  const bool computes_ok = computes.empty() || (computes.size() == groups_.size() &&
                                                 computes_.defined());
  const bool device_ok = m_.device().is_cpu() || ops::trial_kernel("adamw_one_launch");
  one_pass_ = values_.defined() && grads_.defined() && computes_ok && device_ok &&
              values_.numel() == m_.numel();
  if (!one_pass_) return;
  int64_t end = 0;
  for (const Group& g : groups_) {  // consecutive groups that decay alike share a segment
    end += g.value.numel();
    if (!segments_.decay.empty() && segments_.decay.back() == g.weight_decay)
      segments_.ends.back() = end;
    else
      segments_.ends.push_back(end), segments_.decay.push_back(g.weight_decay);
  }
}

void AdamW::step(double lr) {
  trace::Scope scope("optimizer");
  ++t_;
  if (one_pass_) {
    const ops::AdamWArgs a{lr, config_.beta1, config_.beta2, config_.eps, config_.weight_decay,
                           t_};
    ops::adamw_update_segments(values_, grads_, m_, v_, segments_, a,
                               computes_.defined() ? &computes_ : nullptr);
    return;
  }
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    ops::AdamWArgs a{lr, config_.beta1, config_.beta2, config_.eps,
                     groups_[i].weight_decay ? config_.weight_decay : 0.0, t_};
    Tensor value = groups_[i].value.view({-1});
    Tensor compute = groups_[i].compute.defined() ? groups_[i].compute.view({-1}) : Tensor();
    ops::adamw_update(value, groups_[i].grad.view({-1}), gm_[i], gv_[i], a,
                      compute.defined() ? &compute : nullptr);
  }
}

SGD::SGD(std::vector<Group> groups, double momentum, double weight_decay)
    : groups_(std::move(groups)), momentum_(momentum), weight_decay_(weight_decay) {
  if (momentum_ > 0) buf_ = flat_state(groups_, gbuf_);
}

void SGD::step(double lr) {
  trace::Scope scope("optimizer");
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    Tensor value = groups_[i].value.view({-1});
    Tensor buf = momentum_ > 0 ? gbuf_[i] : Tensor();
    ops::sgd_update(value, groups_[i].grad.view({-1}), buf, lr, momentum_,
                    groups_[i].weight_decay ? weight_decay_ : 0.0, first_);
    if (groups_[i].compute.defined()) {  // mixed precision: the compute copy follows the master
      Tensor compute = groups_[i].compute.view({-1});
      ops::cast(compute, value);
    }
  }
  first_ = false;
}

double grad_norm(const std::vector<Group>& groups) {
  double s = 0;
  for (const Group& g : groups) s += ops::sum_squares(g.grad);
  return std::sqrt(s);
}

Scalar clip_grad_norm(const std::vector<Group>& groups, double max_norm) {
  if (groups.empty()) return 0.0;
  // grad_norm's sum (over groups in order, in double), kept on the device
  Tensor sum_squares = Tensor::zeros({1}, DType::f64, groups.front().grad.device());
  for (const Group& g : groups) ops::sum_squares_into(sum_squares, g.grad);
  for (const Group& g : groups) {
    Tensor grad = g.grad;
    ops::clip_scale(grad, sum_squares, max_norm);
  }
  return Scalar(sum_squares).sqrt();
}

double cosine_lr(int64_t step, int64_t warmup, int64_t decay_steps, double max_lr,
                 double min_lr) {
  if (step < warmup) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup + 1);
  if (step >= decay_steps) return min_lr;
  const double ratio =
      static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, decay_steps - warmup));
  const double coeff = 0.5 * (1.0 + std::cos(3.141592653589793 * ratio));
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace scalelab::optim
