#pragma once
/// @file fused_norm.hpp
/// The residual add and the LayerNorm that follows it, in one pass over the rows (llm.c's
/// fused_residual_forward). A transformer block does, between its sub-layers,
///
///     res = x + residual;  ln = LayerNorm(res)
///
/// Unfused that is ops::add (read 2 rows, write 1) then ops::layernorm_forward (read it back,
/// write 1); fused, each row is read once, so the pair moves 4 row-sized streams instead of 5 and
/// launches one kernel instead of two. Both outputs are kept: res is the next residual stream,
/// ln the next sub-layer's input.
///
/// How a block calls it (common/nn integrates it; the backward is layernorm_backward on res,
/// given the residual's gradient so that it sets din = dresidual + ... in the same pass):
///
///     ops::residual_layernorm_forward(acts.res2, acts.ln2, acts.ln2_mean, acts.ln2_rstd,
///                                     attn_out, x, ln2.weight, ln2.bias);
///
/// instead of ops::add(acts.res2, x, attn_out); ops::layernorm_forward(acts.ln2, ..., acts.res2, ...).
#include "common/tensor.hpp"

namespace scalelab::ops {

/// Per row of x, residual (N, C): res_out = x + residual (stored, rounded to the data type), then
/// ln_out = (res_out - mean) * rstd * weight + bias over that stored row. x, residual, res_out,
/// ln_out, weight (C), bias (C) of one dtype (f32, f64 or bf16); mean, rstd (N) f32 for f32 and
/// bf16 data, f64 for f64 (R3). The same result as ops::add then ops::layernorm_forward.
void residual_layernorm_forward(Tensor& res_out, Tensor& ln_out, Tensor& mean, Tensor& rstd,
                                const Tensor& x, const Tensor& residual, const Tensor& weight,
                                const Tensor& bias, double eps = 1e-5);

}  // namespace scalelab::ops
