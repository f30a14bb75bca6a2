#pragma once
/// @file fused_backend.hpp
/// Backend declarations of the fused ops (fused_backend.inc: flash attention, attention_merge,
/// the residual + LayerNorm) for ops/cpu and ops/cuda, called by their dispatchers
/// (flash_attention.cpp, fused_norm.cpp, fused_linear.cpp) once shapes, dtypes and devices are
/// checked. Labs call flash_attention.hpp, fused_norm.hpp and fused_linear.hpp instead.
#include "common/tensor.hpp"

namespace scalelab::ops {
/// Where the heads of one flash attention call lie, so one kernel serves both entry points:
/// head h of batch b of q starts at element q_off + b * in_batch + h * in_head of q's tensor
/// (k at k_off, v at v_off, likewise), its T rows in_ld elements apart; out, dout (and the lse of
/// row t, at (b * NH + h) * T + t) likewise with out_batch, out_head, out_ld. The (BH, T, hs)
/// tensors of flash_attention_forward: B = BH, NH = 1, rows hs apart. The fused QKV output
/// (B, T, 3C) of flash_attention_qkv_forward: rows 3C apart, heads hs apart, k at C, v at 2C.
struct AttentionLayout {
  int64_t B = 0;          ///< batches (BH for (BH, T, hs) tensors)
  int64_t NH = 0;         ///< heads per batch (1 for (BH, T, hs) tensors)
  int64_t T = 0;          ///< sequence length: rows per head
  int64_t hs = 0;         ///< head size: columns per head
  int64_t in_batch = 0;   ///< q, k, v (and dq, dk, dv): elements from one batch to the next
  int64_t in_head = 0;    ///< ... from one head to the next
  int64_t in_ld = 0;      ///< ... from one row to the next
  int64_t q_off = 0;      ///< where q starts in its tensor (dq in its)
  int64_t k_off = 0;      ///< where k starts (dk)
  int64_t v_off = 0;      ///< where v starts (dv)
  int64_t out_batch = 0;  ///< out and dout: elements from one batch to the next
  int64_t out_head = 0;   ///< ... from one head to the next
  int64_t out_ld = 0;     ///< ... from one row to the next
  /// Both sides are (BH, T, hs) contiguous tensors (flash_attention_forward's layout).
  bool packed() const {
    return NH == 1 && in_ld == hs && in_batch == T * hs && out_ld == hs && out_batch == T * hs &&
           q_off == 0 && k_off == 0 && v_off == 0;
  }
};
}  // namespace scalelab::ops

namespace scalelab::ops::cpu {
#include "common/ops/fused_backend.inc"
}  // namespace scalelab::ops::cpu

