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
  // BEGIN SOLUTION step 1: f is the identity forward
  // Every rank already holds the whole input: nothing to do.
  (void)x;
  (void)tp;
  // END SOLUTION
}

void f_backward(Tensor& dx, comm::Communicator& tp) {
  // BEGIN SOLUTION step 1: f's backward sums the partial input gradients
  // HINT: tp.all_reduce(t) sums t over the group in place.
  tp.all_reduce(dx);
  // END SOLUTION
}

void g_forward(Tensor& y, comm::Communicator& tp) {
  // BEGIN SOLUTION step 1: g sums the partial outputs
  tp.all_reduce(y);
  // END SOLUTION
}

void g_backward(Tensor& dy, comm::Communicator& tp) {
  // BEGIN SOLUTION step 1: g's backward is the identity
  // Every rank already holds the whole output gradient: nothing to do.
  (void)dy;
  (void)tp;
  // END SOLUTION
}

// ---- Step 2 -----------------------------------------------------------------------------------

nn::Shard column_shard(int64_t out_features, int rank, int tp) {
  // BEGIN SOLUTION step 2: this rank's 1/tp of the output features (rows of the weight)
  // HINT: SCALELAB_REQUIRE(condition, "message {}", args) throws scalelab::UsageError.
  SCALELAB_REQUIRE(tp >= 1 && out_features % tp == 0,
                   "tensor parallel size {} does not divide {} output features", tp, out_features);
  const int64_t n = out_features / tp;
  return nn::Shard{0, {{rank * n, (rank + 1) * n}}};
  // END SOLUTION
}

nn::Shard row_shard(int64_t in_features, int rank, int tp) {
  // BEGIN SOLUTION step 2: this rank's 1/tp of the input features (columns of the weight)
  SCALELAB_REQUIRE(tp >= 1 && in_features % tp == 0,
                   "tensor parallel size {} does not divide {} input features", tp, in_features);
  const int64_t n = in_features / tp;
  return nn::Shard{1, {{rank * n, (rank + 1) * n}}};
  // END SOLUTION
}

Tensor column_parallel_forward(const nn::Linear& layer, const Tensor& x, comm::Communicator& tp) {
  // BEGIN SOLUTION step 2: this rank's output features of the layer, no communication
  // HINT: layer.forward(out, in) is the local GEMM (out must be allocated: (..., out_local)).
  Tensor in = x;  // shares x's storage: f's forward copies nothing
  f_forward(in, tp);
  Tensor y = Tensor::empty(with_last(x, layer.out_features()), x.dtype(), x.device());
  layer.forward(y, in);  // (N, out/tp): this rank's output features, bias included
  return y;
  // END SOLUTION
}

Tensor column_parallel_backward(nn::Linear& layer, const Tensor& dy_local, const Tensor& x,
                                comm::Communicator& tp) {
  // BEGIN SOLUTION step 2: this rank's weight gradients; the whole input gradient on every rank
  // HINT: layer.backward(din, dout, in) accumulates: din must start at zero.
  Tensor dx = Tensor::zeros(x.shape(), x.dtype(), x.device());
  layer.backward(dx, dy_local, x);  // dx = dy_local @ W_local: this rank's share of the sum
  f_backward(dx, tp);               // the whole dx = sum over ranks
  return dx;
  // END SOLUTION
}

Tensor row_parallel_forward(const nn::Linear& layer, const Tensor& x_local,
                            comm::Communicator& tp) {
  // BEGIN SOLUTION step 2: the whole output on every rank, the bias counted once
  Tensor y = Tensor::empty(with_last(x_local, layer.out_features()), x_local.dtype(),
                           x_local.device());
  layer.forward(y, x_local);  // a row-parallel Linear leaves out the bias
  g_forward(y, tp);           // sum of the partial products: the whole x @ W^T
  layer.add_bias(y);          // once, after the sum (before it, tp copies would add up)
  return y;
  // END SOLUTION
}

