// The fused Linear ops (common/ops/fused_linear.hpp) on the host: the same bits as the unfused
// ops (matmul with weight^T, add_bias, gelu_forward; backward matmul then gelu_backward; the
// parameter gradients matmul then bias_backward) for 3-d
// inputs viewed as rows, in f32, f64 and bf16; and their shape checks. (The cuBLASLt epilogue
// path is tested against this one on a GPU: test_ops_cuda_bf16.) And the list of trial kernels
// that gates the untested GPU ones (common/ops/trial_kernels.hpp), with the GPU tests' guard of it.
#include <gtest/gtest.h>

#include "common/ops/fused_linear.hpp"
#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/trial_kernels.hpp"
#include "tests/common/cuda_checks.hpp"
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

TEST(FusedLinear, DgeluBackwardIsMatmulThenGeluBackward) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor dout = rnd({2, 5, 12}, 4, dt), w = rnd({12, 20}, 5, dt), pre = rnd({2, 5, 20}, 6, dt);
    Tensor dpre = rnd({2, 5, 20}, 7, dt);  // set, whatever it held
    ops::linear_dgelu_backward(dpre, dout, w, pre);

    Tensor dg = Tensor::zeros({10, 20}, dt), ref = Tensor::zeros({10, 20}, dt);
    ops::matmul(dg, dout.view({10, 12}), w);
    ops::gelu_backward(ref, pre.view({10, 20}), dg);
    EXPECT_EQ(dpre.to_vector(), ref.to_vector()) << dtype_name(dt);
  }
  // (the MLP's backward, which calls it, is checked against finite differences: GradCheck.MLP)
  const Tensor dout = Tensor::zeros({4, 6}), w = Tensor::zeros({6, 8}), pre = Tensor::zeros({4, 8});
  Tensor dpre = Tensor::zeros({4, 8}), dpre_bad = Tensor::zeros({4, 7});
  EXPECT_THROW(ops::linear_dgelu_backward(dpre_bad, dout, w, pre), CheckFailed);
  EXPECT_THROW(ops::linear_dgelu_backward(dpre, dout, Tensor::zeros({6, 9}), pre), CheckFailed);
  EXPECT_THROW(ops::linear_dgelu_backward(dpre, dout, w, Tensor::zeros({4, 8}, DType::f64)), CheckFailed);
}

// A Linear's parameter gradients accumulate, as matmul then bias_backward would: mixed precision
// (bf16 data, f32 gradients) as well as one dtype throughout.
TEST(FusedLinear, ParameterBackwardIsMatmulThenBiasBackward) {
  for (auto [data, grad] : {std::pair{DType::f32, DType::f32}, std::pair{DType::f64, DType::f64},
                            std::pair{DType::bf16, DType::f32}}) {
    const Tensor dout = rnd({2, 5, 12}, 8, data), x = rnd({2, 5, 20}, 9, data);
    Tensor dw = rnd({12, 20}, 10, grad), db = rnd({12}, 11, grad);  // what earlier steps left
    Tensor ref_w = dw.clone(), ref_b = db.clone();
    ops::linear_parameter_backward(dw, db, dout, x);
    ops::matmul(ref_w, dout.view({10, 12}), x.view({10, 20}), true, false, 1.0, 1.0);
    ops::bias_backward(ref_b, dout);
    EXPECT_EQ(dw.to_vector(), ref_w.to_vector()) << dtype_name(data);
    EXPECT_EQ(db.to_vector(), ref_b.to_vector()) << dtype_name(data);
  }
  const Tensor dout = Tensor::zeros({4, 6}), x = Tensor::zeros({4, 8});
  Tensor dw = Tensor::zeros({6, 8}), db = Tensor::zeros({6}), db_bad = Tensor::zeros({7});
  Tensor db64 = Tensor::zeros({6}, DType::f64);
  EXPECT_THROW(ops::linear_parameter_backward(dw, db_bad, dout, x), CheckFailed);
  EXPECT_THROW(ops::linear_parameter_backward(dw, db, dout, Tensor::zeros({4, 9})), CheckFailed);
  EXPECT_THROW(ops::linear_parameter_backward(dw, db64, dout, x), CheckFailed);
  EXPECT_NO_THROW(ops::linear_parameter_backward(dw, db, dout, x));
}

