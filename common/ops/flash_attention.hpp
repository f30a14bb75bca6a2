#pragma once
/// @file flash_attention.hpp
/// Fused causal self-attention that never holds the (T, T) attention matrix: "flash attention"
/// (Dao et al. 2022, FlashAttention; Dao 2023, FlashAttention-2 for the loop order used here).
///
/// The unfused path (common/nn/attention.cpp) computes preatt = q k^T (BH, T, T), att =
/// causal_softmax(scale * preatt), y = att v, and keeps att for backward: T^2 numbers per head,
/// 4 GiB of bf16 for gpt-85m at B = 16, T = 1024. Flash attention walks the keys in tiles and keeps,
/// per query row, only a running max m, a running sum l of exp(s - m) and the partial output
/// (rescaled by exp(m_old - m_new) whenever the max grows: the "online softmax"). Backward keeps
/// only lse = m + log(l) per row and recomputes each tile's probabilities p = exp(s - lse).
///
/// Shapes: q, k, v, out, dout, dq, dk, dv (BH, T, hs), BH = B * n_head, one dtype: f32, f64 or
/// bf16 (compute in float, in double for f64). lse (BH, T) is f32 for f32 and bf16 data, f64 for
/// f64. The mask is causal (query t sees keys s <= t), or with causal = false there is none: every
/// query sees every key. The unmasked form is one block of ring attention (lab 11): this rank's
/// queries against keys that all come earlier in the sequence; attention_merge then combines
/// the blocks' partial results with the online-softmax rule. Local ops: no communication (lab 11's
/// ring moves the K/V blocks between calls). `nn::GPTOptions::flash_attention` selects this path.
///
/// nn::CausalSelfAttention calls the `_qkv` forms: they read q, k and v where the fused QKV
/// matmul wrote them, (B, T, 3C) with head h's columns at h*hs, C + h*hs, 2C + h*hs, and write y
/// as (B, T, C): no split_heads / merge_heads copies. Where a backend has no kernel for that
/// layout they run as split_heads, the (BH, T, hs) call, merge_heads (same results).
///
/// Two CUDA kernels compute it (set_flash_attention_version): version 1
/// (ops/cuda/flash_attention_cuda.cu), one query row per thread with scalar FMAs, the readable
/// lesson; version 2 (ops/cuda/flash_attention_tc_cuda.cu, the default), FlashAttention-2 on
/// tensor cores (bf16 mma.sync with fp32 accumulators), for bf16 and head sizes 64 and 128
/// (other dtypes and head sizes run version 1). On an H100 at B 16 x 12 heads x T 1024 x head 64,
/// causal bf16, version 2 ran at 145 / 93 TFLOP/s forward / backward, version 1 at 6.0 / 6.9 and
/// the unfused path at 37 / 62 (labs/02_single_device/README.md). The host has one implementation.
#include "common/tensor.hpp"

namespace scalelab::ops {

/// Sets out = softmax_causal(scale * q k^T) v and lse[bh, t] = log(sum_{s<=t} exp(scale q_t.k_s))
/// (causal = false: over every s). Counted in work_stats(): attention_pairs, and its two GEMMs'
/// calls and FLOPs (work.hpp).
void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, double scale, bool causal = true);

/// Sets dq, dk, dv from dout, recomputing the probabilities tile by tile from q, k and lse.
/// out is the forward's output (D = rowsum(dout * out) replaces the T^2 term of the softmax
/// backward). Given the out and lse of the WHOLE attention of these queries (over more keys than
/// k holds), it sets this block's share: the dq terms of these keys, and dk, dv of these keys
/// from these queries (ring attention's backward sums them over blocks). Counted in work_stats():
/// attention_pairs, and its five GEMMs' calls and FLOPs (work.hpp).
void flash_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, double scale, bool causal = true);

/// Merges the attention of the same queries over another, disjoint set of keys into (out, lse):
/// lse' = log(exp(lse) + exp(lse_b)), out' = out exp(lse - lse') + out_b exp(lse_b - lse'),
/// per row (the online-softmax rule, one block at a time). A row with lse_b = -inf is left as it
/// is. out, out_b (BH, T, hs) of one dtype; lse, lse_b (BH, T) in flash_attention_lse_dtype.
void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);

/// The dtype of lse for data of `dtype`: f64 for f64, else f32.
DType flash_attention_lse_dtype(DType dtype);

/// flash_attention_forward of the heads of a fused QKV output: qkv (B, T, 3C) holds q, k, v of
/// n_head heads side by side (C = n_head * hs); sets y (B, T, C), head h in columns [h*hs,
/// (h+1)*hs), and lse (B * n_head, T).
void flash_attention_qkv_forward(Tensor& y, Tensor& lse, const Tensor& qkv, int64_t n_head,
                                 double scale, bool causal = true);

/// flash_attention_backward in the same layout: sets dqkv (B, T, 3C) from dy (B, T, C), given
/// the forward's qkv, y and lse.
void flash_attention_qkv_backward(Tensor& dqkv, const Tensor& dy, const Tensor& qkv,
                                  const Tensor& y, const Tensor& lse, int64_t n_head,
                                  double scale, bool causal = true);

/// Which CUDA kernel runs flash attention: 1 (scalar, one query row per thread) or 2 (the
/// default: tensor cores; bf16, head size 64 or 128, else version 1 runs). The environment
/// variable SCALELAB_FLASH_ATTENTION_VERSION sets the initial value. The host is unaffected.
void set_flash_attention_version(int version);
/// The version set_flash_attention_version (or the environment) chose.
int flash_attention_version();

}  // namespace scalelab::ops
