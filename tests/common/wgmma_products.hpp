#pragma once
// One warpgroup MMA product of each kind flash attention's wgmma kernels issue
// (common/ops/cuda/flash_wgmma.cuh), run alone on the GPU by tests/common/test_wgmma_products.cpp:
// compiled for sm_90a (wgmma_products_cuda.cu), called on compute capability 9.0 devices only.
#include "common/tensor.hpp"

namespace scalelab::testing {

/// out (64, 64) f32 = a (64, 64) b (64, 64)^T, both bf16 row-major on the GPU: the kernels'
/// S = Q K^T, with both tiles K-major in shared memory (issue_ss). out starts as NaN in the
/// registers: the first of the four k-steps must overwrite, not add.
void wgmma_ss_product(Tensor& out, const Tensor& a, const Tensor& b);

/// out (64, 64) f32 = init + p v: p (64, 64) f32 turned into A fragments in the registers as the
/// kernels turn P and dS (acc_to_a: each value rounded to bf16), v (64, 64) bf16 row-major (k
/// rows, n columns) read MN-major from shared memory: the kernels' O += P V (issue_rs).
void wgmma_rs_product(Tensor& out, const Tensor& init, const Tensor& p, const Tensor& v);

}  // namespace scalelab::testing