Tensor row_parallel_backward(nn::Linear& layer, const Tensor& dy, const Tensor& x_local,
                             comm::Communicator& tp) {
  // BEGIN SOLUTION step 2: this rank's weight gradients and input gradient, no communication
  Tensor d = dy;  // shares dy's storage
  g_backward(d, tp);
  Tensor dx = Tensor::zeros(x_local.shape(), x_local.dtype(), x_local.device());
  layer.backward(dx, d, x_local);  // dW (our columns) += d^T x_local; db += column sums of d
  return dx;
  // END SOLUTION
}

// ---- Step 3 -----------------------------------------------------------------------------------

HeadShards head_shards(int64_t n_embd, int64_t n_head, int rank, int tp) {
  // BEGIN SOLUTION step 3: this rank's heads: their q, k and v rows, their projection columns
  // HINT: three ranges, one each of q, k and v (./scalelab hint 07 3).
  SCALELAB_REQUIRE(tp >= 1 && n_head % tp == 0,
                   "tensor parallel size {} does not divide {} attention heads", tp, n_head);
  const int64_t hs = n_embd / n_head, per = n_head / tp;
  const int64_t b = rank * per * hs, e = (rank + 1) * per * hs;
  HeadShards s;
  s.qkv = nn::Shard{0, {{b, e}, {n_embd + b, n_embd + e}, {2 * n_embd + b, 2 * n_embd + e}}};
  s.proj = nn::Shard{1, {{b, e}}};
  return s;
  // END SOLUTION
}

// The model's hook points (common/nn/mappings.hpp): where a tensor-parallel region starts and
// ends, forward and backward.
Tensor TensorParallel::enter(const Tensor& x) const {
  // BEGIN SOLUTION step 3: entering a column-parallel region (the input whole on every rank)
  // HINT: step 1's operators work in place on a Tensor (a handle: a copy of x shares x's storage).
  return apply(f_forward, x, tp_);
  // END SOLUTION
}

Tensor TensorParallel::enter_backward(const Tensor& dx) const {
  // BEGIN SOLUTION step 3: the gradient of a region's whole input (a partial sum on each rank)
  return apply(f_backward, dx, tp_);
  // END SOLUTION
}

Tensor TensorParallel::leave(const Tensor& y) const {
  // BEGIN SOLUTION step 3: leaving a row-parallel region (a partial output on each rank)
  return apply(g_forward, y, tp_);
  // END SOLUTION
}

Tensor TensorParallel::leave_backward(const Tensor& dy) const {
  // BEGIN SOLUTION step 3: the gradient of a region's output (the same on every rank)
  return apply(g_backward, dy, tp_);
  // END SOLUTION
}

// ---- Step 4 -----------------------------------------------------------------------------------

VocabRange vocab_range(int64_t vocab_size, int rank, int tp) {
  // BEGIN SOLUTION step 4: this rank's contiguous 1/tp of the token ids
  SCALELAB_REQUIRE(tp >= 1 && vocab_size % tp == 0,
                   "tensor parallel size {} does not divide the vocabulary of {}", tp, vocab_size);
  const int64_t n = vocab_size / tp;
  return VocabRange{rank * n, (rank + 1) * n};
  // END SOLUTION
}

