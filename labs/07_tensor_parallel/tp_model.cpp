// Lab 07, given: how the steps' functions become a model. The cut of a block (steps 2-3's
// shards), the vocabulary-parallel ends of TensorParallel (step 4's functions), the LayerNorm
// backward of sequence parallelism, and make_tp_gpt: the library's nn::GPT with those cuts and
// mappings. Not an exercise: read it to see where each of your functions is called.
#include "tensor_parallel.hpp"

#include "common/errors.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::lab07 {

void check_tp(const ModelConfig& c, int tp) {
  SCALELAB_REQUIRE(tp >= 1, "tensor parallel size must be at least 1, got {}", tp);
  SCALELAB_REQUIRE(c.n_head % tp == 0 && (4 * c.n_embd) % tp == 0 && c.vocab_size % tp == 0,
                   "tensor parallel size {} must divide the heads ({}), the MLP width ({}) and "
                   "the vocabulary ({}) of model {}",
                   tp, c.n_head, 4 * c.n_embd, c.vocab_size, c.name);
}

// The cut comes from this lab's functions, so a block holds what the attendee's cut says (wrong
// cuts show up as wrong numbers or wrong shapes in the graders).
void cut_block(nn::Block& block, const ModelConfig& c, int rank, int tp) {
  const HeadShards heads = head_shards(c.n_embd, c.n_head, rank, tp);
  nn::Linear& qkv = block.attn.qkv;
  qkv.weight.shard = heads.qkv;
  qkv.bias.shard = heads.qkv;  // the bias rows follow the weight rows
  block.attn.proj.weight.shard = heads.proj;
  block.attn.proj.bias.shard = {};  // row parallel: the bias is whole
  block.mlp.fc.weight.shard = column_shard(4 * c.n_embd, rank, tp);
  block.mlp.fc.bias.shard = block.mlp.fc.weight.shard;
  block.mlp.proj.weight.shard = row_shard(4 * c.n_embd, rank, tp);
  block.mlp.proj.bias.shard = {};
}

std::unique_ptr<nn::Block> make_block(int index, const ModelConfig& c, int rank, int tp) {
  auto block = std::make_unique<nn::Block>(index, c.n_embd, c.n_head, c.n_layer, rank, tp);
  cut_block(*block, c, rank, tp);
  return block;
}

// ---- the vocabulary-parallel ends (step 4) ----------------------------------------------------

Tensor TensorParallel::embedding_forward(const Tensor& wte, int64_t lo, const Tensor& wpe,
                                         const Tensor& tokens) const {
  return vocab_parallel_embedding_forward(wte, lo, wpe, tokens, tp_);
}

void TensorParallel::embedding_backward(Tensor& dwte, int64_t lo, Tensor& dwpe,
                                        const Tensor& dout, const Tensor& tokens) const {
  // dout is the same on every rank: each adds the rows of the tokens it holds, no communication
  vocab_parallel_embedding_backward(dwte, lo, dwpe, dout, tokens);
}

Scalar TensorParallel::cross_entropy(Tensor& logits, const Tensor& targets, int64_t lo) const {
  return vocab_parallel_cross_entropy(logits, targets, lo, tp_);  // in place: no second (N, V/tp)
}

void TensorParallel::cross_entropy_backward(Tensor& probs, const Tensor& targets, int64_t lo,
                                            double scale) const {
  vocab_parallel_cross_entropy_backward(probs, targets, lo, scale);
}

// ---- sequence parallelism (step 5) ------------------------------------------------------------

// LayerNorm backward on this rank's rows, whose weight and bias gradients are partial sums over
// the ranks' rows: computed apart, all-reduced, then added (the gradients accumulate).
void layernorm_backward_rows(nn::LayerNorm& ln, Tensor& din, const Tensor& dout, const Tensor& in,
                             const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                             comm::Communicator& tp) {
  // in the gradients' dtype (fp32 also in mixed precision: ops rule R6)
  Tensor dw = Tensor::zeros(ln.weight.grad.shape(), ln.weight.grad.dtype(), din.device());
  Tensor db = Tensor::zeros(ln.bias.grad.shape(), ln.bias.grad.dtype(), din.device());
  ops::layernorm_backward(din, dw, db, dout, in, ln.weight.compute_value(), mean, rstd, dresidual);
  tp.all_reduce(dw);
  tp.all_reduce(db);
  ops::add(ln.weight.grad, ln.weight.grad, dw);
  ops::add(ln.bias.grad, ln.bias.grad, db);
}

// The embedding's all-reduce leaves every row on every rank: keep ours (a copy: the whole is
// freed). Megatron reduce-scatters the partial lookup instead (half the payload).
Tensor SequenceParallel::split_rows(const Tensor& x) const {
  const int64_t C = x.size(-1), N = x.numel() / C;
  const TokenRange rows = sequence_rows(N, tp_.rank(), tp_.size());
  return x.view({N, C}).rows(rows.lo, rows.hi).clone();  // (N/tp, C)
}

// ... and its backward needs every row's gradient: the all-gather of step 5a.
Tensor SequenceParallel::split_rows_backward(const Tensor& dx) const {
  return scatter_sequence_backward(dx, tp_);
}

void SequenceParallel::layernorm_backward(nn::LayerNorm& ln, Tensor& din, const Tensor& dout,
                                          const Tensor& in, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& dresidual) const {
  layernorm_backward_rows(ln, din, dout, in, mean, rstd, dresidual, tp_);
}

// ---- the model ----------------------------------------------------------------------------------

std::unique_ptr<nn::GPT> make_tp_gpt(const ModelConfig& config, comm::Communicator& tp,
                                     const TPOptions& options) {
  const int rank = tp.rank(), size = tp.size();
  check_tp(config, size);
  const VocabRange vocab = vocab_range(config.vocab_size, rank, size);
  nn::GPTOptions o;
  o.dtype = options.dtype;
  o.device = options.device;
  o.seed = options.seed;  // every parameter drawn whole from (seed, name), then cut
  o.compute_dtype = options.compute_dtype;
  o.tp_rank = rank;
  o.tp_size = size;
  o.cut_block = [config, rank, size](nn::Block& b) { cut_block(b, config, rank, size); };
  o.vocab_lo = vocab.lo;
  o.vocab_hi = vocab.hi;
  auto model = std::make_unique<nn::GPT>(config, o);
  if (options.sequence_parallel)
    model->set_mappings(std::make_shared<SequenceParallel>(tp));
  else
    model->set_mappings(std::make_shared<TensorParallel>(tp));
  return model;
}

}  // namespace scalelab::lab07
