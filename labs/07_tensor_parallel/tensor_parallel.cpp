// Starter generated from solutions/07_tensor_parallel/tensor_parallel.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 1c3713fb557a39cb (lets make-labs see your edits).
// Lab 07: tensor parallelism: f and g, column- and row-parallel Linear, the TP block,
// vocabulary-parallel embedding and cross-entropy.
#include "tensor_parallel.hpp"

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"

namespace scalelab::lab07 {

namespace {

// The shape of x with its last dimension replaced by `last`: (..., in) -> (..., last).
[[maybe_unused]] std::vector<int64_t> with_last(const Tensor& x, int64_t last) {
  std::vector<int64_t> s = x.shape();
  s.back() = last;
  return s;
}

}  // namespace

// ---- Step 1 -----------------------------------------------------------------------------------

void f_forward(Tensor& x, comm::Communicator& tp) {
  // TODO step 1: f is the identity forward
  throw scalelab::NotImplemented(
      "lab 07 step 1: f is the identity forward (README.md#step-1)");
}

void f_backward(Tensor& dx, comm::Communicator& tp) {
  // TODO step 1: f's backward sums the partial input gradients
  // HINT: tp.all_reduce(t) sums t over the group in place.
  throw scalelab::NotImplemented(
      "lab 07 step 1: f's backward sums the partial input gradients (README.md#step-1)");
}

void g_forward(Tensor& y, comm::Communicator& tp) {
  // TODO step 1: g sums the partial outputs
  throw scalelab::NotImplemented(
      "lab 07 step 1: g sums the partial outputs (README.md#step-1)");
}

void g_backward(Tensor& dy, comm::Communicator& tp) {
  // TODO step 1: g's backward is the identity
  throw scalelab::NotImplemented(
      "lab 07 step 1: g's backward is the identity (README.md#step-1)");
}

// ---- Step 2 -----------------------------------------------------------------------------------

nn::Shard column_shard(int64_t out_features, int rank, int tp) {
  // TODO step 2: rank r keeps output rows [r*out/tp, (r+1)*out/tp)
  // HINT: SCALELAB_REQUIRE(condition, "message {}", args) throws scalelab::UsageError.
  throw scalelab::NotImplemented(
      "lab 07 step 2: rank r keeps output rows [r*out/tp, (r+1)*out/tp) (README.md#step-2)");
}

nn::Shard row_shard(int64_t in_features, int rank, int tp) {
  // TODO step 2: rank r keeps input columns [r*in/tp, (r+1)*in/tp)
  throw scalelab::NotImplemented(
      "lab 07 step 2: rank r keeps input columns [r*in/tp, (r+1)*in/tp) (README.md#step-2)");
}

Tensor column_parallel_forward(const nn::Linear& layer, const Tensor& x, comm::Communicator& tp) {
  // TODO step 2: f, then y_local = x @ W_local^T + b_local
  // HINT: layer.forward(out, in) is the local GEMM (out must be allocated: (..., out_local)).
  throw scalelab::NotImplemented(
      "lab 07 step 2: f, then y_local = x @ W_local^T + b_local (README.md#step-2)");
}

Tensor column_parallel_backward(nn::Linear& layer, const Tensor& dy_local, const Tensor& x,
                                comm::Communicator& tp) {
  // TODO step 2: local backward, then f's backward on dx
  // HINT: layer.backward(din, dout, in) accumulates: din must start at zero.
  throw scalelab::NotImplemented(
      "lab 07 step 2: local backward, then f's backward on dx (README.md#step-2)");
}

Tensor row_parallel_forward(const nn::Linear& layer, const Tensor& x_local,
                            comm::Communicator& tp) {
  // TODO step 2: partial y = x_local @ W_local^T, g, then the bias once
  throw scalelab::NotImplemented(
      "lab 07 step 2: partial y = x_local @ W_local^T, g, then the bias once (README.md#step-2)");
}

Tensor row_parallel_backward(nn::Linear& layer, const Tensor& dy, const Tensor& x_local,
                             comm::Communicator& tp) {
  // TODO step 2: g's backward, then the local backward
  throw scalelab::NotImplemented(
      "lab 07 step 2: g's backward, then the local backward (README.md#step-2)");
}

// ---- Step 3 -----------------------------------------------------------------------------------

HeadShards head_shards(int64_t n_embd, int64_t n_head, int rank, int tp) {
  // TODO step 3: this rank's heads: their q, k and v rows, their projection columns
  // HINT: q rows of heads [h0, h1) are [h0*hs, h1*hs); k rows are n_embd further, v rows 2*n_embd.
  throw scalelab::NotImplemented(
      "lab 07 step 3: this rank's heads: their q, k and v rows, their projection columns (README.md#step-3)");
}

std::unique_ptr<nn::Block> make_block(int index, const ModelConfig& c, int rank, int tp) {
  auto block = std::make_unique<nn::Block>(index, c.n_embd, c.n_head, c.n_layer, rank, tp);
  // The library's Block already knows how to hold a 1/tp share; here the shards come from this
  // lab's functions, so the block holds what the attendee's cut says (wrong cuts show up as
  // wrong numbers or wrong shapes in the graders).
  const HeadShards heads = head_shards(c.n_embd, c.n_head, rank, tp);
  nn::Linear& qkv = block->attn.qkv;
  qkv.weight.shard = heads.qkv;
  qkv.bias.shard = heads.qkv;  // the bias rows follow the weight rows
  block->attn.proj.weight.shard = heads.proj;
  block->attn.proj.bias.shard = {};  // row parallel: the bias is whole
  block->mlp.fc.weight.shard = column_shard(4 * c.n_embd, rank, tp);
  block->mlp.fc.bias.shard = block->mlp.fc.weight.shard;
  block->mlp.proj.weight.shard = row_shard(4 * c.n_embd, rank, tp);
  block->mlp.proj.bias.shard = {};
  return block;
}

void make_tensor_parallel(nn::Block& block, comm::Communicator& tp) {
  // TODO step 3: g after each row-parallel projection, f's backward before each column
  // HINT: block.reduce_forward and block.reduce_backward are std::function<void(Tensor&)>.
  throw scalelab::NotImplemented(
      "lab 07 step 3: g after each row-parallel projection, f's backward before each column (README.md#step-3)");
}

void check_tp(const ModelConfig& c, int tp) {
  SCALELAB_REQUIRE(tp >= 1, "tensor parallel size must be at least 1, got {}", tp);
  SCALELAB_REQUIRE(c.n_head % tp == 0 && (4 * c.n_embd) % tp == 0 && c.vocab_size % tp == 0,
                   "tensor parallel size {} must divide the heads ({}), the MLP width ({}) and "
                   "the vocabulary ({}) of model {}",
                   tp, c.n_head, 4 * c.n_embd, c.vocab_size, c.name);
}

// ---- Step 4 -----------------------------------------------------------------------------------

VocabRange vocab_range(int64_t vocab_size, int rank, int tp) {
  // TODO step 4: V/tp contiguous ids per rank
  throw scalelab::NotImplemented(
      "lab 07 step 4: V/tp contiguous ids per rank (README.md#step-4)");
}

Tensor vocab_parallel_embedding_forward(const Tensor& wte_local, int64_t lo, const Tensor& wpe,
                                        const Tensor& tokens, comm::Communicator& tp) {
  const int64_t B = tokens.size(0), T = tokens.size(1), C = wte_local.size(1);
  Tensor out = Tensor::empty({B, T, C}, wte_local.dtype(), wte_local.device());  // (B, T, C)
  // TODO step 4: local rows (zero for other ranks' ids), all-reduce, + wpe
  // HINT: the ops of common/ops/ops.hpp run on both devices: ops::gather_rows (a masked lookup),
  // HINT: ops::add_bias (adds a vector to every row: which view of out and wpe makes wpe one?).
  throw scalelab::NotImplemented(
      "lab 07 step 4: local rows (zero for other ranks' ids), all-reduce, + wpe (README.md#step-4)");
  return out;
}

void vocab_parallel_embedding_backward(Tensor& dwte_local, int64_t lo, Tensor& dwpe,
                                       const Tensor& dout, const Tensor& tokens) {
  SCALELAB_CHECK(dwte_local.dtype() == dwpe.dtype(), "dwte {} and dwpe {} differ in dtype",
                 dwte_local.str(), dwpe.str());
  const int64_t B = tokens.size(0), T = tokens.size(1), C = dout.size(2);
  // TODO step 4: scatter-add the rows of our ids; wpe gets every row
  // HINT: ops::index_add_rows skips the ids outside this rank's rows; ops::embedding_backward
  // HINT: with an undefined dwte computes dwpe alone. Both take bf16 dout into fp32 gradients.
  throw scalelab::NotImplemented(
      "lab 07 step 4: scatter-add the rows of our ids; wpe gets every row (README.md#step-4)");
}

double vocab_parallel_cross_entropy(Tensor& logits, const Tensor& targets, int64_t lo,
                                    comm::Communicator& tp) {
  const int64_t N = logits.size(0);
  double total = 0;
  // TODO step 4: three all-reduces of N numbers; the logits become probabilities
  // HINT: comm::ReduceOp::max; exp(logit - max) never overflows; loss = log(sum) + max - target.
  // HINT: ops::row_max, ops::pick_columns, ops::exp_rows, ops::divide_rows, ops::logarithm,
  // HINT: ops::sum: the per-row pieces of a softmax, on both devices. The per-row numbers are
  // HINT: ops::stats_dtype(logits.dtype()): fp32 for bf16 logits.
  throw scalelab::NotImplemented(
      "lab 07 step 4: three all-reduces of N numbers; the logits become probabilities (README.md#step-4)");
  return total / static_cast<double>(N);
}

void vocab_parallel_cross_entropy_backward(Tensor& probs, const Tensor& targets, int64_t lo,
                                           double scale) {
  // TODO step 4: dlogits = (p - onehot) * scale / N on our columns
  // HINT: the library's ops::cross_entropy_backward takes the offset of this rank's columns.
  throw scalelab::NotImplemented(
      "lab 07 step 4: dlogits = (p - onehot) * scale / N on our columns (README.md#step-4)");
}

// ---- Step 5 -----------------------------------------------------------------------------------

TokenRange sequence_rows(int64_t tokens, int rank, int tp) {
  // TODO step 5: tokens/tp contiguous rows per rank
  throw scalelab::NotImplemented(
      "lab 07 step 5: tokens/tp contiguous rows per rank (README.md#step-5)");
}

Tensor gather_sequence(const Tensor& x_sp, comm::Communicator& tp) {
  // TODO step 5: all-gather the rows
  // HINT: tp.all_gather(in, out): out holds rank 0's in, then rank 1's, ...
  throw scalelab::NotImplemented(
      "lab 07 step 5: all-gather the rows (README.md#step-5)");
}

Tensor gather_sequence_backward(const Tensor& dx_full, comm::Communicator& tp) {
  // TODO step 5: reduce-scatter the partial gradient
  // HINT: tp.reduce_scatter(in, out): rank r gets the sum of every rank's r-th chunk of in.
  throw scalelab::NotImplemented(
      "lab 07 step 5: reduce-scatter the partial gradient (README.md#step-5)");
}

Tensor scatter_sequence(const Tensor& y_partial, comm::Communicator& tp) {
  // TODO step 5: reduce-scatter the partial output
  throw scalelab::NotImplemented(
      "lab 07 step 5: reduce-scatter the partial output (README.md#step-5)");
}

Tensor scatter_sequence_backward(const Tensor& dy_sp, comm::Communicator& tp) {
  // TODO step 5: all-gather the rows' gradients
  throw scalelab::NotImplemented(
      "lab 07 step 5: all-gather the rows' gradients (README.md#step-5)");
}

Tensor sp_block_forward(const nn::Block& block, const Tensor& x_sp, int64_t B, int64_t T,
                        SPBlockActivations& a, comm::Communicator& tp) {
  const int64_t n = x_sp.size(0), C = x_sp.size(1);
  const DType dt = x_sp.dtype();
  const Device dev = x_sp.device();
  a.reset();
  Tensor out;
  // TODO step 5: LayerNorm on the rows, gather, sharded sub-layer, scatter, bias, residual
  // HINT: block.ln1.forward(out, mean, rstd, in); block.attn.forward(out, x (B, T, C), a.attn);
  // HINT: block.attn.proj.add_bias(t); ops::add(out, a, b). Same for ln2 and block.mlp.
  throw scalelab::NotImplemented(
      "lab 07 step 5: LayerNorm on the rows, gather, sharded sub-layer, scatter, bias, residual (README.md#step-5)");
  return out;
}

Tensor sp_block_backward(nn::Block& block, const Tensor& dout_sp, const Tensor& x_sp, int64_t B,
                         int64_t T, const SPBlockActivations& a, comm::Communicator& tp) {
  const int64_t C = x_sp.size(1);
  const DType dt = x_sp.dtype();
  const Device dev = x_sp.device();
  Tensor dx;
  // TODO step 5: each sub-layer backwards: gather dout and the LayerNorm output again,
  // HINT: the sharded backward, reduce-scatter the input gradient, LayerNorm backward on the rows
  // HINT: (layernorm_backward_rows: its weight gradients are all-reduced), residual.
  throw scalelab::NotImplemented(
      "lab 07 step 5: each sub-layer backwards: gather dout and the LayerNorm output again, (README.md#step-5)");
  return dx;
}

// ---- Step 6: measure --------------------------------------------------------------------------

std::size_t activation_bytes_formula(const ModelConfig& c, int64_t B, int64_t T, int tp,
                                     DType dtype, bool sp) {
  // TODO step 6: count what TPActivations holds, tensor by tensor
  // HINT: see BlockActivations / SPBlockActivations / TPActivations: which are (B*T, C) on every
  // HINT: rank, which are cut by tp (heads, hidden units, vocabulary), which by sequence rows?
  // HINT: dtype_size(dtype) bytes per activation, dtype_size(ops::stats_dtype(dtype)) per statistic.
  throw scalelab::NotImplemented(
      "lab 07 step 6: count what TPActivations holds, tensor by tensor (README.md#step-6)");
}

std::size_t comm_bytes_formula(const ModelConfig& c, int64_t B, int64_t T, DType dtype,
                               bool sp) {
  // TODO step 6: count the payload of every collective of one step
  // HINT: follow one forward and one backward of TPGPT (embed, blocks, head) and list each call.
  // HINT: activations in dtype; the cross-entropy's numbers and gradients in ops::stats_dtype.
  throw scalelab::NotImplemented(
      "lab 07 step 6: count the payload of every collective of one step (README.md#step-6)");
}

}  // namespace scalelab::lab07
