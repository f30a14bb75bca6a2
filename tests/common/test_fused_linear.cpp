// The fused Linear forwards (common/ops/fused_linear.hpp) on the host: the same bits as the
// unfused ops (matmul with weight^T, add_bias, gelu_forward) for 3-d inputs viewed as rows, in
// f32, f64 and bf16; and their shape checks. (The cuBLASLt epilogue path is tested against this
// one on a GPU: test_ops_cuda_bf16.)
#include <gtest/gtest.h>

#include "common/ops/fused_linear.hpp"
#include "common/ops/ops.hpp"
#include "tests/common/gradcheck.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
Tensor rnd(std::vector<int64_t> shape, uint64_t seed, DType dtype) {
  const Tensor t = uniform(std::move(shape), seed, DType::f64, -1, 1);
  return Tensor::from_vector(t.to_vector(), t.shape(), dtype);
}
}  // namespace

TEST(FusedLinear, IsMatmulAddBiasGelu) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor x = rnd({2, 5, 12}, 1, dt), w = rnd({20, 12}, 2, dt), b = rnd({20}, 3, dt);
    Tensor y = Tensor::empty({2, 5, 20}, dt), g = Tensor::empty({2, 5, 20}, dt),
           pre = Tensor::empty({2, 5, 20}, dt);
    ops::linear_forward(y, x, w, b);
    ops::linear_gelu_forward(g, pre, x, w, b);

    Tensor ref = Tensor::empty({10, 20}, dt), ref_g = Tensor::empty({10, 20}, dt);
    ops::matmul(ref, x.view({10, 12}), w, false, true);
    ops::add_bias(ref, b);
    ops::gelu_forward(ref_g, ref);
    EXPECT_EQ(y.to_vector(), ref.to_vector()) << dtype_name(dt);
    EXPECT_EQ(pre.to_vector(), ref.to_vector()) << dtype_name(dt);
    EXPECT_EQ(g.to_vector(), ref_g.to_vector()) << dtype_name(dt);
  }
}

TEST(FusedLinear, ChecksShapes) {
  const Tensor x = Tensor::zeros({4, 8}), w = Tensor::zeros({6, 8}), b = Tensor::zeros({6});
  Tensor y = Tensor::zeros({4, 6}), y_bad = Tensor::zeros({4, 7}), pre_bad = Tensor::zeros({4, 5});
  const Tensor w_bad = Tensor::zeros({6, 9}), b64 = Tensor::zeros({6}, DType::f64);
  EXPECT_THROW(ops::linear_forward(y_bad, x, w, b), CheckFailed);
  EXPECT_THROW(ops::linear_forward(y, x, w_bad, b), CheckFailed);
  EXPECT_THROW(ops::linear_forward(y, x, w, b64), CheckFailed);
  EXPECT_THROW(ops::linear_gelu_forward(y, pre_bad, x, w, b), CheckFailed);
  EXPECT_NO_THROW(ops::linear_forward(y, x, w, b));
}
