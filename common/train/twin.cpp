#include "common/train/twin.hpp"

namespace scalelab::train {

SingleDeviceTwin::SingleDeviceTwin(const ModelConfig& config, const nn::GPTOptions& options)
    : model_(config, options), adamw_(optim::groups(model_.parameters())) {}

double SingleDeviceTwin::step(const data::Batch& batch, double lr) {
  const data::Batch here = batch.x.device() == model_.device() ? batch : batch.to(model_.device());
  model_.zero_grad();
  const double loss = model_.forward(here.x, here.y);
  activation_bytes_ = model_.activation_bytes();
  model_.backward();
  adamw_.step(lr);
  return loss;
}

}  // namespace scalelab::train
