// The tensor ops' work counters (common/ops/work.hpp): what each op adds, exactly (integers), and
// that a block's forward and backward count the GEMMs of its formula: the graders of lab 07 read
// them to see that a tensor-parallel rank does 1/tp of the work.
#include <gtest/gtest.h>

#include "common/nn/block.hpp"
#include "common/nn/parameter.hpp"
#include "common/ops/fused_linear.hpp"
#include "common/ops/fused_norm.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/work.hpp"
#include "tests/common/gradcheck.hpp"

using namespace scalelab;
using namespace scalelab::testing;

TEST(WorkCounters, EachOpAddsItsWork) {
  const ops::WorkCount start = ops::work_stats();
  Tensor a = uniform({5, 7}, 1, DType::f32), b = uniform({7, 3}, 2, DType::f32);
  Tensor c = Tensor::zeros({5, 3});
  ops::matmul(c, a, b);
  ops::WorkCount did = ops::work_stats() - start;
  EXPECT_EQ(did.matmul_calls, 1);
  EXPECT_EQ(did.matmul_flops, 2 * 5 * 3 * 7);
  Tensor ba = uniform({4, 5, 7}, 3, DType::f32), bb = uniform({4, 3, 7}, 4, DType::f32);
  Tensor bc = Tensor::zeros({4, 5, 3});
  ops::batched_matmul(bc, ba, bb, false, true);
  did = ops::work_stats() - start;
  EXPECT_EQ(did.matmul_calls, 2);
  EXPECT_EQ(did.matmul_flops, 2 * 5 * 3 * 7 + 4 * 2 * 5 * 3 * 7);
  Tensor w = uniform({3, 7}, 5, DType::f32), bias = uniform({3}, 6, DType::f32);
  ops::linear_forward(c, a, w, bias);
  EXPECT_EQ((ops::work_stats() - start).matmul_flops, 2 * (2 * 5 * 3 * 7) + 4 * 2 * 5 * 3 * 7);
  Tensor x = uniform({6, 7}, 7, DType::f32), out = Tensor::zeros({6, 7});
  Tensor mean = Tensor::zeros({6}), rstd = Tensor::zeros({6});
  Tensor g = uniform({7}, 8, DType::f32), beta = uniform({7}, 9, DType::f32);
  ops::layernorm_forward(out, mean, rstd, x, g, beta);
  Tensor res = Tensor::zeros({6, 7});
  ops::residual_layernorm_forward(res, out, mean, rstd, x, x, g, beta);
  Tensor din = Tensor::zeros({6, 7}), dg = Tensor::zeros({7}), db = Tensor::zeros({7});
  ops::layernorm_backward(din, dg, db, out, x, g, mean, rstd);
  EXPECT_EQ((ops::work_stats() - start).layernorm_rows, 3 * 6);
  // a refused call counts nothing
  const ops::WorkCount before_bad = ops::work_stats();
  Tensor wrong = Tensor::zeros({4, 4});
  EXPECT_THROW(ops::matmul(wrong, a, b), CheckFailed);
  EXPECT_EQ(ops::work_stats() - before_bad, ops::WorkCount{});
}

// One block's forward: QKV (2 N C 3C), the two attention products (2 B NH T T hs each), the
// output projection (2 N C C), fc and proj (2 N C 4C each); backward twice that (input and
// weight gradients). Two LayerNorms of N rows each way.
TEST(WorkCounters, ABlockCountsItsGemmsAndLayerNormRows) {
  const int64_t B = 2, T = 5, C = 8, NH = 2, hs = C / NH, N = B * T;
  nn::Block block(0, C, NH, 1);
  nn::ParameterSet set;
  set.bind(block.parameters(), DType::f32, Device::cpu(), 3);
  const Tensor x = uniform({B, T, C}, 11, DType::f32);
  nn::BlockActivations acts;
  const ops::WorkCount start = ops::work_stats();
  const Tensor y = block.forward(x, acts);
  const ops::WorkCount fwd = ops::work_stats() - start;
  const int64_t forward_flops =
      2 * N * C * 3 * C + 2 * (2 * B * NH * T * T * hs) + 2 * N * C * C + 2 * (2 * N * C * 4 * C);
  EXPECT_EQ(fwd.matmul_flops, forward_flops);
  EXPECT_EQ(fwd.layernorm_rows, 2 * N);
  const ops::WorkCount mid = ops::work_stats();
  block.backward(uniform({B, T, C}, 12, DType::f32), x, acts);
  const ops::WorkCount bwd = ops::work_stats() - mid;
  EXPECT_EQ(bwd.matmul_flops, 2 * forward_flops);
  EXPECT_EQ(bwd.layernorm_rows, 2 * N);
}
