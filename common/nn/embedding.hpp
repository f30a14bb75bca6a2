#pragma once
/// @file embedding.hpp
/// Token embedding (wte, V x C) plus learned position embedding (wpe, block_size x C), as GPT-2.
/// wte doubles as the LM head's weight when the head is tied (GPT).
#include <vector>

#include "common/nn/parameter.hpp"

namespace scalelab::nn {

/// GPT-2's input: each token's row of wte plus its position's row of wpe.
class Embedding {
 public:
  /// wte (vocab_size, n_embd) and wpe (block_size, n_embd), named "wte.weight" and "wpe.weight".
  Embedding(int64_t vocab_size, int64_t block_size, int64_t n_embd);
  /// out (B, T, C) = wte[tokens] + wpe[0..T)
  void forward(Tensor& out, const Tensor& tokens) const;
  /// dwte, dwpe += from dout (B, T, C)
  void backward(const Tensor& dout, const Tensor& tokens);
  /// wte, then wpe.
  std::vector<Parameter*> parameters() { return {&wte, &wpe}; }
  Parameter wte;  ///< the token embedding (V, C), tied to the LM head
  Parameter wpe;  ///< the position embedding (block_size, C)
};

}  // namespace scalelab::nn