namespace scalelab::ops::cuda {
#include "common/ops/fused_backend.inc"
/// CUDA only (matmul_cuda.cu): out = in @ weight^T + bias in one cuBLASLt call with a bias
/// epilogue, or with pre_gelu: pre_gelu = that and out = GELU(pre_gelu) (GELU_AUX_BIAS). 2-d
/// tensors, bf16. Returns false, having done nothing, where the epilogue does not apply (not
/// bf16, misaligned, no algorithm): the caller then runs the unfused ops.
bool linear_epilogue(Tensor& out, Tensor* pre_gelu, const Tensor& in, const Tensor& weight,
                     const Tensor& bias);
/// Both LayerNorm versions below set din = base + the input gradient, as the backends'
/// layernorm_backward does (base: din itself, or the residual's gradient).
/// CUDA only (layernorm_backward_v2_cuda.cu): layernorm_backward from one read of x and dout (its
/// version 2; the trial kernel "layernorm_backward_v2"). Returns false, having done nothing,
/// where one warp's column sums do not fit a block's shared memory: version 1 then runs.
bool layernorm_backward_v2(Tensor& din, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                           const Tensor& in, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, const Tensor& base);
/// CUDA only (layernorm_backward_v3_cuda.cu): layernorm_backward from one read, each lane's column
/// sums in registers (its version 3; the trial kernel "layernorm_backward_v3"). Returns false,
/// having done nothing, unless the data is bf16 with C a multiple of 256 up to 1024 and 16-byte
/// aligned rows: version 1 then runs.
bool layernorm_backward_v3(Tensor& din, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                           const Tensor& in, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, const Tensor& base);
/// CUDA only (bias_backward_v2_cuda.cu): dbias += the column sums of dout with 16-byte loads and
/// each lane's sums in registers (bias_backward's version 2; the trial kernel
/// "bias_backward_v2"). Returns false, having done nothing, unless dout is contiguous bf16 with C
/// a multiple of 256 and 16-byte aligned: version 1 then runs.
bool bias_backward_v2(Tensor& dbias, const Tensor& dout);
/// CUDA only (pointwise_cuda.cu): out = a + b for bf16 in 16-byte pieces, 8 elements a thread,
/// each sum rounded as add's version 1 (the same bits; the trial kernel "add_16_bytes"). Returns
/// false, having done nothing, unless the three are bf16 with a multiple of 8 elements and
/// 16-byte aligned: version 1 then runs.
bool add_16_bytes(Tensor& out, const Tensor& a, const Tensor& b);
/// CUDA only (optim_cuda.cu): the blocks, so the partial sums, of the last CUDA sum (sum,
/// sum_into, sum_squares, sum_squares_into): 256 (version 1) or 512 (the trial kernel
/// "sums_16_bytes": f32, a multiple of 4 elements, aligned); 0 before any. Tests check with it
/// that the version they switched on ran.
int last_sum_blocks();
/// CUDA only (matmul_cuda.cu): dpre = (dout @ weight) * GELU'(pre) in one cuBLASLt call
/// (CUBLASLT_EPILOGUE_DGELU, pre as aux). 2-d tensors, bf16. Returns false, having done
/// nothing, where it does not apply (as linear_epilogue).
bool linear_dgelu_epilogue(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                           const Tensor& pre);
/// CUDA only (matmul_cuda.cu): dweight += dout^T @ in and dbias_sum = the column sums of dout
/// in one cuBLASLt call (CUBLASLT_EPILOGUE_BGRADB: the sums are made while the GEMM reads dout).
/// dout (N, OC), in (N, C) bf16; dweight (OC, C) and dbias_sum (OC) of one dtype, f32 or bf16.
/// The epilogue sets dbias_sum (it does not accumulate). Returns false, having done nothing,
/// where it does not apply (as linear_epilogue).
bool linear_bgrad_epilogue(Tensor& dweight, Tensor& dbias_sum, const Tensor& dout,
                           const Tensor& in);
/// CUDA only (flash_attention_tc_cuda.cu): flash attention's version 2, on tensor cores, in any
/// AttentionLayout. Returns false, having done nothing, where it does not apply (not bf16, a
/// head size other than 64 or 128, rows not 16-byte aligned): the caller then runs version 1.
bool flash_attention_v2_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                                const Tensor& v, const AttentionLayout& layout, double scale,
                                bool causal);
/// Which CUDA kernel ran the last flash attention call, forward or backward: 1 or 2 (0 before
/// any). Tests check with it that version 2 ran where it applies, not version 1 in its place.
int last_flash_attention_version();
/// Which of version 2's kernels its last calls ran ({0, 0} before any): the forward's query rows
/// a warp (16, or 32 under the trial kernel "flash_forward_two_row_tiles", head size 64 only)
/// and the backward's kernels after D (2: dK/dV, then dQ; 1 under "flash_backward_one_kernel"),
/// and the dK/dV kernel's register bound (below).
/// Tests and benches check with it that the kernel they switched on ran, not the one beside it.
struct FlashV2Kernels {
  int forward_rows_per_warp = 0;  ///< 16 or 32; 0 before any version-2 forward
  int backward_kernels = 0;       ///< 2 or 1; 0 before any version-2 backward
  /// The blocks per SM the two-kernel backward's dK/dV kernel was compiled to fit (its
  /// __launch_bounds__): 1 (no bound: its registers allow 2), or 3 under the trial kernel
  /// "flash_dkdv_three_blocks" (head size 64); 0 when no two-kernel backward ran yet.
  int dkdv_min_blocks = 0;
  /// Whether the last forward ran on Hopper's warpgroup MMA (flash_attention_wgmma_cuda.cu: the
  /// trial kernel "flash_forward_wgmma", head size 64 on a compute capability 9.0 GPU).
  bool forward_wgmma = false;
  /// Whether the last backward's two kernels ran on it ("flash_backward_wgmma", the same shapes).
  bool backward_wgmma = false;
  /// Whether the last backward's dK/dV kernel kept dS^T for its dQ kernel to read back instead
  /// of computing it again (the trial kernel "flash_dq_from_kept_ds", head size 64).
  bool dq_from_kept_ds = false;
};
/// The version-2 kernels the last version-2 forward and backward ran (see FlashV2Kernels).
FlashV2Kernels last_flash_v2_kernels();
/// flash_attention_v2_forward's backward (same conditions).
bool flash_attention_v2_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                                 const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse,
                                 const AttentionLayout& layout, double scale, bool causal);
}  // namespace scalelab::ops::cuda
