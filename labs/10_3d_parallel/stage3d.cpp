// Lab 10, given: the 3D stage. An nn::GPT whose ends are vocabulary parallel over the tp group
// (lab 07 step 4) and whose blocks may be checkpointed (lab 06). Not an exercise: read it to see
// how lab 07's functions slot into the pieces lab 08's executor calls.
#include "3d_parallel.hpp"

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"

namespace scalelab::lab10 {

Stage3D::Stage3D(const ModelConfig& config, const nn::GPTOptions& options, comm::Communicator& tp,
                 bool checkpoint)
    : nn::GPT(config, options), tp_(tp), checkpoint_(checkpoint) {
  // A 1-rank group with tp_size > 1 builds one rank's shapes for measuring sizes (the planner's
  // tests): its numbers are partial, nothing is summed.
  SCALELAB_CHECK(tp.size() == 1 || (options.tp_rank == tp.rank() && options.tp_size == tp.size()),
                 "a 3D stage of tp rank {} of {} on a tp group where it is rank {} of {}",
                 options.tp_rank, options.tp_size, tp.rank(), tp.size());
}

// wte[tokens] for the tokens of this rank's rows (zeros for the others), all-reduced over tp,
// plus wpe: every tp rank gets the whole (B, T, C) embedding.
Tensor Stage3D::embed(const Tensor& tokens, nn::GPTActivations& acts) const {
  SCALELAB_CHECK(has_embedding(), "embed() on a stage without the embedding");
  trace::Scope scope("embed");
  need_values(embedding_unit());
  acts.tokens = tokens;
  // the compute copies: bf16 in mixed precision (the output is then bf16, as nn::GPT's)
  return lab07::vocab_parallel_embedding_forward(embedding->wte.compute_value(), vocab_lo(),
                                                 embedding->wpe.compute_value(), tokens, tp_);
}

void Stage3D::embed_backward(const Tensor& dx, nn::GPTActivations& acts) {
  SCALELAB_CHECK(acts.tokens.defined(), "embed_backward() without embed()");
  need_grads(embedding_unit());
  // dx is the same on every tp rank: each adds the rows of the tokens it holds, no communication
  // (mixed precision: bf16 dx into the fp32 gradients)
  lab07::vocab_parallel_embedding_backward(embedding->wte.grad, vocab_lo(), embedding->wpe.grad,
                                           dx, acts.tokens);
  acts.tokens = Tensor();
  fire(embedding->parameters());
}

// ln_f on the whole (B, T, C) (every tp rank), then the head as a column-parallel Linear over the
// vocabulary: f (identity forward), this rank's V/tp logit columns, the vocabulary-parallel
// cross-entropy (3 all-reduces of B*T). acts.head.probs holds this rank's (B*T, V/tp) columns of
// the softmax: the head's largest activation is 1/tp of the single device's.
double Stage3D::head_forward(const Tensor& x, const Tensor& targets,
                             nn::GPTActivations& acts) const {
  SCALELAB_CHECK(has_head(), "head_forward() on a stage without the head");
  trace::Scope scope("head");
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), Vl = vocab_hi() - vocab_lo();
  const DType dt = compute_dtype();  // bf16 activations in mixed precision
  need_values(head_unit());
  if (!lm_head) need_values(embedding_unit());  // the tied wte (its rows [lo, hi))
  nn::HeadActivations& h = acts.head;
  h.x = x;
  h.targets = targets;
  h.lnf = Tensor::empty({B, T, C}, dt, device());
  h.lnf_mean = Tensor::empty({B * T}, ops::stats_dtype(dt), device());  // fp32 for bf16
  h.lnf_rstd = Tensor::empty({B * T}, ops::stats_dtype(dt), device());
  ln_f->forward(h.lnf, h.lnf_mean, h.lnf_rstd, x);
  Tensor in = h.lnf.view({B * T, C});
  lab07::f_forward(in, tp_);
  h.probs = Tensor::empty({B * T, Vl}, dt, device());  // logits, then softmax, in place
  ops::matmul(h.probs, in, head_weight(), false, true);      // (B*T, V/tp) = lnf @ W_local^T
  return lab07::vocab_parallel_cross_entropy(h.probs, targets.view({B * T}), vocab_lo(), tp_);
}

