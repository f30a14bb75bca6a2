// Dispatch: check shapes, dtypes and devices once, then call the tensors' device's backend.
#include "common/ops/ops.hpp"

#include "common/scalar.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/ops/cpu/ops_cpu.hpp"
#include "common/ops/cuda/ops_cuda.hpp"
#include "common/ops/device_dispatch.hpp"
#include "common/ops/trial_kernels.hpp"
#include "common/device.hpp"
#include "common/ops/work.hpp"

namespace scalelab::ops {

namespace {
using Shape = std::vector<int64_t>;

// Every tensor an op touches: defined, contiguous, on one device.
template <class... Ts>
Device check_placed(const char* op, const Tensor& first, const Ts&... rest) {
  const Tensor* all[] = {&first, &rest...};
  for (const Tensor* t : all) {
    SCALELAB_CHECK(t->defined(), "{}: undefined tensor", op);
    SCALELAB_CHECK(t->is_contiguous(), "{}: non-contiguous tensor {}", op, t->str());
    SCALELAB_CHECK(t->device() == first.device(), "{}: tensors on {} and {}", op,
                   first.device().str(), t->device().str());
  }
  return first.device();
}

// ... and of one dtype.
template <class... Ts>
Device check_same(const char* op, const Tensor& first, const Ts&... rest) {
  Device d = check_placed(op, first, rest...);
  for (const Tensor* t : {&first, &rest...})
    SCALELAB_CHECK(t->dtype() == first.dtype(), "{}: dtypes {} and {}", op,
                   dtype_name(first.dtype()), dtype_name(t->dtype()));
  return d;
}

bool is_float_type(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16; }

// The mixed-precision exception (R2, R3, R4, R6): a result that is the data's dtype, or f32 when
// the data is bf16 -- fp32 accumulation into an fp32 gradient.
void check_data_or_f32(const char* op, const char* what, const Tensor& t, DType data) {
  SCALELAB_CHECK(t.dtype() == data || (data == DType::bf16 && t.dtype() == DType::f32),
                 "{}: {} is {}; with {} data it must be {}{}", op, what, dtype_name(t.dtype()),
                 dtype_name(data), dtype_name(data), data == DType::bf16 ? " or f32" : "");
}

// Statistics and losses (R3, R5): stats_dtype (ops.hpp).
void check_stats(const char* op, const char* what, const Tensor& t, DType data) {
  SCALELAB_CHECK(t.dtype() == stats_dtype(data), "{}: {} is {}; with {} data it must be {}", op,
                 what, dtype_name(t.dtype()), dtype_name(data), dtype_name(stats_dtype(data)));
}

void check_shape(const char* op, const char* what, const Tensor& t, const Shape& shape) {
  SCALELAB_CHECK(t.shape() == shape, "{}: {} has shape {}, expected ({})", op, what, t.str(),
                 fmt::join(shape, ", "));
}

void check_ids(const char* op, const Tensor& ids, Device device) {
  SCALELAB_CHECK(ids.defined() && ids.dtype() == DType::i32 && ids.is_contiguous(),
                 "{}: token ids must be contiguous i32, got {}", op, ids.str());
  SCALELAB_CHECK(ids.device() == device, "{}: ids on {}, data on {}", op, ids.device().str(),
                 device.str());
}

// Rows of a tensor viewed as (N, C) with C its last dimension.
int64_t rows_of(const Tensor& t) { return t.dim() == 0 ? 1 : t.numel() / t.size(-1); }

bool g_allow_tf32 = false;
}  // namespace

void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha,
            double beta) {
  Device d = check_same("matmul", a, b);
  check_placed("matmul", a, out);
  check_data_or_f32("matmul", "out", out, a.dtype());
  SCALELAB_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2, "matmul: 2-d only: {} {} {}",
                 out.str(), a.str(), b.str());
  const int64_t M = ta ? a.size(1) : a.size(0), K = ta ? a.size(0) : a.size(1);
  const int64_t Kb = tb ? b.size(1) : b.size(0), N = tb ? b.size(0) : b.size(1);
  SCALELAB_CHECK(K == Kb && out.size(0) == M && out.size(1) == N,
                 "matmul: {}{} @ {}{} -> {}", a.str(), ta ? "^T" : "", b.str(), tb ? "^T" : "",
                 out.str());
  count_matmul(1, M, N, K);
  SCALELAB_DISPATCH(d, matmul(out, a, b, ta, tb, alpha, beta, 1, M, N, K));
}

