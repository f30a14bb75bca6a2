// Lab 07 on a GPU (ctest lab07.gpu.*, label gpu; skipped where no GPU is visible): the
// tensor-parallel GPT with its parameters and activations on CUDA against the same model on the
// CPU, one forward and backward on the same tokens, with and without sequence parallelism, in
// fp32 (TF32 off) and bf16 mixed precision. The tp group is the fixture's world (the mpi backend:
// CUDA tensors are staged through the host, so 2 ranks may share one GPU).
// Tolerances: fp32 loss 1e-5 relative and gradients 1e-4 of the largest |gradient| (the CUDA
// kernels sum in another order); bf16 2e-3 and 3e-2 (lab 07's bf16 bounds: each device rounds its
// own partial sums to bf16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/device.hpp"
#include "common/ops/ops.hpp"
#include "common/runtime.hpp"
#include "tp_test_support.hpp"

using namespace scalelab;
using namespace lab07test;

TEST(Gpu_TensorParallelGPT, OneStepOnCudaMatchesTheCpu) {
  const std::optional<Device> maybe_gpu = labtest::test_gpu();
  if (!maybe_gpu) GTEST_SKIP() << "no CUDA device";
  const Device gpu = *maybe_gpu;
  const ModelConfig config = test_config();
  const Tensor x = random_tokens(2, 16, config.vocab_size, 71);
  const Tensor y = random_tokens(2, 16, config.vocab_size, 72);
  for (DType precision : {DType::f32, DType::bf16})
    for (bool sp : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(precision)
                                        << (sp ? ", sequence parallel" : ""));
      const bool bf16 = precision == DType::bf16;
      const lab07::TPOptions on_cpu{.compute_dtype = precision, .seed = 5,
                                    .sequence_parallel = sp};
      lab07::TPOptions on_gpu = on_cpu;
      on_gpu.device = gpu;
      auto host_model = lab07::make_tp_gpt(config, group(), on_cpu);
      auto dev_model = lab07::make_tp_gpt(config, group(), on_gpu);
      nn::GPT &host = *host_model, &dev = *dev_model;
      nn::GPTActivations host_acts, dev_acts;
      host.zero_grad();
      dev.zero_grad();
      const double want = host.forward(x, y, host_acts);
      const double got = dev.forward(x.to(gpu), y.to(gpu), dev_acts);
      host.backward(host_acts);
      dev.backward(dev_acts);
      const Tensor l = Tensor::from_vector({got}, {1}, DType::f64);
      const Tensor w = Tensor::from_vector({want}, {1}, DType::f64);
      EXPECT_TRUE(labtest::close_on_every_rank(l, w, bf16 ? 2e-3 : 1e-5, 0));
      const Tensor want_g = host.params().grads();
      EXPECT_TRUE(labtest::close_on_every_rank(dev.params().grads().to(Device::cpu()), want_g, 0,
                                               (bf16 ? 3e-2 : 1e-4) * labtest::max_abs(want_g)));
    }
}
