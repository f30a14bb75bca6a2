#include "common/nn/linear.hpp"

#include "common/ops/fused_linear.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::nn {

Linear::Linear(std::string name, int64_t in_features, int64_t out_features, bool bias,
               double std, Shard shard)
    : has_bias_(bias) {
  weight.name = name + ".weight";
  weight.full_shape = {out_features, in_features};
  weight.shard = shard;
  weight.init = Init::normal;
  weight.init_std = std;
  weight.weight_decay = true;
  if (has_bias_) {
    this->bias.name = name + ".bias";
    this->bias.full_shape = {out_features};
    this->bias.init = Init::zeros;
    // column parallel: the bias is split like the output rows; row parallel: kept whole
    if (shard.dim == 0) this->bias.shard = shard;
  }
}

void Linear::forward(Tensor& out, const Tensor& in) const {
  const Tensor x = in.view({-1, in_features()});   // (N, in)
  Tensor y = out.view({-1, out_features()});        // (N, out)
  if (has_bias_ && !row_parallel()) {
    // x @ W^T + b: on a GPU in bf16 the bias rides in the GEMM's epilogue
    ops::linear_forward(y, x, weight.compute_value(), bias.compute_value());
    return;
  }
  ops::matmul(y, x, weight.compute_value(), false, true);  // x @ W^T
  if (!row_parallel()) add_bias(out);               // row parallel: after the reduce
}

void Linear::forward_gelu(Tensor& out, Tensor& pre, const Tensor& in) const {
  SCALELAB_CHECK(!row_parallel(), "{}: GELU of a partial sum (row parallel)", weight.name);
  if (!has_bias_) {
    forward(pre, in);
    ops::gelu_forward(out, pre);
    return;
  }
  const Tensor x = in.view({-1, in_features()});  // (N, in)
  Tensor p = pre.view({-1, out_features()});       // (N, out)
  Tensor g = out.view({-1, out_features()});
  ops::linear_gelu_forward(g, p, x, weight.compute_value(), bias.compute_value());
}

void Linear::add_bias(Tensor& out) const {
  if (!has_bias_) return;
  Tensor y = out.view({-1, out_features()});
  ops::add_bias(y, bias.compute_value());
}

void Linear::backward(Tensor& din, const Tensor& dout, const Tensor& in, InputGrad into) {
  const Tensor x = in.view({-1, in_features()});     // (N, in)
  const Tensor dy = dout.view({-1, out_features()});  // (N, out)
  if (din.defined()) {
    Tensor dx = din.view({-1, in_features()});
    const double beta = into == InputGrad::add ? 1.0 : 0.0;  // beta 0: dx is never read
    ops::matmul(dx, dy, weight.compute_value(), false, false, 1.0, beta);  // dx (+)= dy @ W
  }
  parameter_backward(dy, x);
}

void Linear::backward_through_gelu(Tensor& dpre, const Tensor& dout, const Tensor& in,
                                   const Tensor& pre) {
  const Tensor x = in.view({-1, in_features()});     // (N, in) = GELU(pre)
  const Tensor dy = dout.view({-1, out_features()});  // (N, out)
  Tensor dp = dpre.view({-1, in_features()});
  ops::linear_dgelu_backward(dp, dy, weight.compute_value(), pre.view({-1, in_features()}));
  parameter_backward(dy, x);
}

void Linear::parameter_backward(const Tensor& dy, const Tensor& x) {
  // dW += dy^T @ x and db += column sums of dy (on a GPU possibly one call, fused_linear.hpp).
  // Row parallel: dy is the gradient of the reduced output, the same on every rank, so every
  // rank's copy of the bias gets the same, whole gradient.
  if (has_bias_) ops::linear_parameter_backward(weight.grad, bias.grad, dy, x);
  else ops::matmul(weight.grad, dy, x, true, false, 1.0, 1.0);
}

std::vector<Parameter*> Linear::parameters() {
  if (has_bias_) return {&weight, &bias};
  return {&weight};
}

}  // namespace scalelab::nn
