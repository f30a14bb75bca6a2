#include "common/nn/embedding.hpp"

#include "common/ops/ops.hpp"

namespace scalelab::nn {

Embedding::Embedding(int64_t vocab_size, int64_t block_size, int64_t n_embd) {
  wte.name = "wte.weight";
  wte.full_shape = {vocab_size, n_embd};
  wte.init_std = 0.02;
  wpe.name = "wpe.weight";
  wpe.full_shape = {block_size, n_embd};
  wpe.init_std = 0.02;
  // nanoGPT decays every 2-d parameter, embeddings included
  wte.weight_decay = wpe.weight_decay = true;
}

void Embedding::forward(Tensor& out, const Tensor& tokens) const {
  ops::embedding_forward(out, tokens, wte.compute_value(), wpe.compute_value());
}

void Embedding::backward(const Tensor& dout, const Tensor& tokens) {
  ops::embedding_backward(wte.grad, wpe.grad, dout, tokens);
}

}  // namespace scalelab::nn