// By default the checked kernels run and the trial ones do not; a list changes that in order.
TEST(TrialKernels, CheckedOnTrialOffUnlessNamed) {
  ops::set_trial_kernels("");
  for (const char* k : ops::kTrialKernels) EXPECT_FALSE(ops::trial_kernel(k)) << k;
  for (const char* k : ops::kCheckedKernels) EXPECT_TRUE(ops::trial_kernel(k)) << k;
  ops::set_trial_kernels("layernorm_backward_v2,-dgelu_epilogue");
  EXPECT_TRUE(ops::trial_kernel("layernorm_backward_v2"));
  EXPECT_FALSE(ops::trial_kernel("flash_backward_one_kernel"));
  EXPECT_FALSE(ops::trial_kernel("dgelu_epilogue"));  // version 1 instead
  EXPECT_TRUE(ops::trial_kernel("norm_on_device"));
  ops::set_trial_kernels("all");
  for (const char* k : ops::kTrialKernels) EXPECT_TRUE(ops::trial_kernel(k)) << k;
  for (const char* k : ops::kCheckedKernels) EXPECT_TRUE(ops::trial_kernel(k)) << k;
  ops::set_trial_kernels("none,adamw_one_launch");  // every op's version 1 but one
  for (const char* k : ops::kTrialKernels) EXPECT_FALSE(ops::trial_kernel(k)) << k;
  for (const char* k : ops::kCheckedKernels)
    EXPECT_EQ(ops::trial_kernel(k), std::string(k) == "adamw_one_launch") << k;
  EXPECT_THROW(ops::set_trial_kernels("dgelu_epilogue,flash_v3"), UsageError);  // a typo says so
  EXPECT_THROW(ops::set_trial_kernels("-flash_v3"), UsageError);
  EXPECT_THROW(ops::trial_kernel("not_a_kernel"), CheckFailed);
  ops::set_trial_kernels("");
}

// The list comes back as set_trial_kernels takes it (what differs from the default), and a
// test's TrialKernels guard (tests/common/cuda_checks.hpp) gives back the list it found: under
// SCALELAB_TRY_GPU_KERNELS=all, a guarded GPU test leaves every kernel on for the tests after it.
TEST(TrialKernels, TheListComesBackAndGuardsRestoreIt) {
  ops::set_trial_kernels("");
  EXPECT_EQ(ops::trial_kernel_list(), "");
  ops::set_trial_kernels("layernorm_backward_v2,-norm_on_device,-dgelu_epilogue");
  // the lists' order: checked kernels turned off, then trial kernels turned on
  EXPECT_EQ(ops::trial_kernel_list(), "-dgelu_epilogue,-norm_on_device,layernorm_backward_v2");
  ops::set_trial_kernels(ops::trial_kernel_list());
  EXPECT_EQ(ops::trial_kernel_list(), "-dgelu_epilogue,-norm_on_device,layernorm_backward_v2");
  std::string every_trial, every_checked_off;
  for (const char* k : ops::kTrialKernels)
    every_trial += std::string(every_trial.empty() ? "" : ",") + k;
  for (const char* k : ops::kCheckedKernels)
    every_checked_off += std::string(every_checked_off.empty() ? "-" : ",-") + k;
  ops::set_trial_kernels("all");
  EXPECT_EQ(ops::trial_kernel_list(), every_trial);
  {
    const TrialKernels on("layernorm_backward_v2");  // on already
    EXPECT_EQ(ops::trial_kernel_list(), every_trial);
    {
      const TrialKernels off("dgelu_epilogue,layernorm_backward_v2", TrialKernels::kOff);
      EXPECT_FALSE(ops::trial_kernel("dgelu_epilogue"));
      EXPECT_FALSE(ops::trial_kernel("layernorm_backward_v2"));
      EXPECT_TRUE(ops::trial_kernel("adamw_one_launch"));  // the others as they were
      EXPECT_TRUE(ops::trial_kernel("flash_backward_one_kernel"));
    }
    EXPECT_EQ(ops::trial_kernel_list(), every_trial);
  }
  EXPECT_EQ(ops::trial_kernel_list(), every_trial);  // still all, not the default
  ops::set_trial_kernels("");
  {
    const TrialKernels on("layernorm_backward_v2");
    EXPECT_EQ(ops::trial_kernel_list(), "layernorm_backward_v2");
    {
      const TrialKernels fewer("dgelu_epilogue", TrialKernels::kOff);  // taken from the ones on
      EXPECT_EQ(ops::trial_kernel_list(), "-dgelu_epilogue,layernorm_backward_v2");
      EXPECT_THROW(TrialKernels("flash_v3"), UsageError);
      EXPECT_THROW(TrialKernels("flash_v3", TrialKernels::kOff), UsageError);
      EXPECT_EQ(ops::trial_kernel_list(), "-dgelu_epilogue,layernorm_backward_v2");  // untouched
      const TrialKernels none("all", TrialKernels::kOff);
      EXPECT_EQ(ops::trial_kernel_list(), every_checked_off);
    }
    EXPECT_EQ(ops::trial_kernel_list(), "layernorm_backward_v2");
  }
  EXPECT_EQ(ops::trial_kernel_list(), "");
}
