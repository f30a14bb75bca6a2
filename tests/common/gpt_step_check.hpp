#pragma once
// One GPT forward and backward on the host and on a GPU from the same seed and batch, compared:
// the CUDA tests of fp32 (test_ops_cuda.cpp) and of mixed precision (test_ops_cuda_bf16.cpp)
// differ only in the model's options and their tolerances.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "common/nn/gpt.hpp"
#include "tests/common/gradcheck.hpp"

namespace scalelab::testing {

/// Builds `config` with `options` on the host and on `gpu`, runs one step on random tokens
/// (seeds seed, seed + 1), expects the GPU's loss within loss_tol (relative) of the host's and
/// every gradient element within grad_tol of its parameter's largest |gradient| on the host.
/// Returns the GPU model (for checks of what it holds).
inline std::unique_ptr<nn::GPT> expect_gpt_step_matches_host(const ModelConfig& config,
                                                             nn::GPTOptions options, Device gpu,
                                                             uint64_t seed, double loss_tol,
                                                             double grad_tol) {
  options.device = Device::cpu();
  nn::GPT cpu_model(config, options);
  options.device = gpu;
  auto gpu_model = std::make_unique<nn::GPT>(config, options);
  const Tensor x = random_tokens({4, 16}, 256, seed), y = random_tokens({4, 16}, 256, seed + 1);
  cpu_model.zero_grad();
  gpu_model->zero_grad();
  const double l_cpu = cpu_model.forward(x, y);
  const double l_gpu = gpu_model->forward(x.to(gpu), y.to(gpu));
  EXPECT_NEAR(l_gpu, l_cpu, loss_tol * l_cpu);
  cpu_model.backward();
  gpu_model->backward();
  for (std::size_t i = 0; i < cpu_model.parameters().size(); ++i) {
    const Tensor& gc = cpu_model.parameters()[i]->grad;
    const Tensor gg = gpu_model->parameters()[i]->grad.to(Device::cpu());
    double big = 1e-6;
    for (int64_t j = 0; j < gc.numel(); ++j) big = std::max(big, std::abs(gc.item(j)));
    for (int64_t j = 0; j < gc.numel(); ++j) {
      const double diff = std::abs(gg.item(j) - gc.item(j));
      if (diff > grad_tol * big) {  // report the first element off, not thousands
        ADD_FAILURE() << cpu_model.parameters()[i]->name << " element " << j << ": gpu "
                      << gg.item(j) << ", host " << gc.item(j) << ", more than " << grad_tol
                      << " x " << big << " apart";
        return gpu_model;
      }
    }
  }
  return gpu_model;
}

}  // namespace scalelab::testing