Tensor vocab_parallel_embedding_forward(const Tensor& wte_local, int64_t lo, const Tensor& wpe,
                                        const Tensor& tokens, comm::Communicator& tp) {
  const int64_t B = tokens.size(0), T = tokens.size(1), C = wte_local.size(1);
  Tensor out = Tensor::empty({B, T, C}, wte_local.dtype(), wte_local.device());  // (B, T, C)
  // BEGIN SOLUTION step 4: the single-device embedding, from this rank's vocabulary rows
  // HINT: the ops of common/ops/ops.hpp run on both devices: ops::gather_rows (a masked lookup),
  // HINT: ops::add_bias (adds a vector to every row: which view of out and wpe makes wpe one?).
  Tensor rows = out.view({B * T, C});
  ops::gather_rows(rows, wte_local, tokens.view({B * T}), lo);  // another rank's id: a zero row
  g_forward(out, tp);  // each row came from exactly one rank: the sum is the lookup
  // + wpe[t] for every b: out viewed as B rows of T*C, wpe's first T rows as one vector of T*C
  Tensor per_sample = out.view({B, T * C});
  ops::add_bias(per_sample, wpe.rows(0, T).view({T * C}));
  // END SOLUTION
  return out;
}

void vocab_parallel_embedding_backward(Tensor& dwte_local, int64_t lo, Tensor& dwpe,
                                       const Tensor& dout, const Tensor& tokens) {
  SCALELAB_CHECK(dwte_local.dtype() == dwpe.dtype(), "dwte {} and dwpe {} differ in dtype",
                 dwte_local.str(), dwpe.str());
  const int64_t B = tokens.size(0), T = tokens.size(1), C = dout.size(2);
  // BEGIN SOLUTION step 4: the gradients of this rank's vocabulary rows and of wpe, no communication
  // HINT: ops::index_add_rows skips the ids outside this rank's rows; ops::embedding_backward
  // HINT: with an undefined dwte computes dwpe alone. Both take bf16 dout into fp32 gradients.
  ops::index_add_rows(dwte_local, dout.view({B * T, C}), tokens.view({B * T}), lo);
  Tensor no_wte;  // undefined: the library's embedding backward then does wpe only
  ops::embedding_backward(no_wte, dwpe, dout, tokens);
  // END SOLUTION
}

Scalar vocab_parallel_cross_entropy(Tensor& logits, const Tensor& targets, int64_t lo,
                                    comm::Communicator& tp) {
  // the mean loss: one f64 element on the logits' device, read only by whoever prints it
  Tensor mean = Tensor::zeros({1}, DType::f64, logits.device());
  // BEGIN SOLUTION step 4: the loss without the full logits; ours become probabilities
  // HINT: comm::ReduceOp::max for a stable softmax (./scalelab hint 07 4 2).
  // HINT: ops::row_max, ops::pick_columns, ops::exp_rows, ops::divide_rows, ops::logarithm,
  // HINT: ops::axpy: the per-row pieces of a softmax, on both devices. The per-row numbers are
  // HINT: ops::stats_dtype(logits.dtype()): fp32 for bf16 logits. ops::sum_into(mean, rows, N)
  // HINT: averages a row vector into `mean` without a copy to the host.
  const int64_t N = logits.size(0);
  const DType stats = ops::stats_dtype(logits.dtype());
  const Device dev = logits.device();
  // 1. the max of each row over the whole vocabulary: local max, then all-reduce max
  Tensor row_max = Tensor::empty({N}, stats, dev);
  ops::row_max(row_max, logits);
  tp.all_reduce(row_max, comm::ReduceOp::max);
  // 2. the target's logit: only the rank holding the target id has it; the others give 0
  Tensor target_logit = Tensor::empty({N}, stats, dev);
  ops::pick_columns(target_logit, logits, targets, lo);
  tp.all_reduce(target_logit);
  // 3. the softmax's denominator: local sums of exp(z - max) (in place: no second (N, V/tp)),
  // all-reduce sum; then our columns of the softmax
  Tensor sum_exp = Tensor::empty({N}, stats, dev);
  ops::exp_rows(logits, sum_exp, row_max);
  tp.all_reduce(sum_exp);
  ops::divide_rows(logits, sum_exp);
  // each row's -log softmax(target) = log(sum exp(z - max)) + max - z_target, then their mean
  Tensor& row_loss = sum_exp;  // in place
  ops::logarithm(row_loss, sum_exp);
  ops::axpy(row_loss, 1.0, row_max);
  ops::axpy(row_loss, -1.0, target_logit);
  ops::sum_into(mean, row_loss, static_cast<double>(N));
  // END SOLUTION
  return Scalar(mean);
}

