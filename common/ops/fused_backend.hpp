#pragma once
// Backend declarations of the fused ops (fused_backend.inc) for ops/cpu and ops/cuda.
#include "common/tensor.hpp"

namespace scalelab::ops::cpu {
#include "common/ops/fused_backend.inc"
}  // namespace scalelab::ops::cpu

namespace scalelab::ops::cuda {
#include "common/ops/fused_backend.inc"
}  // namespace scalelab::ops::cuda
