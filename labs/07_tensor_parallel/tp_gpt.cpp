// Lab 07, given: the wiring of the steps into a GPT (TPGPT), what its forward keeps, and the
// LayerNorm backward of sequence parallelism. Not an exercise: read it to see where each of
// your functions is called.
#include "tensor_parallel.hpp"

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"

namespace scalelab::lab07 {

// LayerNorm backward on this rank's rows, whose weight and bias gradients are partial sums over
// the ranks' rows: computed apart, all-reduced, then added (the gradients accumulate).
void layernorm_backward_rows(nn::LayerNorm& ln, Tensor& din, const Tensor& dout, const Tensor& in,
                             const Tensor& mean, const Tensor& rstd, comm::Communicator& tp) {
  // in the gradients' dtype (fp32 also in mixed precision: ops rule R6)
  Tensor dw = Tensor::zeros(ln.weight.grad.shape(), ln.weight.grad.dtype(), din.device());
  Tensor db = Tensor::zeros(ln.bias.grad.shape(), ln.bias.grad.dtype(), din.device());
  ops::layernorm_backward(din, dw, db, dout, in, ln.weight.compute_value(), mean, rstd);
  tp.all_reduce(dw);
  tp.all_reduce(db);
  ops::add(ln.weight.grad, ln.weight.grad, dw);
  ops::add(ln.bias.grad, ln.bias.grad, db);
}

std::size_t SPBlockActivations::nbytes() const {
  std::size_t n = 0;
  for (const Tensor* t : {&ln1, &ln1_mean, &ln1_rstd, &attn.q, &attn.k, &attn.v, &attn.att,
                          &attn.y, &res2, &ln2, &ln2_mean, &ln2_rstd, &mlp.h, &mlp.g})
    if (t->defined()) n += t->nbytes();
  return n;
}

// ---- The tensor-parallel GPT ----------------------------------------------------------------

std::size_t TPActivations::nbytes() const {
  std::size_t n = 0;
  for (const nn::BlockActivations& a : blocks) n += a.nbytes();
  for (const SPBlockActivations& a : sp_blocks) n += a.nbytes();
  for (const Tensor* t : {&x, &lnf, &lnf_mean, &lnf_rstd, &probs})
    if (t->defined()) n += t->nbytes();
  for (const Tensor& t : inputs)
    if (t.defined()) n += t.nbytes();
  return n;
}

TPGPT::TPGPT(const ModelConfig& config, comm::Communicator& tp, const TPOptions& options)
    : ln_f("ln_f", config.n_embd), config_(config), tp_(tp), sp_(options.sequence_parallel) {
  const int rank = tp.rank(), size = tp.size();
  check_tp(config, size);
  vocab = vocab_range(config.vocab_size, rank, size);
  // the same names and init as nn::Embedding, so the values are the single-device ones
  wte.name = "wte.weight";
  wte.full_shape = {config.vocab_size, config.n_embd};
  wte.shard = nn::Shard{0, {{vocab.lo, vocab.hi}}};
  wpe.name = "wpe.weight";
  wpe.full_shape = {config.block_size, config.n_embd};
  wte.init_std = wpe.init_std = 0.02;
  wte.weight_decay = wpe.weight_decay = true;
  std::vector<nn::Parameter*> order = {&wte, &wpe};
  for (int i = 0; i < config.n_layer; ++i) {
    blocks_.push_back(make_block(i, config, rank, size));
    make_tensor_parallel(*blocks_.back(), tp_);
    for (nn::Parameter* p : blocks_.back()->parameters()) order.push_back(p);
  }
  for (nn::Parameter* p : ln_f.parameters()) order.push_back(p);
  nn::StorageOptions storage;
  storage.compute_dtype = options.compute_dtype;  // bf16: mixed precision (a bf16 compute copy)
  params_.bind(order, options.dtype, options.device, options.seed, {}, storage);
}

Tensor TPGPT::embed(const Tensor& tokens, TPActivations& acts) {
  trace::Scope scope("embed");
  acts.tokens = tokens;
  Tensor x = vocab_parallel_embedding_forward(wte.compute_value(), vocab.lo,
                                              wpe.compute_value(), tokens, tp_);
  if (!sp_) return x;
  // Sequence parallel: keep our token rows. (Megatron reduce-scatters the embedding's partial
  // lookup here; this reuses step 4's all-reduce and takes the rows: the same numbers.)
  const int64_t C = x.size(2);
  const TokenRange rows = sequence_rows(tokens.numel(), tp_.rank(), tp_.size());
  return x.view({tokens.numel(), C}).rows(rows.lo, rows.hi).clone();  // (N/tp, C)
}

Tensor TPGPT::forward_blocks(const Tensor& x, TPActivations& acts) {
  acts.inputs.assign(blocks_.size(), Tensor());
  if (sp_) acts.sp_blocks.assign(blocks_.size(), SPBlockActivations());
  else acts.blocks.assign(blocks_.size(), nn::BlockActivations());
  const int64_t B = acts.tokens.size(0), T = acts.tokens.size(1);
  Tensor h = x;
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    trace::Scope scope("block forward");
    acts.inputs[i] = h;
    if (sp_) h = sp_block_forward(*blocks_[i], h, B, T, acts.sp_blocks[i], tp_);  // 2 AG + 2 RS
    else h = blocks_[i]->forward(h, acts.blocks[i]);  // 2 all-reduces (the hooks)
  }
  return h;
}