void vocab_parallel_cross_entropy_backward(Tensor& probs, const Tensor& targets, int64_t lo,
                                           double scale) {
  // BEGIN SOLUTION step 4: the loss's gradient on this rank's columns, no communication
  // HINT: the library's ops::cross_entropy_backward takes the offset of this rank's columns.
  const int64_t N = probs.size(0);
  ops::cross_entropy_backward(probs, probs, targets, scale / static_cast<double>(N), lo);
  // END SOLUTION
}

// ---- Step 5 -----------------------------------------------------------------------------------

TokenRange sequence_rows(int64_t tokens, int rank, int tp) {
  // BEGIN SOLUTION step 5: this rank's contiguous 1/tp of the token rows
  SCALELAB_REQUIRE(tp >= 1 && tokens % tp == 0,
                   "tensor parallel size {} does not divide the {} tokens of a batch (sequence "
                   "parallel)", tp, tokens);
  const int64_t n = tokens / tp;
  return TokenRange{rank * n, (rank + 1) * n};
  // END SOLUTION
}

Tensor gather_sequence(const Tensor& x_sp, comm::Communicator& tp) {
  // BEGIN SOLUTION step 5: all-gather the rows
  // HINT: tp.all_gather(in, out): out holds rank 0's in, then rank 1's, ...
  Tensor full = Tensor::empty({tp.size() * x_sp.size(0), x_sp.size(1)}, x_sp.dtype(),
                              x_sp.device());  // (N, C)
  tp.all_gather(x_sp, full);
  return full;
  // END SOLUTION
}

Tensor gather_sequence_backward(const Tensor& dx_full, comm::Communicator& tp) {
  // BEGIN SOLUTION step 5: reduce-scatter the partial gradient
  // HINT: tp.reduce_scatter(in, out): rank r gets the sum of every rank's r-th chunk of in.
  const int64_t C = dx_full.size(dx_full.dim() - 1), N = dx_full.numel() / C;
  Tensor mine = Tensor::empty({N / tp.size(), C}, dx_full.dtype(), dx_full.device());
  tp.reduce_scatter(dx_full, mine);
  return mine;
  // END SOLUTION
}

Tensor scatter_sequence(const Tensor& y_partial, comm::Communicator& tp) {
  // BEGIN SOLUTION step 5: reduce-scatter the partial output
  const int64_t C = y_partial.size(y_partial.dim() - 1), N = y_partial.numel() / C;
  Tensor mine = Tensor::empty({N / tp.size(), C}, y_partial.dtype(), y_partial.device());
  tp.reduce_scatter(y_partial, mine);  // the sum over ranks, only our rows of it
  return mine;
  // END SOLUTION
}

Tensor scatter_sequence_backward(const Tensor& dy_sp, comm::Communicator& tp) {
  // BEGIN SOLUTION step 5: all-gather the rows' gradients
  Tensor full = Tensor::empty({tp.size() * dy_sp.size(0), dy_sp.size(1)}, dy_sp.dtype(),
                              dy_sp.device());
  tp.all_gather(dy_sp, full);
  return full;
  // END SOLUTION
}

Tensor SequenceParallel::enter(const Tensor& x) const {
  Tensor full;
  // BEGIN SOLUTION step 5: entering a region: our rows -> every row
  full = gather_sequence(x.view({-1, x.size(-1)}), tp_);
  // END SOLUTION
  return full;
}

Tensor SequenceParallel::enter_backward(const Tensor& dx) const {
  Tensor mine;
  // BEGIN SOLUTION step 5: the whole input's partial gradient -> our rows of the sum
  mine = gather_sequence_backward(dx, tp_);
  // END SOLUTION
  return mine;
}

