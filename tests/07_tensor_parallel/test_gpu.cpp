// Lab 07 on a GPU (ctest lab07.gpu.*, label gpu; skipped where no GPU is visible; and on the
// simulated GPU on every machine, lab07.gpu_on_sim.*): the
// tensor-parallel GPT with its parameters and activations on CUDA against the same model on the
// CPU, one forward and backward on the same tokens, with and without sequence parallelism, in
// fp32 (TF32 off) and bf16 mixed precision. The tp group is the fixture's world (the mpi backend:
// CUDA tensors are staged through the host, so 2 ranks may share one GPU).
// Tolerances: labtest::gpu_step_matches_cpu's (tests/support/lab_fixture.hpp; in bf16 each
// device rounds its own partial sums to bf16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/device.hpp"
#include "common/ops/ops.hpp"
#include "common/runtime.hpp"
#include "tp_test_support.hpp"
#include "tests/support/expect.hpp"

using namespace scalelab;
using namespace lab07test;

TEST(Gpu_TensorParallelGPT, OneStepOnTheDeviceMatchesTheCpu) {
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
      LABTEST_EXPECT(labtest::gpu_step_matches_cpu(got, want, dev.params().grads(),
                                                   host.params().grads(), bf16),
                     "");
    }
}
