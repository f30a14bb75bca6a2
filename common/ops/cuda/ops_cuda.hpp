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
/// Version 1 of embedding_backward's token-embedding gradient, the readable one, kept beside the
/// default (version 2) for scalelab_bench_kernels and its GPU test (llm.c's dev/cuda practice):
/// one thread per (vocabulary row, column) walks all N tokens, O(V N C), where version 2 groups
/// the tokens by id first (a stable radix sort) and each row sums only its own, O(N C). The same
/// additions in the same order, so the same bits. dwpe as embedding_backward.
void embedding_backward_v1(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens);
/// Selects the cuBLAS math mode of every handle: with `allow`, fp32 matmuls may run as TF32 on the
/// tensor cores (10-bit mantissa: faster, ~1e-3 relative); off by default, so that fp32 on a GPU
/// agrees with the CPU to 1e-4. ops::set_allow_tf32 (ops.hpp) calls it.
void set_allow_tf32(bool allow);
}  // namespace scalelab::ops::cuda
