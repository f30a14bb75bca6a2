#include "common/nn/attention.hpp"

#include <cmath>

#include "common/ops/flash_attention.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::nn {

namespace {
// The heads this rank keeps: their rows of q, k and v in the fused (3C, C) QKV weight.
Shard qkv_shard(int64_t n_embd, int64_t n_head, int tp_rank, int tp_size) {
  if (tp_size == 1) return {};
  const int64_t hs = n_embd / n_head, per = n_head / tp_size;
  const int64_t b = tp_rank * per * hs, e = (tp_rank + 1) * per * hs;
  return Shard{0, {{b, e}, {n_embd + b, n_embd + e}, {2 * n_embd + b, 2 * n_embd + e}}};
}

Shard proj_shard(int64_t n_embd, int64_t n_head, int tp_rank, int tp_size) {
  if (tp_size == 1) return {};
  const int64_t hs = n_embd / n_head, per = n_head / tp_size;
  return Shard{1, {{tp_rank * per * hs, (tp_rank + 1) * per * hs}}};
}
}  // namespace

CausalSelfAttention::CausalSelfAttention(const std::string& name, int64_t n_embd, int64_t n_head,
                                         int64_t n_layer, int tp_rank, int tp_size)
    : qkv(name + ".qkv", n_embd, 3 * n_embd, true, 0.02,
          qkv_shard(n_embd, n_head, tp_rank, tp_size)),
      // GPT-2 scales the init of projections into the residual stream by 1/sqrt(2 * n_layer)
      proj(name + ".proj", n_embd, n_embd, true, 0.02 / std::sqrt(2.0 * n_layer),
           proj_shard(n_embd, n_head, tp_rank, tp_size)),
      n_head_(n_head / tp_size),
      head_size_(n_embd / n_head) {
  SCALELAB_CHECK(n_embd % n_head == 0, "n_embd {} not divisible by n_head {}", n_embd, n_head);
  SCALELAB_CHECK(n_head % tp_size == 0, "n_head {} not divisible by tp {}", n_head, tp_size);
}

void CausalSelfAttention::forward(Tensor& out, const Tensor& x, AttentionActivations& a,
                                  const Mappings* m) const {
  const int64_t B = x.size(0), T = x.size(1), NH = n_head_, hs = head_size_, C = NH * hs;
  const DType dt = x.dtype();
  const Device dev = x.device();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Tensor qkv_out = Tensor::empty({B, T, 3 * C}, dt, dev);  // (B, T, 3C)
  qkv.forward(qkv_out, x);
  if (flash && !(m && m->replaces_attention())) {
    // The fused path: flash attention reads q, k, v in place in qkv_out (kept for backward) and
    // writes y with its heads already merged; one log-sum-exp per row is all else it keeps.
    a.qkv = qkv_out;
    a.y = Tensor::empty({B, T, C}, dt, dev);
    a.lse = Tensor::empty({B * NH, T}, ops::flash_attention_lse_dtype(dt), dev);
    ops::flash_attention_qkv_forward(a.y, a.lse, a.qkv, NH, scale);
    proj.forward(out, a.y);
    return;
  }
  a.q = Tensor::empty({B, NH, T, hs}, dt, dev);
  a.k = Tensor::empty({B, NH, T, hs}, dt, dev);
  a.v = Tensor::empty({B, NH, T, hs}, dt, dev);
  ops::split_heads(a.q, a.k, a.v, qkv_out, NH);
  const Tensor q = a.q.view({B * NH, T, hs}), k = a.k.view({B * NH, T, hs}),
               v = a.v.view({B * NH, T, hs});
  Tensor yh;  // (BH, T, hs)
  if (m && m->replaces_attention()) {
    // the mappings' own fused core (lab 11's ring): softmax(scale q k^T) v on (BH, T, hs)
    // heads without the (T, T) matrix; keeps lse (and more) for backward
    yh = Tensor::empty({B * NH, T, hs}, dt, dev);
    a.lse = m->attention_forward(yh, q, k, v, scale, a.kept);
  } else {
    {
      Tensor preatt = Tensor::empty({B * NH, T, T}, dt, dev);  // (BH, T, T), freed after softmax
      ops::batched_matmul(preatt, q, k, false, true);          // q @ k^T
      a.att = Tensor::empty({B * NH, T, T}, dt, dev);
      ops::causal_softmax_forward(a.att, preatt, scale);
    }
    yh = Tensor::empty({B * NH, T, hs}, dt, dev);
    ops::batched_matmul(yh, a.att, v);  // att @ v
  }
  a.y = Tensor::empty({B, T, C}, dt, dev);
  ops::merge_heads(a.y, yh.view({B, NH, T, hs}));
  proj.forward(out, a.y);
}

