#pragma once
/// @file fused_linear.hpp
/// A Linear layer's forward with its bias (and the MLP's GELU) fused into the matmul: on a GPU in
/// bf16, one cuBLASLt call whose epilogue adds the bias (CUBLASLT_EPILOGUE_BIAS) or adds it and
/// applies GELU while also storing the pre-GELU values (CUBLASLT_EPILOGUE_GELU_AUX_BIAS; cuBLASLt's
/// GELU is the tanh approximation, GPT-2's). That saves one or two passes over the (N, OC) output
/// and their launches; in the MLP's backward, GELU's gradient rides in the epilogue of the matmul
/// that makes its input (CUBLASLT_EPILOGUE_DGELU). Everywhere else (the host, f32 and f64, shapes the epilogue does not take)
/// the same results come from the unfused ops: matmul, add_bias, gelu_forward, gelu_backward.
///
/// How a layer calls them (common/nn integrates):
///
///     ops::linear_forward(y, x, weight.compute_value(), bias.compute_value());   // nn::Linear
///     ops::linear_gelu_forward(a.g, a.h, x, fc.weight..., fc.bias...);           // MLP fc + GELU
///     ops::linear_dgelu_backward(dh, dout, proj.weight..., a.h);                 // MLP backward
///     ops::linear_parameter_backward(weight.grad, bias.grad, dy, x);           // nn::Linear
#include "common/tensor.hpp"

namespace scalelab::ops {

/// out (..., OC) = in (..., C) @ weight (OC, C)^T + bias (OC). Sets out. One dtype for all.
void linear_forward(Tensor& out, const Tensor& in, const Tensor& weight, const Tensor& bias);

/// pre (..., OC) = in @ weight^T + bias; out = GELU(pre) (tanh approximation). Sets both.
void linear_gelu_forward(Tensor& out, Tensor& pre, const Tensor& in, const Tensor& weight,
                         const Tensor& bias);

/// dpre (..., C) = (dout (..., OC) @ weight (OC, C)) * GELU'(pre (..., C)): the gradient reaching
/// the pre-GELU values through a Linear whose input was GELU(pre) (the MLP's proj after its fc).
/// Sets dpre. On a GPU in bf16 (the trial kernel "dgelu_epilogue", trial_kernels.hpp) one
/// cuBLASLt call whose epilogue multiplies the product by GELU'(pre) (CUBLASLT_EPILOGUE_DGELU,
/// pre as its aux input) before the one rounding: the (N, C) gradient of GELU's output is never
/// stored and read back. Elsewhere: matmul into a zeroed buffer, then gelu_backward (the bits the
/// MLP's backward always had).
void linear_dgelu_backward(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                           const Tensor& pre);

/// dweight (OC, C) += dout (..., OC)^T @ in (..., C) and dbias (OC) += the column sums of dout:
/// a Linear's parameter gradients (dweight and dbias of one dtype; dout and in of one). On a GPU
/// in bf16 (the trial kernel "bias_grad_epilogue", trial_kernels.hpp) one cuBLASLt call whose
/// epilogue sums dout's columns while the GEMM reads them (CUBLASLT_EPILOGUE_BGRADB), into a
/// scratch vector then added to dbias (the epilogue sets, gradients accumulate): no second pass
/// over the (N, OC) gradient. Elsewhere: matmul, then bias_backward.
void linear_parameter_backward(Tensor& dweight, Tensor& dbias, const Tensor& dout,
                               const Tensor& in);

}  // namespace scalelab::ops
