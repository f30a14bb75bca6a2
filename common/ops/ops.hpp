#pragma once
/// @file ops.hpp
/// The ops every layer is built from: one function per op, dispatched on the tensors' device to
/// ops/cpu (OpenBLAS + loops) or ops/cuda (cuBLAS + kernels). Each checks shapes, dtypes and
/// devices once, here, so the backends can trust their inputs.
///
/// Conventions (as in llm.c):
///  - every tensor is contiguous; shapes are in the comments, e.g. (N, C) with N = B*T rows;
///  - `*_backward` functions ACCUMULATE (+=) into parameter gradients and into input gradients
///    (`din`), so a tensor used twice (a residual, a tied weight) gets the sum of both paths;
///    functions documented as "sets" overwrite instead;
///  - f32 everywhere; f64 too on the host (and on CUDA) so gradient checks are exact enough;
///    bf16 (common/bf16.hpp) for mixed precision, under the rules below.
///
/// bf16, the mixed-precision rules (checked in ops.cpp; both backends implement them). bf16 is a
/// STORAGE type: every kernel loads bf16 into float, computes in float (double for f64) and rounds
/// once when it stores (nearest, ties to even). What stays fp32 in mixed precision is what needs
/// the 24-bit mantissa: master weights, gradients, optimizer state, LayerNorm statistics, losses.
///  R1. bf16 is accepted wherever f32 is (all tensors of the op bf16) for: fill, scale, axpy, add,
///      copy, add_bias, gelu_forward/backward, softmax_forward, split_heads(_backward),
///      merge_heads(_backward), causal_softmax_forward/backward, matmul, batched_matmul, sum and
///      sum_squares (both accumulate in double), cast.
///  R2. matmul / batched_matmul: a and b of one dtype; out of that dtype, OR out f32 with a and b
///      bf16 (fp32 accumulation written to fp32: how a weight gradient lands in an fp32 gradient
///      buffer with beta = 1). Accumulation is always fp32 (f64 for f64).
///  R3. layernorm_forward: out, in, weight, bias of one dtype; mean and rstd f32 when that is bf16.
///      layernorm_backward: din, dout, in, weight of the data dtype; dweight and dbias the data
///      dtype or f32 when it is bf16; mean, rstd as in forward.
///  R4. embedding_forward: out, wte, wpe of one dtype. embedding_backward: dout bf16 with dwte /
///      dwpe f32 allowed (fp32 gradients).
///  R5. cross_entropy_forward: logits bf16 allowed, then losses f32; probs the logits' dtype.
///      cross_entropy_backward: dlogits and probs of one dtype. Softmax and log in float.
///  R6. bias_backward: dbias f32 with dout bf16 allowed.
///  R7. cast: any of f32, f64, bf16 to any of them.
///  R8. adamw_update: param, grad, m, v f32 (or f64); an optional bf16 `compute` of param's numel
///      also gets bf16(new param) in the same pass (update the master, refresh the compute copy).
#include <cstdint>

#include "common/tensor.hpp"

namespace scalelab::ops {

/// The dtype of LayerNorm statistics and losses for data of dtype `data` (R3, R5): f32 for bf16
/// data, else the data's own.
inline DType stats_dtype(DType data) { return data == DType::bf16 ? DType::f32 : data; }

// ---- linear algebra --------------------------------------------------------------------------

/// out = alpha * op(a) @ op(b) + beta * out, 2-d. op(a) is (M, K): a is (M, K), or (K, M) with
/// trans_a. op(b) is (K, N). out is (M, N). beta = 1 accumulates.
void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool trans_a = false,
            bool trans_b = false, double alpha = 1.0, double beta = 0.0);

/// matmul for each of `batch` matrices: a (batch, ., .), b (batch, ., .), out (batch, M, N).
void batched_matmul(Tensor& out, const Tensor& a, const Tensor& b, bool trans_a = false,
                    bool trans_b = false, double alpha = 1.0, double beta = 0.0);

// ---- pointwise -------------------------------------------------------------------------------

/// x[i] = value
void fill(Tensor& x, double value);
/// x[i] *= a
void scale(Tensor& x, double a);
/// y[i] += a * x[i]
void axpy(Tensor& y, double a, const Tensor& x);
/// out[i] = a[i] + b[i] (out may alias a or b)
void add(Tensor& out, const Tensor& a, const Tensor& b);
/// dst[i] = src[i], same device (a plain copy; Tensor::copy_from also crosses devices)
void copy(Tensor& dst, const Tensor& src);
/// dst[i] = src[i] converted: f32, f64, bf16 to any of them, same numel (R7). Into bf16 rounds
/// to nearest, ties to even; bf16 -> f32 is exact.
void cast(Tensor& dst, const Tensor& src);
/// out (N, C) += bias (C), broadcast over rows
void add_bias(Tensor& out, const Tensor& bias);
/// dbias (C) += sum over rows of dout (N, C)
void bias_backward(Tensor& dbias, const Tensor& dout);
/// out = GELU(in), tanh approximation as GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(Tensor& out, const Tensor& in);
/// din += GELU'(in) * dout
void gelu_backward(Tensor& din, const Tensor& in, const Tensor& dout);