void CausalSelfAttention::backward(Tensor& dx, const Tensor& dout, const Tensor& x,
                                   const AttentionActivations& a, const BackwardHook* hook,
                                   const Mappings* m, InputGrad into) {
  const int64_t B = x.size(0), T = x.size(1), NH = n_head_, hs = head_size_, C = NH * hs;
  const DType dt = x.dtype();
  const Device dev = x.device();
  Tensor dy = Tensor::empty({B, T, C}, dt, dev);
  proj.backward(dy, dout, a.y, InputGrad::set);
  if (hook && *hook) (*hook)(proj.parameters());
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  if (a.qkv.defined()) {  // the fused path: gradients straight into dqkv's q, k, v columns
    Tensor dqkv = Tensor::empty({B, T, 3 * C}, dt, dev);
    ops::flash_attention_qkv_backward(dqkv, dy, a.qkv, a.y, a.lse, NH, scale);
    qkv.backward(dx, dqkv, x, into);
    if (hook && *hook) (*hook)(qkv.parameters());
    return;
  }
  Tensor dyh = Tensor::empty({B, NH, T, hs}, dt, dev);
  ops::merge_heads_backward(dyh, dy);
  const Tensor dyh3 = dyh.view({B * NH, T, hs});
  const Tensor q = a.q.view({B * NH, T, hs}), k = a.k.view({B * NH, T, hs}),
               v = a.v.view({B * NH, T, hs});
  Tensor dq = Tensor::empty({B, NH, T, hs}, dt, dev), dk = Tensor::empty({B, NH, T, hs}, dt, dev),
         dv = Tensor::empty({B, NH, T, hs}, dt, dev);
  Tensor dq3 = dq.view({B * NH, T, hs}), dk3 = dk.view({B * NH, T, hs}),
         dv3 = dv.view({B * NH, T, hs});
  if (a.lse.defined()) {  // the mappings' core (forward kept no probabilities)
    // the fused backward needs the forward's per-head output: y with its heads split again
    Tensor yh = Tensor::empty({B, NH, T, hs}, dt, dev);
    ops::merge_heads_backward(yh, a.y);
    (m ? *m : Mappings::single_device())
        .attention_backward(dq3, dk3, dv3, dyh3, q, k, v, yh.view({B * NH, T, hs}), a.lse, a.kept,
                            scale);
  } else {
    Tensor datt = Tensor::empty({B * NH, T, T}, dt, dev);
    ops::batched_matmul(datt, dyh3, v, false, true);  // datt = dy @ v^T
    ops::batched_matmul(dv3, a.att, dyh3, true, false);  // dv = att^T @ dy
    Tensor dpreatt = Tensor::empty({B * NH, T, T}, dt, dev);
    ops::causal_softmax_backward(dpreatt, a.att, datt, scale);
    ops::batched_matmul(dq3, dpreatt, k);               // dq = dpreatt @ k
    ops::batched_matmul(dk3, dpreatt, q, true, false);  // dk = dpreatt^T @ q
  }
  Tensor dqkv = Tensor::empty({B, T, 3 * C}, dt, dev);
  ops::split_heads_backward(dqkv, dq, dk, dv);
  qkv.backward(dx, dqkv, x, into);
  if (hook && *hook) (*hook)(qkv.parameters());
}

std::vector<Parameter*> CausalSelfAttention::parameters() {
  std::vector<Parameter*> p = qkv.parameters();
  for (Parameter* q : proj.parameters()) p.push_back(q);
  return p;
}

}  // namespace scalelab::nn
