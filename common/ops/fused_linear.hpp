#pragma once
/// @file fused_linear.hpp
/// A Linear layer's forward with its bias (and the MLP's GELU) fused into the matmul: on a GPU in
/// bf16, one cuBLASLt call whose epilogue adds the bias (CUBLASLT_EPILOGUE_BIAS) or adds it and
/// applies GELU while also storing the pre-GELU values (CUBLASLT_EPILOGUE_GELU_AUX_BIAS; cuBLASLt's
/// GELU is the tanh approximation, GPT-2's). That saves one or two passes over the (N, OC) output
/// and their launches. Everywhere else (the host, f32 and f64, shapes the epilogue does not take)
/// the same results come from the unfused ops: matmul, add_bias, gelu_forward.
///
/// How a layer calls them (common/nn integrates; backward is unchanged):
///
///     ops::linear_forward(y, x, weight.compute_value(), bias.compute_value());   // nn::Linear
///     ops::linear_gelu_forward(a.g, a.h, x, fc.weight..., fc.bias...);           // MLP fc + GELU
#include "common/tensor.hpp"

namespace scalelab::ops {

/// out (..., OC) = in (..., C) @ weight (OC, C)^T + bias (OC). Sets out. One dtype for all.
void linear_forward(Tensor& out, const Tensor& in, const Tensor& weight, const Tensor& bias);

/// pre (..., OC) = in @ weight^T + bias; out = GELU(pre) (tanh approximation). Sets both.
void linear_gelu_forward(Tensor& out, Tensor& pre, const Tensor& in, const Tensor& weight,
                         const Tensor& bias);

}  // namespace scalelab::ops
