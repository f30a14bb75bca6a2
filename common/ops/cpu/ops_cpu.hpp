#pragma once
/// @file ops_cpu.hpp
/// The host backend of common/ops: OpenBLAS for matmuls, plain loops for the rest. It declares,
/// in namespace scalelab::ops::cpu, the functions of common/ops/backend.inc (the same meaning as
/// those of ops.hpp, whose dispatcher has checked shapes, dtypes and devices and calls these for
/// host tensors). Labs call ops.hpp, never this backend directly.
#include "common/ops/dispatch.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::ops::cpu {
#include "common/ops/backend.inc"
}  // namespace scalelab::ops::cpu