// ---- normalisation and softmax ---------------------------------------------------------------

/// Per row of in (N, C): out = (in - mean) * rstd * weight + bias; saves mean (N), rstd (N).
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& in,
                       const Tensor& weight, const Tensor& bias, double eps = 1e-5);
/// Accumulates din (N, C), dweight (C), dbias (C) from dout (N, C). With `dresidual` (N, C, the
/// data dtype) din is set instead: din = dresidual + the input gradient. That is the backward of
/// a residual stream entering the LayerNorm (res -> LayerNorm and res -> the skip path): the
/// skip path's gradient is added in the same pass, with no copy of it into din first.
void layernorm_backward(Tensor& din, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& in, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dresidual = Tensor());
/// Row-wise softmax of in (N, C) (sets out).
void softmax_forward(Tensor& out, const Tensor& in);

// ---- attention pieces ------------------------------------------------------------------------

/// qkv (B, T, 3C) laid out [q | k | v], each C = NH * hs wide, -> q, k, v (B, NH, T, hs). Sets.
void split_heads(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, int64_t n_head);
/// The adjoint of split_heads: sets dqkv (B, T, 3C) from dq, dk, dv (B, NH, T, hs).
void split_heads_backward(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv);
/// y (B, NH, T, hs) -> out (B, T, C), heads side by side. Sets.
void merge_heads(Tensor& out, const Tensor& y);
/// The adjoint of merge_heads: sets dy (B, NH, T, hs) from dout (B, T, C).
void merge_heads_backward(Tensor& dy, const Tensor& dout);
/// Per (B*NH) matrix of preatt (BH, T, T): att[t, s] = softmax over s <= t of scale *
/// preatt[t, s], and 0 for s > t (the causal mask). Sets att.
void causal_softmax_forward(Tensor& att, const Tensor& preatt, double scale);
/// Sets dpreatt (BH, T, T) from att and datt: the softmax's Jacobian times datt, times scale.
void causal_softmax_backward(Tensor& dpreatt, const Tensor& att, const Tensor& datt,
                             double scale);

// ---- embeddings and loss ---------------------------------------------------------------------

/// out (B, T, C) = wte[tokens[b, t]] + wpe[t]; tokens (B, T) i32, wte (V, C), wpe (maxT, C).
void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe);
/// dwte[tokens[b, t]] += dout[b, t]; dwpe[t] += dout[b, t]. Either gradient may be undefined
/// (skipped): a tensor-parallel or pipelined model may own only one of them.
void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens);
/// For logits (N, V) and targets (N) i32: probs = softmax(logits), losses[n] = -log
/// probs[n, targets[n]]. Sets probs (N, V) and losses (N).
void cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits,
                           const Tensor& targets);
/// Sets dlogits (N, V) = dloss * (probs - onehot(targets)): the gradient of dloss * sum(losses).
/// With lo, probs holds the columns [lo, lo + V) of a vocabulary split over ranks (lab 07): the
/// one-hot has its 1 in column targets[n] - lo when that lies in [0, V), nowhere otherwise.
/// dlogits may be probs (in place).
void cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets,
                            double dloss, int64_t lo = 0);

// ---- per-row pieces of a softmax, and masked indexing ----------------------------------------
// What a vocabulary-parallel embedding and cross-entropy (lab 07, Megatron-LM's) are built from,
// on both devices: each rank holds the columns (or table rows) [lo, lo + V_local) of the whole
// vocabulary, so an id names a column here only if it falls in that range ("masked"). The per-row
// numbers (max, sum, picked logit) are in stats_dtype(x): f32 for bf16 data (R5).

/// max (N) = the largest element of each row of x (N, V).
void row_max(Tensor& max, const Tensor& x);
/// In place, per row n of x (N, V): x[n, v] = exp(x[n, v] - max[n]); sum[n] = the row's sum of
/// those exponentials, taken before they are rounded to x's dtype. max, sum (N).
void exp_rows(Tensor& x, Tensor& sum, const Tensor& max);
/// In place: x[n, v] /= s[n]. x (N, V), s (N) in stats_dtype(x).
void divide_rows(Tensor& x, const Tensor& s);
/// Masked pick: out[n] = x[n, ids[n] - lo] when lo <= ids[n] < lo + V, else 0. x (N, V), ids (N)
/// i32, out (N) in stats_dtype(x): the target's logit on the rank holding its column.
void pick_columns(Tensor& out, const Tensor& x, const Tensor& ids, int64_t lo);
/// Masked gather: out[n] = table[ids[n] - lo] when lo <= ids[n] < lo + R, else a row of zeros.
/// table (R, C), ids (N) i32, out (N, C), out and table of one dtype.
void gather_rows(Tensor& out, const Tensor& table, const Tensor& ids, int64_t lo);
/// Masked index add: table[ids[n] - lo] += src[n] for the ids in [lo, lo + R), the others
/// skipped; rows added in order n = 0, 1, ... (deterministic). table (R, C), src (N, C), ids (N)
/// i32; table of src's dtype, or f32 with bf16 src (R4: fp32 gradients).
void index_add_rows(Tensor& table, const Tensor& src, const Tensor& ids, int64_t lo);
/// out = log(in), elementwise; f32 or f64 (per-row statistics). out may be in.
void logarithm(Tensor& out, const Tensor& in);

