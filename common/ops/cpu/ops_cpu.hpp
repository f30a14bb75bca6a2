#pragma once
// The host backend of common/ops: OpenBLAS for matmuls, plain loops for the rest.
#include "common/ops/dispatch.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::ops::cpu {
#include "common/ops/backend.inc"
}  // namespace scalelab::ops::cpu
