#pragma once
/// @file layernorm.hpp
/// LayerNorm over the last dimension, with learned scale and shift (PyTorch's nn.LayerNorm,
/// eps 1e-5). The caller keeps the saved statistics (mean, rstd), so it decides their lifetime.
#include <string>
#include <vector>

#include "common/nn/parameter.hpp"

namespace scalelab::nn {

/// LayerNorm over the last dimension: per row, (x - mean) / std, then scale and shift.
class LayerNorm {
 public:
  /// Parameters `name`.weight (ones) and `name`.bias (zeros), each (features).
  LayerNorm(std::string name, int64_t features);
  /// out (N, C), mean (N), rstd (N) from in (N, C)
  void forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& in) const;
  /// The residual add and this LayerNorm in one pass (ops::residual_layernorm_forward): res_out
  /// = x + residual (the next residual stream), out = LayerNorm(res_out); the same numbers as
  /// ops::add then forward. Backward is unchanged (on res_out).
  void forward_residual(Tensor& res_out, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                        const Tensor& residual) const;
  /// din += ..., dweight += ..., dbias += ... from dout (N, C). Given the residual's gradient
  /// (`dresidual`, (N, C)), din = dresidual + ... instead: a block's skip path added in the same
  /// pass (ops::layernorm_backward).
  void backward(Tensor& din, const Tensor& dout, const Tensor& in, const Tensor& mean,
                const Tensor& rstd, const Tensor& dresidual = Tensor());
  /// weight, then bias.
  std::vector<Parameter*> parameters() { return {&weight, &bias}; }
  Parameter weight;   ///< the per-feature scale
  Parameter bias;     ///< the per-feature shift
  double eps = 1e-5;  ///< added to the variance before the square root
};

}  // namespace scalelab::nn