void batched_matmul(Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb,
                    double alpha, double beta) {
  Device d = check_same("batched_matmul", a, b);
  check_placed("batched_matmul", a, out);
  check_data_or_f32("batched_matmul", "out", out, a.dtype());
  SCALELAB_CHECK(a.dim() == 3 && b.dim() == 3 && out.dim() == 3,
                 "batched_matmul: 3-d only: {} {} {}", out.str(), a.str(), b.str());
  const int64_t batch = a.size(0);
  const int64_t M = ta ? a.size(2) : a.size(1), K = ta ? a.size(1) : a.size(2);
  const int64_t Kb = tb ? b.size(2) : b.size(1), N = tb ? b.size(1) : b.size(2);
  SCALELAB_CHECK(b.size(0) == batch && out.size(0) == batch && K == Kb && out.size(1) == M &&
                     out.size(2) == N,
                 "batched_matmul: {}{} @ {}{} -> {}", a.str(), ta ? "^T" : "", b.str(),
                 tb ? "^T" : "", out.str());
  count_matmul(batch, M, N, K);
  SCALELAB_DISPATCH(d, matmul(out, a, b, ta, tb, alpha, beta, batch, M, N, K));
}

void fill(Tensor& x, double value) { SCALELAB_DISPATCH(check_same("fill", x), fill(x, value)); }

void scale(Tensor& x, double a) { SCALELAB_DISPATCH(check_same("scale", x), scale(x, a)); }

void axpy(Tensor& y, double a, const Tensor& x) {
  Device d = check_same("axpy", y, x);
  SCALELAB_CHECK(y.numel() == x.numel(), "axpy: {} += a * {}", y.str(), x.str());
  SCALELAB_DISPATCH(d, axpy(y, a, x));
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  Device d = check_same("add", out, a, b);
  SCALELAB_CHECK(out.numel() == a.numel() && a.numel() == b.numel(), "add: {} = {} + {}",
                 out.str(), a.str(), b.str());
  SCALELAB_DISPATCH(d, add(out, a, b));
}

void copy(Tensor& dst, const Tensor& src) {
  Device d = check_same("copy", dst, src);
  SCALELAB_CHECK(dst.numel() == src.numel(), "copy: {} <- {}", dst.str(), src.str());
  SCALELAB_DISPATCH(d, copy(dst, src));
}

void cast(Tensor& dst, const Tensor& src) {
  Device d = check_placed("cast", dst, src);
  SCALELAB_CHECK(is_float_type(dst.dtype()) && is_float_type(src.dtype()),
                 "cast: {} <- {}: only f32, f64 and bf16", dst.str(), src.str());
  SCALELAB_CHECK(dst.numel() == src.numel(), "cast: {} <- {}", dst.str(), src.str());
  SCALELAB_DISPATCH(d, cast(dst, src));
}

void add_bias(Tensor& out, const Tensor& bias) {
  Device d = check_same("add_bias", out, bias);
  check_shape("add_bias", "bias", bias, {out.size(-1)});
  SCALELAB_DISPATCH(d, add_bias(out, bias));
}

void bias_backward(Tensor& dbias, const Tensor& dout) {
  Device d = check_placed("bias_backward", dbias, dout);
  check_data_or_f32("bias_backward", "dbias", dbias, dout.dtype());
  check_shape("bias_backward", "dbias", dbias, {dout.size(-1)});
  SCALELAB_DISPATCH(d, bias_backward(dbias, dout));
}

void gelu_forward(Tensor& out, const Tensor& in) {
  Device d = check_same("gelu_forward", out, in);
  check_shape("gelu_forward", "out", out, in.shape());
  SCALELAB_DISPATCH(d, gelu_forward(out, in));
}

