#pragma once
// GPT-2's MLP: Linear(C, 4C) -> GELU (tanh) -> Linear(4C, C).
// Tensor parallel: fc keeps output rows [r*4C/tp, (r+1)*4C/tp) (column parallel), proj the
// matching input columns (row parallel); the output is then a partial sum (see attention.hpp).
#include <string>
#include <vector>

#include "common/nn/linear.hpp"

namespace scalelab::nn {

struct MLPActivations {
  Tensor h;  // (B, T, 4C) before GELU
  Tensor g;  // (B, T, 4C) after GELU: the input of proj
  void reset() { *this = MLPActivations{}; }
};

class MLP {
 public:
  MLP(const std::string& name, int64_t n_embd, int64_t n_layer, int tp_rank = 0, int tp_size = 1);
  void forward(Tensor& out, const Tensor& x, MLPActivations& acts) const;
  /// dx += ...; parameter gradients +=; `hook` after each Linear's backward.
  void backward(Tensor& dx, const Tensor& dout, const Tensor& x, const MLPActivations& acts,
                const BackwardHook* hook = nullptr);
  std::vector<Parameter*> parameters();
  Linear fc, proj;
};

}  // namespace scalelab::nn