// ---- reductions and optimizer updates ---------------------------------------------------------

/// Sum of all elements, accumulated in double (deterministic order on both devices).
double sum(const Tensor& x);
/// Sum of squares of all elements, accumulated in double (for global-norm clipping).
double sum_squares(const Tensor& x);
/// out (one f64 element on x's device) = the sum of x's elements / divisor, accumulated as sum()
/// accumulates them (the same bits as sum(x) / divisor): sum() without the copy to the host, so
/// a loss stays on its GPU (Scalar).
void sum_into(Tensor& out, const Tensor& x, double divisor = 1.0);
/// out (one f64 element on x's device) += the sum of squares of x's elements, accumulated as
/// sum_squares() accumulates them: `s += sum_squares(x)` without the copy to the host, so a
/// gradient norm over several tensors stays on its GPU (the same bits as the host's sum).
void sum_squares_into(Tensor& out, const Tensor& x);
/// Global-norm clipping without reading the norm to the host: with norm = sqrt(sum_squares)
/// (one f64 element on x's device, read there), x *= max_norm / (norm + 1e-6) when
/// norm > max_norm, else x is left as it is. The bits of ops::scale under the same test.
void clip_scale(Tensor& x, const Tensor& sum_squares, double max_norm);
/// out[i] = sqrt(x[i]) (same shape and dtype; a Scalar's square root on its device).
/// On a GPU these three run their kernels as the trial kernel "norm_on_device"
/// (trial_kernels.hpp); until it is checked there they read the number back (counted).
void sqrt_into(Tensor& out, const Tensor& x);

/// One AdamW step (PyTorch's AdamW: decoupled weight decay, bias correction):
///   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
///   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)          (t = step, from 1)
struct AdamWArgs {
  double lr = 1e-3;            ///< the learning rate
  double beta1 = 0.9;          ///< m's decay
  double beta2 = 0.95;         ///< v's decay
  double eps = 1e-8;           ///< added to the denominator
  double weight_decay = 0.0;   ///< decoupled weight decay (0: none)
  int64_t step = 1;            ///< t, from 1: the bias correction
};
/// `compute` (R8): when given, a bf16 tensor of param's numel that the same pass sets to
/// bf16(new param) -- the mixed-precision model's compute copy, refreshed without a second pass.
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& a,
                  Tensor* compute = nullptr);
/// Which elements of a flat buffer of parameters decay their weights: segment i is
/// [ends[i-1], ends[i]) (from 0; the last ends at the buffer's numel) and decays when decay[i].
struct DecaySegments {
  std::vector<int64_t> ends;  ///< one past each segment's last element, increasing
  std::vector<bool> decay;    ///< whether each segment's weights decay
};
/// adamw_update over a whole model's flat buffers at once: the same arithmetic per element, with
/// a.weight_decay on the segments that decay and 0 on the others (biases, LayerNorms). On a GPU
/// one launch for every parameter (at most kMaxDecaySegments segments; more run one launch per
/// segment), not one per parameter.
void adamw_update_segments(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                           const DecaySegments& segments, const AdamWArgs& a,
                           Tensor* compute = nullptr);
/// The most segments one launch of adamw_update_segments takes on a GPU (its table is a launch
/// argument).
inline constexpr int kMaxDecaySegments = 256;

/// SGD with momentum (PyTorch's): buf = momentum * buf + g (buf = g at the first step);
/// p -= lr * (buf if momentum > 0 else g); weight decay adds wd * p to g first.
void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, double lr, double momentum,
                double weight_decay, bool first_step);

// ---- CUDA math mode --------------------------------------------------------------------------

/// cuBLAS math mode for f32 matmuls: false (the default) keeps full fp32 (CUBLAS_DEFAULT_MATH
/// with TF32 disallowed), true allows TF32 tensor cores. No-op without CUDA.
void set_allow_tf32(bool allow);
/// Whether set_allow_tf32(true) is in effect.
bool allow_tf32();

}  // namespace scalelab::ops
