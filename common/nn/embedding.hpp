#pragma once
// Token embedding (wte, V x C) plus learned position embedding (wpe, block_size x C), as GPT-2.
// wte doubles as the LM head's weight when the head is tied (GPT).
#include <vector>

#include "common/nn/parameter.hpp"

namespace scalelab::nn {

class Embedding {
 public:
  Embedding(int64_t vocab_size, int64_t block_size, int64_t n_embd);
  /// out (B, T, C) = wte[tokens] + wpe[0..T)
  void forward(Tensor& out, const Tensor& tokens) const;
  /// dwte, dwpe += from dout (B, T, C)
  void backward(const Tensor& dout, const Tensor& tokens);
  std::vector<Parameter*> parameters() { return {&wte, &wpe}; }
  Parameter wte, wpe;
};

}  // namespace scalelab::nn
