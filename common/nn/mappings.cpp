// The single-device mappings: the library's own ops, exactly what nn::GPT computed before it
// had hook points (so a model without parallel mappings gives the same numbers, bit for bit, and
// holds the same tensors at the same moments).
#include "common/nn/mappings.hpp"

#include "common/nn/layernorm.hpp"
#include "common/nn/moe.hpp"
#include "common/ops/flash_attention.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::nn {

void Mappings::layernorm_backward(LayerNorm& ln, Tensor& din, const Tensor& dout,
                                  const Tensor& in, const Tensor& mean, const Tensor& rstd,
                                  const Tensor& dresidual) const {
  ln.backward(din, dout, in, mean, rstd, dresidual);
}

Tensor Mappings::experts_forward(const MoE& moe, const Tensor& xd,
                                 const std::vector<int64_t>& rows_per_expert,
                                 std::vector<Tensor>& kept) const {
  return moe.run_experts(xd, rows_per_expert, kept);
}

Tensor Mappings::experts_backward(MoE& moe, const Tensor& dye,
                                  const std::vector<int64_t>& rows_per_expert,
                                  const std::vector<Tensor>& kept) const {
  return moe.run_experts_backward(dye, rows_per_expert, kept);
}

Tensor Mappings::attention_forward(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v,
                                   double scale, std::vector<Tensor>& /*kept*/) const {
  Tensor lse = Tensor::empty({q.size(0), q.size(1)}, ops::flash_attention_lse_dtype(q.dtype()),
                             q.device());  // (BH, T)
  ops::flash_attention_forward(y, lse, q, k, v, scale);
  return lse;
}

void Mappings::attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dy,
                                  const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& y, const Tensor& lse,
                                  const std::vector<Tensor>& /*kept*/, double scale) const {
  ops::flash_attention_backward(dq, dk, dv, dy, q, k, v, y, lse, scale);
}

// One device holds every vocabulary row (lo = 0): GPT refuses a vocabulary-sharded model
// with these mappings before it calls them.
Tensor Mappings::embedding_forward(const Tensor& wte, int64_t /*lo*/, const Tensor& wpe,
                                   const Tensor& tokens) const {
  Tensor out = Tensor::empty({tokens.size(0), tokens.size(1), wte.size(1)}, wte.dtype(),
                             wte.device());  // (B, T, C)
  ops::embedding_forward(out, tokens, wte, wpe);
  return out;
}

void Mappings::embedding_backward(Tensor& dwte, int64_t /*lo*/, Tensor& dwpe, const Tensor& dout,
                                  const Tensor& tokens) const {
  ops::embedding_backward(dwte, dwpe, dout, tokens);
}

Scalar Mappings::cross_entropy(Tensor& logits, const Tensor& targets, int64_t /*lo*/) const {
  const int64_t N = logits.size(0);
  Tensor probs = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  Tensor losses = Tensor::empty({N}, ops::stats_dtype(logits.dtype()), logits.device());
  ops::cross_entropy_forward(losses, probs, logits, targets);
  logits = probs;  // the logits' buffer goes back to the allocator with the caller's last handle
  Tensor mean = Tensor::empty({1}, DType::f64, logits.device());
  ops::sum_into(mean, losses, static_cast<double>(N));  // stays on the device: no read here
  return Scalar(mean);
}

void Mappings::cross_entropy_backward(Tensor& probs, const Tensor& targets, int64_t /*lo*/,
                                      double scale) const {
  const int64_t N = probs.size(0);
  Tensor dlogits = Tensor::empty(probs.shape(), probs.dtype(), probs.device());
  ops::cross_entropy_backward(dlogits, probs, targets, scale / static_cast<double>(N));
  probs = dlogits;
}

const Mappings& Mappings::single_device() {
  static const Mappings one;
  return one;
}

}  // namespace scalelab::nn