void gelu_backward(Tensor& din, const Tensor& in, const Tensor& dout) {
  Device d = check_same("gelu_backward", din, in, dout);
  check_shape("gelu_backward", "din", din, in.shape());
  check_shape("gelu_backward", "dout", dout, in.shape());
  SCALELAB_DISPATCH(d, gelu_backward(din, in, dout));
}

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& in,
                       const Tensor& weight, const Tensor& bias, double eps) {
  Device d = check_same("layernorm_forward", out, in, weight, bias);
  check_placed("layernorm_forward", in, mean, rstd);
  check_stats("layernorm_forward", "mean", mean, in.dtype());
  check_stats("layernorm_forward", "rstd", rstd, in.dtype());
  const int64_t N = rows_of(in), C = in.size(-1);
  check_shape("layernorm_forward", "out", out, in.shape());
  check_shape("layernorm_forward", "mean", mean, {N});
  check_shape("layernorm_forward", "rstd", rstd, {N});
  check_shape("layernorm_forward", "weight", weight, {C});
  check_shape("layernorm_forward", "bias", bias, {C});
  count_layernorm_rows(N);
  SCALELAB_DISPATCH(d, layernorm_forward(out, mean, rstd, in, weight, bias, eps));
}

void layernorm_backward(Tensor& din, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& in, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dresidual) {
  Device d = check_same("layernorm_backward", din, dout, in, weight);
  if (dresidual.defined()) {  // din = dresidual + ...: the same rows, device and dtype as din
    check_same("layernorm_backward", din, dresidual);
    check_shape("layernorm_backward", "dresidual", dresidual, in.shape());
  }
  check_placed("layernorm_backward", in, dweight, dbias, mean, rstd);
  check_data_or_f32("layernorm_backward", "dweight", dweight, in.dtype());
  SCALELAB_CHECK(dbias.dtype() == dweight.dtype(), "layernorm_backward: dweight {}, dbias {}",
                 dweight.str(), dbias.str());
  check_stats("layernorm_backward", "mean", mean, in.dtype());
  check_stats("layernorm_backward", "rstd", rstd, in.dtype());
  const int64_t N = rows_of(in), C = in.size(-1);
  check_shape("layernorm_backward", "din", din, in.shape());
  check_shape("layernorm_backward", "dout", dout, in.shape());
  check_shape("layernorm_backward", "dweight", dweight, {C});
  check_shape("layernorm_backward", "dbias", dbias, {C});
  check_shape("layernorm_backward", "mean", mean, {N});
  check_shape("layernorm_backward", "rstd", rstd, {N});
  count_layernorm_rows(N);
  // without a residual gradient din is its own base: din += ...
  const Tensor& base = dresidual.defined() ? dresidual : din;
  SCALELAB_DISPATCH(d, layernorm_backward(din, dweight, dbias, dout, in, weight, mean, rstd,
                                          base));
}

void softmax_forward(Tensor& out, const Tensor& in) {
  Device d = check_same("softmax_forward", out, in);
  check_shape("softmax_forward", "out", out, in.shape());
  SCALELAB_DISPATCH(d, softmax_forward(out, in));
}

void split_heads(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, int64_t n_head) {
  Device d = check_same("split_heads", q, k, v, qkv);
  SCALELAB_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * n_head) == 0,
                 "split_heads: qkv {} is not (B, T, 3 * {} * hs)", qkv.str(), n_head);
  const int64_t B = qkv.size(0), T = qkv.size(1), hs = qkv.size(2) / (3 * n_head);
  for (const Tensor* t : {&q, &k, &v}) check_shape("split_heads", "q/k/v", *t, {B, n_head, T, hs});
  SCALELAB_DISPATCH(d, split_heads(q, k, v, qkv, n_head));
}

void split_heads_backward(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  Device d = check_same("split_heads_backward", dqkv, dq, dk, dv);
  SCALELAB_CHECK(dq.dim() == 4, "split_heads_backward: dq {} is not (B, NH, T, hs)", dq.str());
  const int64_t B = dq.size(0), NH = dq.size(1), T = dq.size(2), hs = dq.size(3);
  check_shape("split_heads_backward", "dk", dk, dq.shape());
  check_shape("split_heads_backward", "dv", dv, dq.shape());
  check_shape("split_heads_backward", "dqkv", dqkv, {B, T, 3 * NH * hs});
  SCALELAB_DISPATCH(d, split_heads_backward(dqkv, dq, dk, dv));
}

