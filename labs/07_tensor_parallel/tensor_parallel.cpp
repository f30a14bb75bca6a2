// Starter generated from solutions/07_tensor_parallel/tensor_parallel.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 1ef4e39c2f1b6941 (lets make-labs see your edits).
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

// Applies one of step 1's operators (they work in place) to a handle on x's storage.
[[maybe_unused]] Tensor apply(void (*op)(Tensor&, comm::Communicator&), const Tensor& x,
                              comm::Communicator& tp) {
  Tensor t = x;
  op(t, tp);
  return t;
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
  // TODO step 2: this rank's 1/tp of the output features (rows of the weight)
  // HINT: SCALELAB_REQUIRE(condition, "message {}", args) throws scalelab::UsageError.
  throw scalelab::NotImplemented(
      "lab 07 step 2: this rank's 1/tp of the output features (rows of the weight) (README.md#step-2)");
}

nn::Shard row_shard(int64_t in_features, int rank, int tp) {
  // TODO step 2: this rank's 1/tp of the input features (columns of the weight)
  throw scalelab::NotImplemented(
      "lab 07 step 2: this rank's 1/tp of the input features (columns of the weight) (README.md#step-2)");
}

Tensor column_parallel_forward(const nn::Linear& layer, const Tensor& x, comm::Communicator& tp) {
  // TODO step 2: this rank's output features of the layer, no communication
  // HINT: layer.forward(out, in) is the local GEMM (out must be allocated: (..., out_local)).
  throw scalelab::NotImplemented(
      "lab 07 step 2: this rank's output features of the layer, no communication (README.md#step-2)");
}

Tensor column_parallel_backward(nn::Linear& layer, const Tensor& dy_local, const Tensor& x,
                                comm::Communicator& tp) {
  // TODO step 2: this rank's weight gradients; the whole input gradient on every rank
  // HINT: layer.backward(din, dout, in) accumulates: din must start at zero.
  throw scalelab::NotImplemented(
      "lab 07 step 2: this rank's weight gradients; the whole input gradient on every rank (README.md#step-2)");
}

Tensor row_parallel_forward(const nn::Linear& layer, const Tensor& x_local,
                            comm::Communicator& tp) {
  // TODO step 2: the whole output on every rank, the bias counted once
  throw scalelab::NotImplemented(
      "lab 07 step 2: the whole output on every rank, the bias counted once (README.md#step-2)");
}

Tensor row_parallel_backward(nn::Linear& layer, const Tensor& dy, const Tensor& x_local,
                             comm::Communicator& tp) {
  // TODO step 2: this rank's weight gradients and input gradient, no communication
  throw scalelab::NotImplemented(
      "lab 07 step 2: this rank's weight gradients and input gradient, no communication (README.md#step-2)");
}

// ---- Step 3 -----------------------------------------------------------------------------------

HeadShards head_shards(int64_t n_embd, int64_t n_head, int rank, int tp) {
  // TODO step 3: this rank's heads: their q, k and v rows, their projection columns
  // HINT: three ranges, one each of q, k and v (./scalelab hint 07 3).
  throw scalelab::NotImplemented(
      "lab 07 step 3: this rank's heads: their q, k and v rows, their projection columns (README.md#step-3)");
}

// The model's hook points (common/nn/mappings.hpp): where a tensor-parallel region starts and
// ends, forward and backward.
Tensor TensorParallel::enter(const Tensor& x) const {
  // TODO step 3: entering a column-parallel region (the input whole on every rank)
  // HINT: step 1's operators work in place on a Tensor (a handle: a copy of x shares x's storage).
  throw scalelab::NotImplemented(
      "lab 07 step 3: entering a column-parallel region (the input whole on every rank) (README.md#step-3)");
}

Tensor TensorParallel::enter_backward(const Tensor& dx) const {
  // TODO step 3: the gradient of a region's whole input (a partial sum on each rank)
  throw scalelab::NotImplemented(
      "lab 07 step 3: the gradient of a region's whole input (a partial sum on each rank) (README.md#step-3)");
}

Tensor TensorParallel::leave(const Tensor& y) const {
  // TODO step 3: leaving a row-parallel region (a partial output on each rank)
  throw scalelab::NotImplemented(
      "lab 07 step 3: leaving a row-parallel region (a partial output on each rank) (README.md#step-3)");
}

Tensor TensorParallel::leave_backward(const Tensor& dy) const {
  // TODO step 3: the gradient of a region's output (the same on every rank)
  throw scalelab::NotImplemented(
      "lab 07 step 3: the gradient of a region's output (the same on every rank) (README.md#step-3)");
}

// ---- Step 4 -----------------------------------------------------------------------------------

VocabRange vocab_range(int64_t vocab_size, int rank, int tp) {
  // TODO step 4: this rank's contiguous 1/tp of the token ids
  throw scalelab::NotImplemented(
      "lab 07 step 4: this rank's contiguous 1/tp of the token ids (README.md#step-4)");
}

Tensor vocab_parallel_embedding_forward(const Tensor& wte_local, int64_t lo, const Tensor& wpe,
                                        const Tensor& tokens, comm::Communicator& tp) {
  const int64_t B = tokens.size(0), T = tokens.size(1), C = wte_local.size(1);
  Tensor out = Tensor::empty({B, T, C}, wte_local.dtype(), wte_local.device());  // (B, T, C)
  // TODO step 4: the single-device embedding, from this rank's vocabulary rows
  // HINT: the ops of common/ops/ops.hpp run on both devices: ops::gather_rows (a masked lookup),
  // HINT: ops::add_bias (adds a vector to every row: which view of out and wpe makes wpe one?).
  throw scalelab::NotImplemented(
      "lab 07 step 4: the single-device embedding, from this rank's vocabulary rows (README.md#step-4)");
  return out;
}