double TPGPT::head_forward(const Tensor& x, const Tensor& targets, TPActivations& acts) {
  trace::Scope scope("head");
  const int64_t B = targets.size(0), T = targets.size(1), C = config_.n_embd,
                Vl = vocab.hi - vocab.lo;
  const int64_t n = sp_ ? B * T / tp_.size() : B * T;  // rows ln_f runs on
  const DType dt = x.dtype();
  acts.x = x;
  acts.targets = targets;
  const Device dev = x.device();
  acts.lnf = Tensor::empty({n, C}, dt, dev);
  acts.lnf_mean = Tensor::empty({n}, ops::stats_dtype(dt), dev);  // fp32 for bf16 activations
  acts.lnf_rstd = Tensor::empty({n}, ops::stats_dtype(dt), dev);
  ln_f.forward(acts.lnf, acts.lnf_mean, acts.lnf_rstd, x.view({n, C}));
  // The tied head is a column-parallel Linear over the vocabulary: f (sequence parallel: the
  // gather of the rows), then our V/tp columns.
  Tensor in = acts.lnf;
  if (sp_) in = gather_sequence(acts.lnf, tp_);  // (B*T, C), not kept
  else f_forward(in, tp_);
  acts.probs = Tensor::empty({B * T, Vl}, dt, dev);                  // (B*T, V/tp)
  ops::matmul(acts.probs, in, wte.compute_value(), false, true);     // logits = lnf @ wte^T
  return vocab_parallel_cross_entropy(acts.probs, targets.view({B * T}), vocab.lo, tp_);
}

double TPGPT::forward(const Tensor& tokens, const Tensor& targets, TPActivations& acts) {
  acts.reset();
  return head_forward(forward_blocks(embed(tokens, acts), acts), targets, acts);
}

void TPGPT::backward(TPActivations& acts, double loss_scale) {
  SCALELAB_CHECK(acts.probs.defined(), "TPGPT::backward without forward");
  const int64_t B = acts.tokens.size(0), T = acts.tokens.size(1), C = config_.n_embd;
  const int64_t n = acts.lnf.size(0);  // rows ln_f ran on (B*T, or B*T/tp sequence parallel)
  const DType dt = acts.x.dtype();
  const Device dev = acts.x.device();
  Tensor d;
  {
    trace::Scope scope("head backward");
    vocab_parallel_cross_entropy_backward(acts.probs, acts.targets.view({B * T}), vocab.lo,
                                          loss_scale);
    const Tensor& dlogits = acts.probs;  // (B*T, V/tp)
    const Tensor lnf = sp_ ? gather_sequence(acts.lnf, tp_) : acts.lnf;  // (B*T, C)
    Tensor dlnf = Tensor::zeros({B * T, C}, dt, dev);
    ops::matmul(dlnf, dlogits, wte.compute_value());                    // partial
    ops::matmul(wte.grad, dlogits, lnf, true, false, 1.0, 1.0);         // dwte +=
    acts.probs = Tensor();
    d = Tensor::zeros({n, C}, dt, dev);
    if (sp_) {  // our rows of the summed dlnf; ln_f's weights saw only our rows: all-reduce
      const Tensor dlnf_sp = gather_sequence_backward(dlnf, tp_);
      layernorm_backward_rows(ln_f, d, dlnf_sp, acts.x, acts.lnf_mean, acts.lnf_rstd, tp_);
    } else {
      f_backward(dlnf, tp_);  // the whole dlnf: every rank's vocabulary columns contribute
      ln_f.backward(d, dlnf, acts.x.view({n, C}), acts.lnf_mean, acts.lnf_rstd);
    }
    acts.x = acts.lnf = acts.lnf_mean = acts.lnf_rstd = Tensor();
  }
  for (int i = static_cast<int>(blocks_.size()) - 1; i >= 0; --i) {
    trace::Scope scope("block backward");
    if (sp_) {
      d = sp_block_backward(*blocks_[i], d, acts.inputs[i], B, T, acts.sp_blocks[i], tp_);
      acts.sp_blocks[i].reset();
    } else {
      d = blocks_[i]->backward(d.view({B, T, C}), acts.inputs[i], acts.blocks[i]);  // 2 ARs
      acts.blocks[i].reset();
    }
    acts.inputs[i] = Tensor();
  }
  // the embedding's backward needs the whole gradient (its forward ended in an all-reduce)
  if (sp_) d = scatter_sequence_backward(d, tp_);
  vocab_parallel_embedding_backward(wte.grad, vocab.lo, wpe.grad, d.view({B, T, C}), acts.tokens);
  acts.reset();
}

}  // namespace scalelab::lab07