void merge_heads(Tensor& out, const Tensor& y) {
  Device d = check_same("merge_heads", out, y);
  SCALELAB_CHECK(y.dim() == 4, "merge_heads: y {} is not (B, NH, T, hs)", y.str());
  check_shape("merge_heads", "out", out, {y.size(0), y.size(2), y.size(1) * y.size(3)});
  SCALELAB_DISPATCH(d, merge_heads(out, y));
}

void merge_heads_backward(Tensor& dy, const Tensor& dout) {
  Device d = check_same("merge_heads_backward", dy, dout);
  SCALELAB_CHECK(dy.dim() == 4, "merge_heads_backward: dy {} is not (B, NH, T, hs)", dy.str());
  check_shape("merge_heads_backward", "dout", dout, {dy.size(0), dy.size(2), dy.size(1) * dy.size(3)});
  SCALELAB_DISPATCH(d, merge_heads_backward(dy, dout));
}

void causal_softmax_forward(Tensor& att, const Tensor& preatt, double scale) {
  Device d = check_same("causal_softmax_forward", att, preatt);
  SCALELAB_CHECK(preatt.dim() == 3 && preatt.size(1) == preatt.size(2),
                 "causal_softmax_forward: preatt {} is not (BH, T, T)", preatt.str());
  check_shape("causal_softmax_forward", "att", att, preatt.shape());
  SCALELAB_DISPATCH(d, causal_softmax_forward(att, preatt, scale));
}

void causal_softmax_backward(Tensor& dpreatt, const Tensor& att, const Tensor& datt,
                             double scale) {
  Device d = check_same("causal_softmax_backward", dpreatt, att, datt);
  SCALELAB_CHECK(att.dim() == 3 && att.size(1) == att.size(2),
                 "causal_softmax_backward: att {} is not (BH, T, T)", att.str());
  check_shape("causal_softmax_backward", "datt", datt, att.shape());
  check_shape("causal_softmax_backward", "dpreatt", dpreatt, att.shape());
  SCALELAB_DISPATCH(d, causal_softmax_backward(dpreatt, att, datt, scale));
}

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  Device d = check_same("embedding_forward", out, wte, wpe);
  check_ids("embedding_forward", tokens, d);
  SCALELAB_CHECK(tokens.dim() == 2 && wte.dim() == 2 && wpe.dim() == 2,
                 "embedding_forward: tokens {} wte {} wpe {}", tokens.str(), wte.str(), wpe.str());
  const int64_t B = tokens.size(0), T = tokens.size(1), C = wte.size(1);
  SCALELAB_CHECK(T <= wpe.size(0), "embedding_forward: sequence of {} > {} positions", T,
                 wpe.size(0));
  check_shape("embedding_forward", "wpe", wpe, {wpe.size(0), C});
  check_shape("embedding_forward", "out", out, {B, T, C});
  SCALELAB_DISPATCH(d, embedding_forward(out, tokens, wte, wpe));
}

void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  SCALELAB_CHECK(dout.dim() == 3, "embedding_backward: dout {} is not (B, T, C)", dout.str());
  Device d = dout.device();
  check_ids("embedding_backward", tokens, d);
  check_shape("embedding_backward", "tokens", tokens, {dout.size(0), dout.size(1)});
  const int64_t C = dout.size(2);
  if (dwte.defined()) {
    check_placed("embedding_backward", dout, dwte);
    check_data_or_f32("embedding_backward", "dwte", dwte, dout.dtype());
    SCALELAB_CHECK(dwte.dim() == 2 && dwte.size(1) == C, "embedding_backward: dwte {}",
                   dwte.str());
  }
  if (dwpe.defined()) {
    check_placed("embedding_backward", dout, dwpe);
    check_data_or_f32("embedding_backward", "dwpe", dwpe, dout.dtype());
    if (dwte.defined())
      SCALELAB_CHECK(dwpe.dtype() == dwte.dtype(), "embedding_backward: dwte {}, dwpe {}",
                     dwte.str(), dwpe.str());
    SCALELAB_CHECK(dwpe.dim() == 2 && dwpe.size(1) == C && dwpe.size(0) >= dout.size(1),
                   "embedding_backward: dwpe {}", dwpe.str());
  }
  SCALELAB_DISPATCH(d, embedding_backward(dwte, dwpe, dout, tokens));
}

void cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits,
                           const Tensor& targets) {
  Device d = check_same("cross_entropy_forward", probs, logits);
  check_placed("cross_entropy_forward", logits, losses);
  check_stats("cross_entropy_forward", "losses", losses, logits.dtype());
  check_ids("cross_entropy_forward", targets, d);
  SCALELAB_CHECK(logits.dim() == 2, "cross_entropy_forward: logits {} is not (N, V)", logits.str());
  const int64_t N = logits.size(0);
  check_shape("cross_entropy_forward", "probs", probs, logits.shape());
  check_shape("cross_entropy_forward", "losses", losses, {N});
  check_shape("cross_entropy_forward", "targets", targets, {N});
  SCALELAB_DISPATCH(d, cross_entropy_forward(losses, probs, logits, targets));
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets,
                            double dloss, int64_t lo) {
  Device d = check_same("cross_entropy_backward", dlogits, probs);
  check_ids("cross_entropy_backward", targets, d);
  SCALELAB_CHECK(probs.dim() == 2, "cross_entropy_backward: probs {} is not (N, V)", probs.str());
  check_shape("cross_entropy_backward", "dlogits", dlogits, probs.shape());
  check_shape("cross_entropy_backward", "targets", targets, {probs.size(0)});
  SCALELAB_CHECK(lo >= 0, "cross_entropy_backward: column offset {} < 0", lo);
  SCALELAB_DISPATCH(d, cross_entropy_backward(dlogits, probs, targets, dloss, lo));
}

// ---- per-row pieces of a softmax, and masked indexing ----

namespace {
// x (N, V) of a training dtype and a per-row vector (N) of its statistics' dtype.
Device check_rows(const char* op, const char* what, const Tensor& row_stat, const Tensor& x) {
  Device d = check_placed(op, x, row_stat);
  SCALELAB_CHECK(is_float_type(x.dtype()) && x.dim() == 2, "{}: x {} is not (N, V) f32, f64 or "
                 "bf16", op, x.str());
  check_stats(op, what, row_stat, x.dtype());
  check_shape(op, what, row_stat, {x.size(0)});
  return d;
}
}  // namespace

void row_max(Tensor& max, const Tensor& x) {
  Device d = check_rows("row_max", "max", max, x);
  SCALELAB_CHECK(x.size(1) > 0, "row_max: rows of x {} are empty", x.str());
  SCALELAB_DISPATCH(d, row_max(max, x));
}

void exp_rows(Tensor& x, Tensor& sum, const Tensor& max) {
  Device d = check_rows("exp_rows", "sum", sum, x);
  check_rows("exp_rows", "max", max, x);
  SCALELAB_DISPATCH(d, exp_rows(x, sum, max));
}

void divide_rows(Tensor& x, const Tensor& s) {
  Device d = check_rows("divide_rows", "s", s, x);
  SCALELAB_DISPATCH(d, divide_rows(x, s));
}

void pick_columns(Tensor& out, const Tensor& x, const Tensor& ids, int64_t lo) {
  Device d = check_rows("pick_columns", "out", out, x);
  check_ids("pick_columns", ids, d);
  check_shape("pick_columns", "ids", ids, {x.size(0)});
  SCALELAB_DISPATCH(d, pick_columns(out, x, ids, lo));
}

void gather_rows(Tensor& out, const Tensor& table, const Tensor& ids, int64_t lo) {
  Device d = check_same("gather_rows", out, table);
  check_ids("gather_rows", ids, d);
  SCALELAB_CHECK(is_float_type(table.dtype()) && table.dim() == 2 && ids.dim() == 1,
                 "gather_rows: table {} is not (R, C) or ids {} not (N)", table.str(), ids.str());
  check_shape("gather_rows", "out", out, {ids.size(0), table.size(1)});
  SCALELAB_DISPATCH(d, gather_rows(out, table, ids, lo));
}

