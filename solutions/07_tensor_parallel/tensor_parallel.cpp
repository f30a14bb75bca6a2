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
  // BEGIN SOLUTION step 2: rank r keeps output rows [r*out/tp, (r+1)*out/tp)
  // HINT: SCALELAB_REQUIRE(condition, "message {}", args) throws scalelab::UsageError.
  SCALELAB_REQUIRE(tp >= 1 && out_features % tp == 0,
                   "tensor parallel size {} does not divide {} output features", tp, out_features);
  const int64_t n = out_features / tp;
  return nn::Shard{0, {{rank * n, (rank + 1) * n}}};
  // END SOLUTION
}

nn::Shard row_shard(int64_t in_features, int rank, int tp) {
  // BEGIN SOLUTION step 2: rank r keeps input columns [r*in/tp, (r+1)*in/tp)
  SCALELAB_REQUIRE(tp >= 1 && in_features % tp == 0,
                   "tensor parallel size {} does not divide {} input features", tp, in_features);
  const int64_t n = in_features / tp;
  return nn::Shard{1, {{rank * n, (rank + 1) * n}}};
  // END SOLUTION
}

Tensor column_parallel_forward(const nn::Linear& layer, const Tensor& x, comm::Communicator& tp) {
  // BEGIN SOLUTION step 2: f, then y_local = x @ W_local^T + b_local
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
  // BEGIN SOLUTION step 2: local backward, then f's backward on dx
  // HINT: layer.backward(din, dout, in) accumulates: din must start at zero.
  Tensor dx = Tensor::zeros(x.shape(), x.dtype(), x.device());
  layer.backward(dx, dy_local, x);  // dx = dy_local @ W_local: this rank's share of the sum
  f_backward(dx, tp);               // the whole dx = sum over ranks
  return dx;
  // END SOLUTION
}

Tensor row_parallel_forward(const nn::Linear& layer, const Tensor& x_local,
                            comm::Communicator& tp) {
  // BEGIN SOLUTION step 2: partial y = x_local @ W_local^T, g, then the bias once
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
  // BEGIN SOLUTION step 2: g's backward, then the local backward
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
  // HINT: q rows of heads [h0, h1) are [h0*hs, h1*hs); k rows are n_embd further, v rows 2*n_embd.
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
  // BEGIN SOLUTION step 3: g after each row-parallel projection, f's backward before each column
  // HINT: block.reduce_forward and block.reduce_backward are std::function<void(Tensor&)>.
  comm::Communicator* group = &tp;  // the communicator must outlive the block
  block.reduce_forward = [group](Tensor& y) { g_forward(y, *group); };
  block.reduce_backward = [group](Tensor& dx) { f_backward(dx, *group); };
  // END SOLUTION
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
  // BEGIN SOLUTION step 4: V/tp contiguous ids per rank
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
  // BEGIN SOLUTION step 4: local rows (zero for other ranks' ids), all-reduce, + wpe
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
  // BEGIN SOLUTION step 4: scatter-add the rows of our ids; wpe gets every row
  // HINT: ops::index_add_rows skips the ids outside this rank's rows; ops::embedding_backward
  // HINT: with an undefined dwte computes dwpe alone. Both take bf16 dout into fp32 gradients.
  ops::index_add_rows(dwte_local, dout.view({B * T, C}), tokens.view({B * T}), lo);
  Tensor no_wte;  // undefined: the library's embedding backward then does wpe only
  ops::embedding_backward(no_wte, dwpe, dout, tokens);
  // END SOLUTION
}

double vocab_parallel_cross_entropy(Tensor& logits, const Tensor& targets, int64_t lo,
                                    comm::Communicator& tp) {
  const int64_t N = logits.size(0);
  double total = 0;
  // BEGIN SOLUTION step 4: three all-reduces of N numbers; the logits become probabilities
  // HINT: comm::ReduceOp::max; exp(logit - max) never overflows; loss = log(sum) + max - target.
  // HINT: ops::row_max, ops::pick_columns, ops::exp_rows, ops::divide_rows, ops::logarithm,
  // HINT: ops::sum: the per-row pieces of a softmax, on both devices. The per-row numbers are
  // HINT: ops::stats_dtype(logits.dtype()): fp32 for bf16 logits.
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
  // -log softmax(target) = log(sum exp(z - max)) + max - z_target, summed over the rows
  ops::logarithm(sum_exp, sum_exp);
  total = ops::sum(sum_exp) + ops::sum(row_max) - ops::sum(target_logit);
  // END SOLUTION
  return total / static_cast<double>(N);
}

void vocab_parallel_cross_entropy_backward(Tensor& probs, const Tensor& targets, int64_t lo,
                                           double scale) {
  // BEGIN SOLUTION step 4: dlogits = (p - onehot) * scale / N on our columns
  // HINT: the library's ops::cross_entropy_backward takes the offset of this rank's columns.
  const int64_t N = probs.size(0);
  ops::cross_entropy_backward(probs, probs, targets, scale / static_cast<double>(N), lo);
  // END SOLUTION
}

// ---- Step 5 -----------------------------------------------------------------------------------

