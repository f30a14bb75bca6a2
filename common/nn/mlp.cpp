#include "common/nn/mlp.hpp"

#include <cmath>

#include "common/ops/ops.hpp"

namespace scalelab::nn {

namespace {
Shard hidden_shard(int64_t hidden, int tp_rank, int tp_size, int dim) {
  if (tp_size == 1) return {};
  const int64_t per = hidden / tp_size;
  return Shard{dim, {{tp_rank * per, (tp_rank + 1) * per}}};
}
}  // namespace

MLP::MLP(const std::string& name, int64_t n_embd, int64_t n_layer, int tp_rank, int tp_size)
    : fc(name + ".fc", n_embd, 4 * n_embd, true, 0.02, hidden_shard(4 * n_embd, tp_rank, tp_size, 0)),
      proj(name + ".proj", 4 * n_embd, n_embd, true, 0.02 / std::sqrt(2.0 * n_layer),
           hidden_shard(4 * n_embd, tp_rank, tp_size, 1)) {
  SCALELAB_CHECK((4 * n_embd) % tp_size == 0, "4*n_embd {} not divisible by tp {}", 4 * n_embd,
                 tp_size);
}

void MLP::forward(Tensor& out, const Tensor& x, MLPActivations& a) const {
  std::vector<int64_t> shape = x.shape();
  shape.back() = fc.out_features();
  a.h = Tensor::empty(shape, x.dtype(), x.device());
  a.g = Tensor::empty(shape, x.dtype(), x.device());
  fc.forward_gelu(a.g, a.h, x);  // h = x W^T + b, g = GELU(h): one GEMM with its epilogue on a GPU
  proj.forward(out, a.g);
}

void MLP::backward(Tensor& dx, const Tensor& dout, const Tensor& x, const MLPActivations& a,
                   const BackwardHook* hook, InputGrad into) {
  // dh = (dout @ W_proj) * GELU'(h): the gradient of g = GELU(h) is never stored on a GPU
  // (cuBLASLt's DGELU epilogue), a matmul then gelu_backward elsewhere
  Tensor dh = Tensor::empty(a.h.shape(), x.dtype(), x.device());
  proj.backward_through_gelu(dh, dout, a.g, a.h);
  if (hook && *hook) (*hook)(proj.parameters());
  fc.backward(dx, dh, x, into);
  if (hook && *hook) (*hook)(fc.parameters());
}

std::vector<Parameter*> MLP::parameters() {
  std::vector<Parameter*> p = fc.parameters();
  for (Parameter* q : proj.parameters()) p.push_back(q);
  return p;
}

}  // namespace scalelab::nn