Tensor Stage3D::head_backward(nn::GPTActivations& acts, double loss_scale) {
  nn::HeadActivations& h = acts.head;
  SCALELAB_CHECK(h.probs.defined(), "head_backward() without head_forward()");
  trace::Scope scope("head backward");
  const int64_t B = h.x.size(0), T = h.x.size(1), C = h.x.size(2);
  const DType dt = compute_dtype();
  need_values(head_unit());
  need_grads(head_unit());
  if (!lm_head) {  // the head writes the tied wte's gradient first
    need_values(embedding_unit());
    need_grads(embedding_unit());
  }
  // in place: probs (B*T, V/tp) becomes dlogits of this rank's columns
  lab07::vocab_parallel_cross_entropy_backward(h.probs, h.targets.view({B * T}), vocab_lo(),
                                               loss_scale);
  const Tensor& dlogits = h.probs;
  Tensor dlnf = Tensor::zeros({B, T, C}, dt, device());
  Tensor dlnf2 = dlnf.view({B * T, C});
  ops::matmul(dlnf2, dlogits, head_weight());  // this rank's columns' part of dlnf
  ops::matmul(head_grad(), dlogits, h.lnf.view({B * T, C}), true, false, 1.0, 1.0);  // dW_local +=
  h.probs = Tensor();
  if (lm_head) fire({&*lm_head});
  lab07::f_backward(dlnf, tp_);  // the whole dlnf: every rank's vocabulary columns contribute
  Tensor dx = Tensor::zeros({B, T, C}, dt, device());
  ln_f->backward(dx, dlnf, h.x, h.lnf_mean, h.lnf_rstd);
  fire(ln_f->parameters());
  h.reset();
  return dx;
}

// Checkpointing (lab 06): the forward keeps each block's input only; the block's activations go
// out of scope as soon as its output is computed.
Tensor Stage3D::forward_blocks(const Tensor& x, nn::GPTActivations& acts) const {
  if (!checkpoint_) return nn::GPT::forward_blocks(x, acts);
  const std::size_t n = blocks_.size();
  acts.inputs.assign(n, Tensor());
  acts.blocks.assign(n, nn::BlockActivations());  // stay empty until the backward recomputes
  Tensor h = x;
  for (std::size_t i = 0; i < n; ++i) {
    need_values(block_unit(first_block() + static_cast<int>(i)));
    acts.inputs[i] = h;
    nn::BlockActivations dropped;
    h = blocks_[i]->forward(h, dropped);
  }
  return h;
}

// ... and the backward recomputes one block's forward from its input right before that block's
// backward, so one block's activations exist at a time.
Tensor Stage3D::backward_blocks(const Tensor& dout, nn::GPTActivations& acts) {
  if (!checkpoint_) return nn::GPT::backward_blocks(dout, acts);
  SCALELAB_CHECK(acts.inputs.size() == blocks_.size(), "backward_blocks() with the inputs of {} "
                 "blocks; this stage has {}", acts.inputs.size(), blocks_.size());
  const nn::BackwardHook* hook = backward_hook() ? &backward_hook() : nullptr;
  Tensor d = dout;
  for (int i = static_cast<int>(blocks_.size()) - 1; i >= 0; --i) {
    need_values(block_unit(first_block() + i));
    need_grads(block_unit(first_block() + i));
    {
      trace::Scope scope("recompute");
      blocks_[i]->forward(acts.inputs[i], acts.blocks[i]);  // the output is not needed again
    }
    d = blocks_[i]->backward(d, acts.inputs[i], acts.blocks[i], hook);
    acts.blocks[i].reset();
    acts.inputs[i] = Tensor();
  }
  acts.blocks.clear();
  acts.inputs.clear();
  return d;
}

}  // namespace scalelab::lab10