TokenRange sequence_rows(int64_t tokens, int rank, int tp) {
  // BEGIN SOLUTION step 5: tokens/tp contiguous rows per rank
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

Tensor sp_block_forward(const nn::Block& block, const Tensor& x_sp, int64_t B, int64_t T,
                        SPBlockActivations& a, comm::Communicator& tp) {
  const int64_t n = x_sp.size(0), C = x_sp.size(1);
  const DType dt = x_sp.dtype();
  const Device dev = x_sp.device();
  a.reset();
  Tensor out;
  // BEGIN SOLUTION step 5: LayerNorm on the rows, gather, sharded sub-layer, scatter, bias, residual
  // HINT: block.ln1.forward(out, mean, rstd, in); block.attn.forward(out, x (B, T, C), a.attn);
  // HINT: block.attn.proj.add_bias(t); ops::add(out, a, b). Same for ln2 and block.mlp.
  a.ln1 = Tensor::empty({n, C}, dt, dev);
  a.ln1_mean = Tensor::empty({n}, ops::stats_dtype(dt), dev);  // fp32 for bf16 activations
  a.ln1_rstd = Tensor::empty({n}, ops::stats_dtype(dt), dev);
  block.ln1.forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_sp);
  a.res2 = Tensor::empty({n, C}, dt, dev);
  {
    const Tensor ln1_full = gather_sequence(a.ln1, tp).view({B, T, C});  // not kept
    Tensor partial = Tensor::empty({B, T, C}, dt, dev);
    block.attn.forward(partial, ln1_full, a.attn);  // our heads' share of the projection
    Tensor attn_sp = scatter_sequence(partial, tp);  // (n, C): the sum, our rows only
    block.attn.proj.add_bias(attn_sp);
    ops::add(a.res2, x_sp, attn_sp);
  }
  a.ln2 = Tensor::empty({n, C}, dt, dev);
  a.ln2_mean = Tensor::empty({n}, ops::stats_dtype(dt), dev);
  a.ln2_rstd = Tensor::empty({n}, ops::stats_dtype(dt), dev);
  block.ln2.forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2);
  {
    const Tensor ln2_full = gather_sequence(a.ln2, tp).view({B, T, C});
    Tensor partial = Tensor::empty({B, T, C}, dt, dev);
    block.mlp.forward(partial, ln2_full, a.mlp);
    out = scatter_sequence(partial, tp);
    block.mlp.proj.add_bias(out);
    ops::add(out, out, a.res2);
  }
  // END SOLUTION
  return out;
}

Tensor sp_block_backward(nn::Block& block, const Tensor& dout_sp, const Tensor& x_sp, int64_t B,
                         int64_t T, const SPBlockActivations& a, comm::Communicator& tp) {
  const int64_t C = x_sp.size(1);
  const DType dt = x_sp.dtype();
  const Device dev = x_sp.device();
  Tensor dx;
  // BEGIN SOLUTION step 5: each sub-layer backwards: gather dout and the LayerNorm output again,
  // HINT: the sharded backward, reduce-scatter the input gradient, LayerNorm backward on the rows
  // HINT: (layernorm_backward_rows: its weight gradients are all-reduced), residual.
  Tensor dres2 = dout_sp.clone();  // the residual passes the gradient straight through
  {
    const Tensor dmlp = scatter_sequence_backward(dout_sp, tp).view({B, T, C});
    const Tensor ln2_full = gather_sequence(a.ln2, tp).view({B, T, C});  // again: not kept
    Tensor dln2 = Tensor::zeros({B, T, C}, dt, dev);
    block.mlp.backward(dln2, dmlp, ln2_full, a.mlp);  // dln2: a partial sum (our hidden units)
    const Tensor dln2_sp = gather_sequence_backward(dln2, tp);
    layernorm_backward_rows(block.ln2, dres2, dln2_sp, a.res2, a.ln2_mean, a.ln2_rstd, tp);
  }
  dx = dres2.clone();
  {
    const Tensor dattn = scatter_sequence_backward(dres2, tp).view({B, T, C});
    const Tensor ln1_full = gather_sequence(a.ln1, tp).view({B, T, C});
    Tensor dln1 = Tensor::zeros({B, T, C}, dt, dev);
    block.attn.backward(dln1, dattn, ln1_full, a.attn);
    const Tensor dln1_sp = gather_sequence_backward(dln1, tp);
    layernorm_backward_rows(block.ln1, dx, dln1_sp, x_sp, a.ln1_mean, a.ln1_rstd, tp);
  }
  // END SOLUTION
  return dx;
}

// ---- Step 6: measure --------------------------------------------------------------------------

std::size_t activation_bytes_formula(const ModelConfig& c, int64_t B, int64_t T, int tp,
                                     DType dtype, bool sp) {
  // BEGIN SOLUTION step 6: count what TPActivations holds, tensor by tensor
  // HINT: see BlockActivations / SPBlockActivations / TPActivations: which are (B*T, C) on every
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
  // HINT: follow one forward and one backward of TPGPT (embed, blocks, head) and list each call.
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
