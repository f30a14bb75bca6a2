#include "common/nn/block.hpp"

#include "common/ops/ops.hpp"

namespace scalelab::nn {

std::size_t BlockActivations::nbytes() const {
  std::size_t n = 0;
  for (const Tensor* t : {&ln1, &ln1_mean, &ln1_rstd, &attn.q, &attn.k, &attn.v, &attn.qkv,
                          &attn.att, &attn.lse, &attn.y, &res2, &ln2, &ln2_mean, &ln2_rstd, &mlp.h,
                          &mlp.g})
    if (t->defined()) n += t->nbytes();
  for (const Tensor& t : attn.kept)
    if (t.defined()) n += t.nbytes();
  return n + moe.nbytes();
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

namespace {
// The full rows a region computes on, viewed as (B, T, C): the rows themselves (B, T, C), or the
// gathered (N, C) of sequence parallelism with T = seq_len.
Tensor as_batch(const Tensor& full, int64_t seq_len) {
  if (full.dim() == 3) return full;
  const int64_t C = full.size(1), N = full.size(0);
  SCALELAB_CHECK(seq_len > 0 && N % seq_len == 0, "a block's region of {} rows needs the "
                 "sequence length (got {})", N, seq_len);
  return full.view({N / seq_len, seq_len, C});
}
}  // namespace

Tensor Block::forward(const Tensor& x, BlockActivations& a, int64_t seq_len) const {
  const Mappings& m = mappings ? *mappings : Mappings::single_device();
  const int64_t C = x.size(-1), n = x.numel() / C;  // this rank's rows
  const DType dt = x.dtype();
  const Device dev = x.device();
  // what the layers read (the bf16 copy in mixed precision: ZeRO-3 in bf16 binds only that)
  SCALELAB_CHECK(ln1.weight.compute_value().defined(), "block {}'s parameters are released: "
                 "gather them before its forward (ZeRO-3)", index);
  a.reset();
  a.ln1 = Tensor::empty(x.shape(), dt, dev);
  a.ln1_mean = Tensor::empty({n}, ops::stats_dtype(dt), dev);  // f32 for bf16 data
  a.ln1_rstd = Tensor::empty({n}, ops::stats_dtype(dt), dev);
  ln1.forward(a.ln1, a.ln1_mean, a.ln1_rstd, x);
  a.res2 = Tensor::empty(x.shape(), dt, dev);
  {
    const Tensor in = as_batch(m.enter(a.ln1), seq_len);  // (B, T, C): f, or all-gather
    Tensor partial = Tensor::empty(in.shape(), dt, dev);
    attn.forward(partial, in, a.attn, &m);
    Tensor attn_out = m.leave(partial);  // g: sum the heads' partial outputs (or reduce-scatter)
    if (attn.proj.row_parallel()) attn.proj.add_bias(attn_out);  // once, after the sum
    a.ln2 = Tensor::empty(x.shape(), dt, dev);
    a.ln2_mean = Tensor::empty({n}, ops::stats_dtype(dt), dev);  // f32 for bf16 data
    a.ln2_rstd = Tensor::empty({n}, ops::stats_dtype(dt), dev);
    // res2 = x + attn_out and ln2 = LayerNorm(res2) in one pass over the rows
    ln2.forward_residual(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, attn_out.view(x.shape()));
  }
  const Tensor in = as_batch(m.enter(a.ln2), seq_len);
  Tensor partial = Tensor::empty(in.shape(), dt, dev);
  if (moe) moe->forward(partial, in, a.moe, m);  // dropped tokens: 0 here, the residual below
  else mlp.forward(partial, in, a.mlp);
  Tensor out = m.leave(partial).view(x.shape());
  if (mlp.proj.row_parallel()) mlp.proj.add_bias(out);
  ops::add(out, out, a.res2);
  return out;
}

Tensor Block::backward(const Tensor& dout, const Tensor& x, const BlockActivations& a,
                       const BackwardHook* hook, int64_t seq_len, double loss_scale) {
  SCALELAB_CHECK(a.defined(), "block {} backward without activations (forward first, or "
                 "recompute them after reset())", index);
  SCALELAB_CHECK((a.attn.att.defined() || a.attn.lse.defined()) &&
                     (moe ? a.moe.ye.defined() : a.mlp.g.defined()),
                 "block {} backward without its "
                 "attention probabilities or GELU output (recompute the selective pieces first)",
                 index);
  SCALELAB_CHECK(ln1.weight.compute_value().defined() && ln1.weight.grad.defined(),
                 "block {}'s parameters "
                 "or gradients are released: bind them before its backward (ZeRO-2/3)", index);
  const Mappings& m = mappings ? *mappings : Mappings::single_device();
  const DType dt = x.dtype();
  const Device dev = x.device();
  // second residual: dres2 = dout + (through ln2 and the MLP); ln2's backward adds the two, so
  // dres2 is set there, not copied from dout first
  Tensor dres2 = Tensor::empty(dout.shape(), dt, dev);
  {
    const Tensor dmlp = as_batch(m.leave_backward(dout), seq_len);  // g's backward: the same
    const Tensor in = as_batch(m.enter(a.ln2), seq_len);  // sequence parallel: gathered again
    Tensor dln2;  // the MLP sets it (no zero-fill); the MoE's experts add into it
    if (moe) {
      dln2 = Tensor::zeros(in.shape(), dt, dev);
      moe->backward(dln2, dmlp, a.moe, m, loss_scale);
      if (hook && *hook) (*hook)(moe->parameters());
    } else {
      dln2 = Tensor::empty(in.shape(), dt, dev);
      mlp.backward(dln2, dmlp, in, a.mlp, hook, InputGrad::set);
    }
    const Tensor dln2_rows = m.enter_backward(dln2).view(x.shape());  // f's backward: the sum
    m.layernorm_backward(ln2, dres2, dln2_rows, a.res2, a.ln2_mean, a.ln2_rstd, dout);
    if (hook && *hook) (*hook)(ln2.parameters());
  }
  // first residual: dx = dres2 + (through ln1 and attention), set by ln1's backward
  Tensor dx = Tensor::empty(dres2.shape(), dt, dev);
  {
    const Tensor dattn = as_batch(m.leave_backward(dres2), seq_len);
    const Tensor in = as_batch(m.enter(a.ln1), seq_len);
    Tensor dln1 = Tensor::empty(in.shape(), dt, dev);  // set by attention's backward
    attn.backward(dln1, dattn, in, a.attn, hook, &m, InputGrad::set);
    const Tensor dln1_rows = m.enter_backward(dln1).view(x.shape());
    m.layernorm_backward(ln1, dx, dln1_rows, x, a.ln1_mean, a.ln1_rstd, dres2);
    if (hook && *hook) (*hook)(ln1.parameters());
  }
  return dx;
}

std::vector<Parameter*> Block::parameters() {
  std::vector<Parameter*> p = ln1.parameters();
  for (Parameter* q : attn.parameters()) p.push_back(q);
  for (Parameter* q : ln2.parameters()) p.push_back(q);
  for (Parameter* q : moe ? moe->parameters() : mlp.parameters()) p.push_back(q);
  return p;
}

}  // namespace scalelab::nn