void vocab_parallel_embedding_backward(Tensor& dwte_local, int64_t lo, Tensor& dwpe,
                                       const Tensor& dout, const Tensor& tokens) {
  SCALELAB_CHECK(dwte_local.dtype() == dwpe.dtype(), "dwte {} and dwpe {} differ in dtype",
                 dwte_local.str(), dwpe.str());
  const int64_t B = tokens.size(0), T = tokens.size(1), C = dout.size(2);
  // TODO step 4: the gradients of this rank's vocabulary rows and of wpe, no communication
  // HINT: ops::index_add_rows skips the ids outside this rank's rows; ops::embedding_backward
  // HINT: with an undefined dwte computes dwpe alone. Both take bf16 dout into fp32 gradients.
  throw scalelab::NotImplemented(
      "lab 07 step 4: the gradients of this rank's vocabulary rows and of wpe, no communication (README.md#step-4)");
}

Scalar vocab_parallel_cross_entropy(Tensor& logits, const Tensor& targets, int64_t lo,
                                    comm::Communicator& tp) {
  // the mean loss: one f64 element on the logits' device, read only by whoever prints it
  Tensor mean = Tensor::zeros({1}, DType::f64, logits.device());
  // TODO step 4: the loss without the full logits; ours become probabilities
  // HINT: comm::ReduceOp::max for a stable softmax (./scalelab hint 07 4 2).
  // HINT: ops::row_max, ops::pick_columns, ops::exp_rows, ops::divide_rows, ops::logarithm,
  // HINT: ops::axpy: the per-row pieces of a softmax, on both devices. The per-row numbers are
  // HINT: ops::stats_dtype(logits.dtype()): fp32 for bf16 logits. ops::sum_into(mean, rows, N)
  // HINT: averages a row vector into `mean` without a copy to the host.
  throw scalelab::NotImplemented(
      "lab 07 step 4: the loss without the full logits; ours become probabilities (README.md#step-4)");
  return Scalar(mean);
}

void vocab_parallel_cross_entropy_backward(Tensor& probs, const Tensor& targets, int64_t lo,
                                           double scale) {
  // TODO step 4: the loss's gradient on this rank's columns, no communication
  // HINT: the library's ops::cross_entropy_backward takes the offset of this rank's columns.
  throw scalelab::NotImplemented(
      "lab 07 step 4: the loss's gradient on this rank's columns, no communication (README.md#step-4)");
}

// ---- Step 5 -----------------------------------------------------------------------------------

TokenRange sequence_rows(int64_t tokens, int rank, int tp) {
  // TODO step 5: this rank's contiguous 1/tp of the token rows
  throw scalelab::NotImplemented(
      "lab 07 step 5: this rank's contiguous 1/tp of the token rows (README.md#step-5)");
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

Tensor SequenceParallel::enter(const Tensor& x) const {
  Tensor full;
  // TODO step 5: entering a region: our rows -> every row
  throw scalelab::NotImplemented(
      "lab 07 step 5: entering a region: our rows -> every row (README.md#step-5)");
  return full;
}

Tensor SequenceParallel::enter_backward(const Tensor& dx) const {
  Tensor mine;
  // TODO step 5: the whole input's partial gradient -> our rows of the sum
  throw scalelab::NotImplemented(
      "lab 07 step 5: the whole input's partial gradient -> our rows of the sum (README.md#step-5)");
  return mine;
}

Tensor SequenceParallel::leave(const Tensor& y) const {
  Tensor mine;
  // TODO step 5: a partial whole output -> our rows of the sum
  throw scalelab::NotImplemented(
      "lab 07 step 5: a partial whole output -> our rows of the sum (README.md#step-5)");
  return mine;
}

Tensor SequenceParallel::leave_backward(const Tensor& dy) const {
  Tensor full;
  // TODO step 5: our rows of the output's gradient -> the whole gradient
  throw scalelab::NotImplemented(
      "lab 07 step 5: our rows of the output's gradient -> the whole gradient (README.md#step-5)");
  return full;
}

// ---- Step 6: measure --------------------------------------------------------------------------

std::size_t activation_bytes_formula(const ModelConfig& c, int64_t B, int64_t T, int tp,
                                     DType dtype, bool sp) {
  // TODO step 6: count what the model's GPTActivations hold, tensor by tensor
  // HINT: see nn::BlockActivations / nn::GPTActivations: which are (B*T, C) on every
  // HINT: rank, which are cut by tp (heads, hidden units, vocabulary), which by sequence rows?
  // HINT: dtype_size(dtype) bytes per activation, dtype_size(ops::stats_dtype(dtype)) per statistic.
  throw scalelab::NotImplemented(
      "lab 07 step 6: count what the model's GPTActivations hold, tensor by tensor (README.md#step-6)");
}

std::size_t comm_bytes_formula(const ModelConfig& c, int64_t B, int64_t T, DType dtype,
                               bool sp) {
  // TODO step 6: count the payload of every collective of one step
  // HINT: follow one forward and one backward of the model (embed, blocks, head) and list each
  // HINT: call its mappings make.
  // HINT: activations in dtype; the cross-entropy's numbers and gradients in ops::stats_dtype.
  throw scalelab::NotImplemented(
      "lab 07 step 6: count the payload of every collective of one step (README.md#step-6)");
}

}  // namespace scalelab::lab07
