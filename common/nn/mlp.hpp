#pragma once
/// @file mlp.hpp
/// GPT-2's MLP: Linear(C, 4C) -> GELU (tanh) -> Linear(4C, C).
/// Tensor parallel: fc keeps a contiguous 1/tp of its output rows (column parallel), proj the
/// matching input columns (row parallel); the output is then a partial sum (see attention.hpp).
#include <string>
#include <vector>

#include "common/nn/linear.hpp"

namespace scalelab::nn {

/// What the MLP's forward saves for its backward.
struct MLPActivations {
  Tensor h;  ///< (B, T, 4C) before GELU (4C/tp under tensor parallelism)
  Tensor g;  ///< (B, T, 4C) after GELU: the input of proj
  /// Frees both.
  void reset() { *this = MLPActivations{}; }
};

/// GPT-2's MLP sub-layer; holds its weights (or a tensor-parallel rank's units of them).
class MLP {
 public:
  /// Parameters `name`.fc (4C, C) and `name`.proj (C, 4C) with biases; n_layer scales proj's
  /// initial values; tp_rank / tp_size: its hidden units.
  MLP(const std::string& name, int64_t n_embd, int64_t n_layer, int tp_rank = 0, int tp_size = 1);
  /// out (B, T, C) from x (B, T, C); fills `acts`. Under tensor parallelism out is a partial sum
  /// without proj's bias.
  void forward(Tensor& out, const Tensor& x, MLPActivations& acts) const;
  /// dx += ... (`into` set: dx = ...); parameter gradients +=; `hook` after each Linear's
  /// backward.
  void backward(Tensor& dx, const Tensor& dout, const Tensor& x, const MLPActivations& acts,
                const BackwardHook* hook = nullptr, InputGrad into = InputGrad::add);
  /// fc's, then proj's.
  std::vector<Parameter*> parameters();
  Linear fc;    ///< C -> 4C (column parallel under tp)
  Linear proj;  ///< 4C -> C (row parallel under tp)
};

}  // namespace scalelab::nn
