#include "common/nn/layernorm.hpp"

#include "common/ops/fused_norm.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::nn {

LayerNorm::LayerNorm(std::string name, int64_t features) {
  weight.name = name + ".weight";
  weight.full_shape = {features};
  weight.init = Init::ones;
  bias.name = name + ".bias";
  bias.full_shape = {features};
  bias.init = Init::zeros;
}

void LayerNorm::forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& in) const {
  ops::layernorm_forward(out, mean, rstd, in, weight.compute_value(), bias.compute_value(),
                         eps);
}

void LayerNorm::forward_residual(Tensor& res_out, Tensor& out, Tensor& mean, Tensor& rstd,
                                 const Tensor& x, const Tensor& residual) const {
  ops::residual_layernorm_forward(res_out, out, mean, rstd, x, residual, weight.compute_value(),
                                  bias.compute_value(), eps);
}

void LayerNorm::backward(Tensor& din, const Tensor& dout, const Tensor& in, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dresidual) {
  ops::layernorm_backward(din, weight.grad, bias.grad, dout, in, weight.compute_value(), mean,
                          rstd, dresidual);
}

}  // namespace scalelab::nn
