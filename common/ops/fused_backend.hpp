#pragma once
/// @file fused_backend.hpp
/// Backend declarations of the fused ops (fused_backend.inc: flash attention, attention_merge,
/// the residual + LayerNorm) for ops/cpu and ops/cuda, called by their dispatchers
/// (flash_attention.cpp, fused_norm.cpp, fused_linear.cpp) once shapes, dtypes and devices are
/// checked. Labs call flash_attention.hpp, fused_norm.hpp and fused_linear.hpp instead.
#include "common/tensor.hpp"

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
}  // namespace scalelab::ops::cuda
