#pragma once
/// @file moe.hpp
/// The ops a mixture-of-experts layer is built from (nn::MoE, lab 12), on both devices: the
/// router's softmax backward, top-k and the renormalised gates, the routing of each (token,
/// choice) to a row of its expert under a capacity, and the per-row scaling and dot products of
/// the gate-weighted combine. Dispatch and combine themselves move rows with ops::gather_rows and
/// ops::index_add_rows (ops.hpp): a row index of -1 is skipped, which is how a dropped token
/// leaves no row.
///
/// Dtypes: the router's tensors (probabilities, values, gates) are f32 or f64 (the router runs
/// in fp32 under mixed precision, as Megatron-core's does); multiply_rows and row_dot take data
/// rows of any training dtype with per-row numbers in stats_dtype (ops.hpp).
#include <cstdint>

#include "common/tensor.hpp"

namespace scalelab::ops {

/// din (N, E) += out * (dout - sum_e out * dout) per row: the backward of a row-wise softmax
/// (out = softmax(in)). f32 or f64, one dtype.
void softmax_backward(Tensor& din, const Tensor& out, const Tensor& dout);

/// Per row of x (N, E): the k largest values (N, k), largest first, and their columns
/// `indices` (N, k) i32; equal values are taken lowest column first. 1 <= k <= E. f32 or f64.
void top_k(Tensor& values, Tensor& indices, const Tensor& x, int64_t k);
/// dx (N, E) += the scatter of dvalues (N, k) into the columns `indices` (N, k) i32 named.
void top_k_backward(Tensor& dx, const Tensor& dvalues, const Tensor& indices);

/// out (N, k) = in / (sum of its row): the gates renormalised over the k chosen experts. f32 or
/// f64, positive rows.
void normalize_rows(Tensor& out, const Tensor& in);
/// din (N, k) += (dout - sum_j dout_j out_j) / S per row, S = the row sum of `in`: the backward
/// of normalize_rows (out recomputed from in).
void normalize_rows_backward(Tensor& din, const Tensor& dout, const Tensor& in);

/// The routing of N tokens' k choices `indices` (N, k) i32 (experts in [0, n_expert)) under a
/// capacity. The N rows form `groups` equal groups of consecutive tokens (GShard's groups: a
/// rank's own tokens under expert parallelism); in each group every expert takes at most
/// `capacity` (token, choice) pairs, in priority order: every token's first choice (token
/// order), then every second choice. The others are dropped.
///  - assigned (groups, E) i32: the pairs each group sent to each expert, before dropping;
///  - kept (groups, E) i32: min(assigned, capacity);
///  - dest (N, k) i32: the row of each pair in the dispatched layout, -1 if dropped. The layout
///    is expert-major, then group, then arrival: expert e's rows start after every row of the
///    experts before it, and within e, group g's after the groups before it.
void moe_route(Tensor& dest, Tensor& assigned, Tensor& kept, const Tensor& indices,
               int64_t n_expert, int64_t groups, int64_t capacity);

/// x[m, :] *= w[m]: x (M, C) f32, f64 or bf16; w (M) of stats_dtype(x).
void multiply_rows(Tensor& x, const Tensor& w);
/// out[m] = sum_c a[m, c] b[m, c] (accumulated in acc_t): a, b (M, C) of one dtype, out (M) of
/// its stats_dtype.
void row_dot(Tensor& out, const Tensor& a, const Tensor& b);

}  // namespace scalelab::ops