void index_add_rows(Tensor& table, const Tensor& src, const Tensor& ids, int64_t lo) {
  Device d = check_placed("index_add_rows", src, table);
  check_ids("index_add_rows", ids, d);
  SCALELAB_CHECK(is_float_type(src.dtype()) && table.dim() == 2 && ids.dim() == 1,
                 "index_add_rows: table {} is not (R, C) or ids {} not (N)", table.str(),
                 ids.str());
  check_data_or_f32("index_add_rows", "table", table, src.dtype());
  check_shape("index_add_rows", "src", src, {ids.size(0), table.size(1)});
  SCALELAB_DISPATCH(d, index_add_rows(table, src, ids, lo));
}

void logarithm(Tensor& out, const Tensor& in) {
  Device d = check_same("logarithm", out, in);
  SCALELAB_CHECK(in.dtype() == DType::f32 || in.dtype() == DType::f64,
                 "logarithm: {} (statistics are f32 or f64)", in.str());
  check_shape("logarithm", "out", out, in.shape());
  SCALELAB_DISPATCH(d, logarithm(out, in));
}

double sum(const Tensor& x) {
  Device d = check_same("sum", x);
  const HostRead read("ops::sum");  // the number comes back to the host (scalar.hpp)
  if (d.is_cuda()) return cuda::sum(x);
  const SimKernelScope in_kernel;
  return cpu::sum(x);
}

double sum_squares(const Tensor& x) {
  Device d = check_same("sum_squares", x);
  const HostRead read("ops::sum_squares");
  if (d.is_cuda()) return cuda::sum_squares(x);
  const SimKernelScope in_kernel;
  return cpu::sum_squares(x);
}

void sum_into(Tensor& out, const Tensor& x, double divisor) {
  Device d = check_placed("sum_into", out, x);
  SCALELAB_CHECK(out.numel() == 1 && out.dtype() == DType::f64,
                 "sum_into: out {} (one f64 element)", out.str());
  SCALELAB_DISPATCH(d, sum_into(out, x, divisor));
}

// The norm's kernels on a GPU (sum_squares_into, clip_scale, sqrt_into) are "norm_on_device"
// (trial_kernels.hpp: checked on an H200); turned off, a GPU takes the way through the host: the
// same arithmetic on numbers read back (each read counted). The simulated GPU follows the GPU's
// choice (trial_kernels.hpp), so its host reads are a GPU's.
namespace {
bool norm_on_device(Device d) { return d.is_cpu() || trial_kernel("norm_on_device"); }
// a one-element f64 tensor's value, read back from its GPU
double read_back(const Tensor& t) {
  const HostRead read("gradient norm");
  return t.to(Device::cpu()).item();
}
// sets a one-element f64 tensor on its GPU
void write_back(Tensor& t, double v) { t.copy_from(Tensor::from_vector({v}, {1}, DType::f64)); }
}  // namespace

void sum_squares_into(Tensor& out, const Tensor& x) {
  Device d = check_placed("sum_squares_into", out, x);
  SCALELAB_CHECK(out.numel() == 1 && out.dtype() == DType::f64,
                 "sum_squares_into: out {} (one f64 element)", out.str());
  if (!norm_on_device(d)) return write_back(out, read_back(out) + sum_squares(x));
  SCALELAB_DISPATCH(d, sum_squares_into(out, x));
}

void clip_scale(Tensor& x, const Tensor& sum_squares, double max_norm) {
  Device d = check_placed("clip_scale", x, sum_squares);
  SCALELAB_CHECK(sum_squares.numel() == 1 && sum_squares.dtype() == DType::f64,
                 "clip_scale: sum_squares {} (one f64 element)", sum_squares.str());
  if (!norm_on_device(d)) {
    const double norm = std::sqrt(read_back(sum_squares));
    if (norm > max_norm) scale(x, max_norm / (norm + 1e-6));
    return;
  }
  SCALELAB_DISPATCH(d, clip_scale(x, sum_squares, max_norm));
}

void sqrt_into(Tensor& out, const Tensor& x) {
  Device d = check_same("sqrt_into", out, x);
  SCALELAB_CHECK(out.numel() == x.numel(), "sqrt_into: out {} for x {}", out.str(), x.str());
  if (!norm_on_device(d)) {
    SCALELAB_CHECK(x.numel() == 1 && x.dtype() == DType::f64,
                   "sqrt_into: {} on a GPU takes one f64 element until \"norm_on_device\" is "
                   "checked", x.str());
    return write_back(out, std::sqrt(read_back(x)));
  }
  SCALELAB_DISPATCH(d, sqrt_into(out, x));
}

