#pragma once
// Fused causal self-attention that never holds the (T, T) attention matrix: "flash attention"
// (Dao et al. 2022, FlashAttention; Dao 2023, FlashAttention-2 for the loop order used here).
//
// The unfused path (common/nn/attention.cpp) computes preatt = q k^T (BH, T, T), att =
// causal_softmax(scale * preatt), y = att v, and keeps att for backward: T^2 numbers per head,
// 4 GiB of bf16 for gpt-85m at B = 16, T = 1024. Flash attention walks the keys in tiles and keeps,
// per query row, only a running max m, a running sum l of exp(s - m) and the partial output
// (rescaled by exp(m_old - m_new) whenever the max grows: the "online softmax"). Backward keeps
// only lse = m + log(l) per row and recomputes each tile's probabilities p = exp(s - lse).
//
// Shapes: q, k, v, out, dout, dq, dk, dv (BH, T, hs), BH = B * n_head, one dtype: f32, f64 or
// bf16 (compute in float, in double for f64). lse (BH, T) is f32 for f32 and bf16 data, f64 for
// f64. The mask is causal: query t sees keys s <= t.
#include "common/tensor.hpp"

namespace scalelab::ops {

/// Sets out = softmax_causal(scale * q k^T) v and lse[bh, t] = log(sum_{s<=t} exp(scale q_t.k_s)).
void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, double scale);

/// Sets dq, dk, dv from dout, recomputing the probabilities tile by tile from q, k and lse.
/// out is the forward's output (D = rowsum(dout * out) replaces the T^2 term of the softmax
/// backward).
void flash_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, double scale);

/// The dtype of lse for data of `dtype`: f64 for f64, else f32.
DType flash_attention_lse_dtype(DType dtype);

}  // namespace scalelab::ops
