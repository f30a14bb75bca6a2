#pragma once
// The CUDA backend of common/ops: cuBLAS for matmuls, small kernels for the rest. Built from the
// .cu files in this directory with CUDA, from ops_nocuda.cpp (which throws) without.
#include "common/ops/dispatch.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::ops::cuda {
#include "common/ops/backend.inc"
/// Selects the cuBLAS math mode of every handle (TF32 off unless allowed).
void set_allow_tf32(bool allow);
}  // namespace scalelab::ops::cuda