namespace {
// What both AdamW updates need of their arguments: master weights f32 or f64, grad, m, v (and a
// bf16 compute copy) of their size on their device, a step from 1. Returns the device.
Device check_adamw(const char* op, const Tensor& param, const Tensor& grad, const Tensor& m,
                   const Tensor& v, const AdamWArgs& a, const Tensor* compute) {
  Device d = check_same(op, param, grad, m, v);
  SCALELAB_CHECK(param.dtype() == DType::f32 || param.dtype() == DType::f64,
                 "{}: {} parameters; master weights and state are f32 or f64 (a bf16 "
                 "compute copy is the `compute` argument)", op, dtype_name(param.dtype()));
  if (compute) {
    check_placed(op, param, *compute);
    SCALELAB_CHECK(compute->dtype() == DType::bf16 && compute->numel() == param.numel(),
                   "{}: compute copy {} for parameters {} (must be bf16, same numel)", op,
                   compute->str(), param.str());
  }
  SCALELAB_CHECK(grad.numel() == param.numel() && m.numel() == param.numel() &&
                     v.numel() == param.numel(),
                 "{}: sizes {} {} {} {}", op, param.str(), grad.str(), m.str(), v.str());
  SCALELAB_CHECK(a.step >= 1, "{}: step {} (counts from 1)", op, a.step);
  return d;
}
}  // namespace

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& a,
                  Tensor* compute) {
  Device d = check_adamw("adamw_update", param, grad, m, v, a, compute);
  SCALELAB_DISPATCH(d, adamw_update(param, grad, m, v, a, compute));
}

void adamw_update_segments(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                           const DecaySegments& segments, const AdamWArgs& a, Tensor* compute) {
  const std::vector<int64_t>& ends = segments.ends;
  SCALELAB_CHECK(!ends.empty() && ends.size() == segments.decay.size() &&
                     ends.back() == param.numel() && std::is_sorted(ends.begin(), ends.end()) &&
                     ends.front() >= 0,
                 "adamw_update_segments: {} segment ends (the last {}) for {} elements",
                 ends.size(), ends.empty() ? 0 : ends.back(), param.numel());
  if (param.numel() == 0) return;
  Device d = check_adamw("adamw_update_segments", param, grad, m, v, a, compute);  // whole buffers
  if (d.is_cuda() && ends.size() <= static_cast<std::size_t>(kMaxDecaySegments))
    return cuda::adamw_update_segments(param, grad, m, v, segments, a, compute);
  // The host has no launches to save (and a GPU table holds kMaxDecaySegments): one update per
  // segment, the bits of one update per parameter.
  int64_t lo = 0;
  for (std::size_t i = 0; i < ends.size(); ++i) {
    const int64_t n = ends[i] - lo;
    if (n > 0) {
      AdamWArgs ai = a;
      if (!segments.decay[i]) ai.weight_decay = 0;
      Tensor p = param.flat(lo, n), pm = m.flat(lo, n), pv = v.flat(lo, n);
      Tensor c = compute ? compute->flat(lo, n) : Tensor();
      adamw_update(p, grad.flat(lo, n), pm, pv, ai, compute ? &c : nullptr);
    }
    lo = ends[i];
  }
}

void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, double lr, double momentum,
                double weight_decay, bool first_step) {
  Device d = check_same("sgd_update", param, grad);
  SCALELAB_CHECK(grad.numel() == param.numel(), "sgd_update: {} {}", param.str(), grad.str());
  if (momentum > 0) {
    check_same("sgd_update", param, buf);
    SCALELAB_CHECK(buf.numel() == param.numel(), "sgd_update: buffer {}", buf.str());
  }
  SCALELAB_DISPATCH(d, sgd_update(param, grad, buf, lr, momentum, weight_decay, first_step));
}

void set_allow_tf32(bool allow) {
  g_allow_tf32 = allow;
  if (cuda_compiled()) cuda::set_allow_tf32(allow);
}

bool allow_tf32() { return g_allow_tf32; }

}  // namespace scalelab::ops
