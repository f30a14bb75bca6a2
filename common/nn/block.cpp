#include "common/nn/block.hpp"

#include "common/ops/ops.hpp"

namespace scalelab::nn {

std::size_t BlockActivations::nbytes() const {
  std::size_t n = 0;
  for (const Tensor* t : {&ln1, &ln1_mean, &ln1_rstd, &attn.q, &attn.k, &attn.v, &attn.att,
                          &attn.lse, &attn.y, &res2, &ln2, &ln2_mean, &ln2_rstd, &mlp.h, &mlp.g})
    if (t->defined()) n += t->nbytes();
  return n;
}

namespace {
std::string prefix(int i) { return "blocks." + std::to_string(i); }
}  // namespace

Block::Block(int i, int64_t n_embd, int64_t n_head, int64_t n_layer, int tp_rank, int tp_size)
    : index(i),
      ln1(prefix(i) + ".ln1", n_embd),
      attn(prefix(i) + ".attn", n_embd, n_head, n_layer, tp_rank, tp_size),
      ln2(prefix(i) + ".ln2", n_embd),
      mlp(prefix(i) + ".mlp", n_embd, n_layer, tp_rank, tp_size) {}

Tensor Block::forward(const Tensor& x, BlockActivations& a) const {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const DType dt = x.dtype();
  const Device dev = x.device();
  // what the layers read (the bf16 copy in mixed precision: ZeRO-3 in bf16 binds only that)
  SCALELAB_CHECK(ln1.weight.compute_value().defined(), "block {}'s parameters are released: "
                 "gather them before its forward (ZeRO-3)", index);
  a.reset();
  a.ln1 = Tensor::empty({B, T, C}, dt, dev);
  a.ln1_mean = Tensor::empty({B * T}, ops::stats_dtype(dt), dev);  // f32 for bf16 data
  a.ln1_rstd = Tensor::empty({B * T}, ops::stats_dtype(dt), dev);
  ln1.forward(a.ln1, a.ln1_mean, a.ln1_rstd, x);
  a.res2 = Tensor::empty({B, T, C}, dt, dev);
  {
    Tensor attn_out = Tensor::empty({B, T, C}, dt, dev);
    attn.forward(attn_out, a.ln1, a.attn);
    if (reduce_forward) reduce_forward(attn_out);  // g: sum the heads' partial outputs
    if (attn.proj.row_parallel()) attn.proj.add_bias(attn_out);  // once, after g
    a.ln2 = Tensor::empty({B, T, C}, dt, dev);
    a.ln2_mean = Tensor::empty({B * T}, ops::stats_dtype(dt), dev);  // f32 for bf16 data
    a.ln2_rstd = Tensor::empty({B * T}, ops::stats_dtype(dt), dev);
    // res2 = x + attn_out and ln2 = LayerNorm(res2) in one pass over the rows
    ln2.forward_residual(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, attn_out);
  }
  Tensor out = Tensor::empty({B, T, C}, dt, dev);
  mlp.forward(out, a.ln2, a.mlp);
  if (reduce_forward) reduce_forward(out);
  if (mlp.proj.row_parallel()) mlp.proj.add_bias(out);
  ops::add(out, out, a.res2);
  return out;
}

Tensor Block::backward(const Tensor& dout, const Tensor& x, const BlockActivations& a,
                       const BackwardHook* hook) {
  SCALELAB_CHECK(a.defined(), "block {} backward without activations (forward first, or "
                 "recompute them after reset())", index);
  SCALELAB_CHECK((a.attn.att.defined() || a.attn.lse.defined()) && a.mlp.g.defined(),
                 "block {} backward without its "
                 "attention probabilities or GELU output (recompute the selective pieces first)",
                 index);
  SCALELAB_CHECK(ln1.weight.compute_value().defined() && ln1.weight.grad.defined(),
                 "block {}'s parameters "
                 "or gradients are released: bind them before its backward (ZeRO-2/3)", index);
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const DType dt = x.dtype();
  const Device dev = x.device();
  // second residual: dres2 = dout + (through ln2 and the MLP)
  Tensor dres2 = dout.clone();
  {
    Tensor dln2 = Tensor::zeros({B, T, C}, dt, dev);
    mlp.backward(dln2, dout, a.ln2, a.mlp, hook);
    if (reduce_backward) reduce_backward(dln2);
    ln2.backward(dres2, dln2, a.res2, a.ln2_mean, a.ln2_rstd);
    if (hook && *hook) (*hook)(ln2.parameters());
  }
  // first residual: dx = dres2 + (through ln1 and attention)
  Tensor dx = dres2.clone();
  {
    Tensor dln1 = Tensor::zeros({B, T, C}, dt, dev);
    attn.backward(dln1, dres2, a.ln1, a.attn, hook);
    if (reduce_backward) reduce_backward(dln1);
    ln1.backward(dx, dln1, x, a.ln1_mean, a.ln1_rstd);
    if (hook && *hook) (*hook)(ln1.parameters());
  }
  return dx;
}

std::vector<Parameter*> Block::parameters() {
  std::vector<Parameter*> p = ln1.parameters();
  for (Parameter* q : attn.parameters()) p.push_back(q);
  for (Parameter* q : ln2.parameters()) p.push_back(q);
  for (Parameter* q : mlp.parameters()) p.push_back(q);
  return p;
}

}  // namespace scalelab::nn
