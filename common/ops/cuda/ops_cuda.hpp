#pragma once
/// @file ops_cuda.hpp
/// The CUDA backend of common/ops: cuBLAS for matmuls, small kernels for the rest. Built from the
/// .cu files in this directory with CUDA, from ops_nocuda.cpp (which throws) without. It declares,
/// in namespace scalelab::ops::cuda, the functions of common/ops/backend.inc (the same meaning as
/// those of ops.hpp, whose dispatcher calls these for CUDA tensors). Labs call ops.hpp.
#include "common/ops/dispatch.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::ops::cuda {
#include "common/ops/backend.inc"
/// ops::adamw_update_segments with at most kMaxDecaySegments segments, in one launch (the
/// dispatcher runs more, and the host's, one segment at a time).
void adamw_update_segments(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                           const DecaySegments& segments, const AdamWArgs& a, Tensor* compute);
/// Selects the cuBLAS math mode of every handle: with `allow`, fp32 matmuls may run as TF32 on the
/// tensor cores (10-bit mantissa: faster, ~1e-3 relative); off by default, so that fp32 on a GPU
/// agrees with the CPU to 1e-4. ops::set_allow_tf32 (ops.hpp) calls it.
void set_allow_tf32(bool allow);
}  // namespace scalelab::ops::cuda