Tensor SequenceParallel::leave(const Tensor& y) const {
  Tensor mine;
  // BEGIN SOLUTION step 5: a partial whole output -> our rows of the sum
  mine = scatter_sequence(y, tp_);
  // END SOLUTION
  return mine;
}

Tensor SequenceParallel::leave_backward(const Tensor& dy) const {
  Tensor full;
  // BEGIN SOLUTION step 5: our rows of the output's gradient -> the whole gradient
  full = scatter_sequence_backward(dy.view({-1, dy.size(-1)}), tp_);
  // END SOLUTION
  return full;
}

// ---- Step 6: measure --------------------------------------------------------------------------

std::size_t activation_bytes_formula(const ModelConfig& c, int64_t B, int64_t T, int tp,
                                     DType dtype, bool sp) {
  // BEGIN SOLUTION step 6: count what the model's GPTActivations hold, tensor by tensor
  // HINT: see nn::BlockActivations / nn::GPTActivations: which are (B*T, C) on every
  // HINT: rank, which are cut by tp (heads, hidden units, vocabulary), which by sequence rows?
  // HINT: dtype_size(dtype) bytes per activation, dtype_size(ops::stats_dtype(dtype)) per statistic.
  const int64_t elem = dtype_size(dtype), stat = dtype_size(ops::stats_dtype(dtype));
  const int64_t C = c.n_embd, NH = c.n_head, V = c.vocab_size, N = B * T;
  // what every rank keeps whole in step 3 and only its rows with sequence parallelism
  const int64_t rows = sp ? N / tp : N;
  // per block: input, ln1, res2, ln2 (rows, C) and 4 statistics (rows); q, k, v, y
  // (B, T, C/tp); att (B*NH/tp, T, T); h, g (B, T, 4C/tp)
  const int64_t block = (4 * rows * C + 4 * N * C / tp + B * (NH / tp) * T * T +
                         2 * N * 4 * C / tp) * elem + 4 * rows * stat;
  // head: x, lnf (rows, C); mean, rstd (rows); probs (B*T, V/tp)
  const int64_t head = (2 * rows * C + N * V / tp) * elem + 2 * rows * stat;
  return static_cast<std::size_t>(c.n_layer * block + head);
  // END SOLUTION
}

std::size_t comm_bytes_formula(const ModelConfig& c, int64_t B, int64_t T, DType dtype,
                               bool sp) {
  // BEGIN SOLUTION step 6: count the payload of every collective of one step
  // HINT: follow one forward and one backward of the model (embed, blocks, head) and list each
  // HINT: call its mappings make.
  // HINT: activations in dtype; the cross-entropy's numbers and gradients in ops::stats_dtype.
  const int64_t NC = B * T * c.n_embd, N = B * T, C = c.n_embd, L = c.n_layer;
  const int64_t elem = dtype_size(dtype), stat = dtype_size(ops::stats_dtype(dtype));
  if (!sp)
    // blocks: (2 forward + 2 backward) all-reduces of B*T*C each; embedding: 1 (forward);
    // head: f's backward on dlnf (B*T*C) and the cross-entropy's 3 all-reduces of B*T
    return static_cast<std::size_t>((4 * L * NC + NC + NC) * elem + 3 * N * stat);
  // blocks: forward 2 AG + 2 RS, backward 4 AG + 2 RS (of B*T*C payload each) and 4 all-reduces
  // of C (LayerNorm gradients); embedding: its all-reduce forward, the gather of its gradient;
  // head: ln_f's gather forward, gather again + reduce-scatter backward, its 2 gradients'
  // all-reduces of C; the cross-entropy's 3 of B*T
  return static_cast<std::size_t>((10 * L * NC + 2 * NC + 3 * NC) * elem +
                                   (4 * L * C + 2 * C + 3 * N) * stat);
  // END SOLUTION
}

}  // namespace scalelab::lab07
