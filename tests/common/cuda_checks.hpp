#pragma once
// What the CUDA tests of fp32 (test_ops_cuda.cpp) and of mixed precision (test_ops_cuda_bf16.cpp)
// share: a fixture that skips without a GPU, host-vs-device comparisons of ops, and one GPT step
// on both devices. Label gpu: they run where a GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/device.hpp"
#include "common/nn/gpt.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/trial_kernels.hpp"
#include "tests/common/gradcheck.hpp"

namespace scalelab::testing {

/// Skips without a CUDA device; fp32 matmuls stay full fp32 (TF32 off).
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    ops::set_allow_tf32(false);
  }
};

/// Turns the named kernels (common/ops/trial_kernels.hpp: "all", or names separated by commas)
/// on (kOn), or off (kOff), while it lives, the others as they were; then gives back the list it
/// found. Under SCALELAB_TRY_GPU_KERNELS=all a test's guard thus leaves every kernel on for the
/// tests after it; kOff makes a test's reference path (the version 1 that a kernel replaces)
/// whatever the environment says.
class TrialKernels {
 public:
  enum Mode { kOn, kOff };
  explicit TrialKernels(const std::string& names, Mode mode = kOn)
      : previous_(ops::trial_kernel_list()) {
    std::string change = names;  // kOn: the names, applied after the list it found
    if (mode == kOff) {  // "all" -> "none", "a,b" -> "-a,-b"
      change.clear();
      std::istringstream items(names);
      std::string item;
      while (std::getline(items, item, ','))
        if (!item.empty()) change += "," + (item == "all" ? "none" : "-" + item);
    }
    ops::set_trial_kernels(previous_ + "," + change);  // empty names are skipped
  }
  ~TrialKernels() { ops::set_trial_kernels(previous_); }
  TrialKernels(const TrialKernels&) = delete;
  TrialKernels& operator=(const TrialKernels&) = delete;

 private:
  std::string previous_;  // trial_kernel_list() when it was made
};

/// Every element of `cuda` within tol * max(1, |host|) + extra of `cpu`; same shape and dtype.
inline void expect_close(const Tensor& cuda, const Tensor& cpu, double tol,
                         const std::string& what, double extra = 0) {
  const std::vector<double> c = cuda.to(Device::cpu()).to_vector(), h = cpu.to_vector();
  ASSERT_EQ(cuda.shape(), cpu.shape()) << what;
  ASSERT_EQ(cuda.dtype(), cpu.dtype()) << what;
  for (std::size_t i = 0; i < h.size(); ++i)
    ASSERT_LE(std::abs(c[i] - h[i]), tol * std::max(1.0, std::abs(h[i])) + extra)
        << what << " element " << i << ": cuda " << c[i] << " cpu " << h[i];
}

/// a and b hold the same bits, element for element (same shape and dtype, on any devices). A
/// failure says how many elements differ and shows the first (not millions of values).
inline void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  const std::size_t size = dtype_size(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(ha.data_ptr());
  const auto* pb = static_cast<const unsigned char*>(hb.data_ptr());
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(pa + i * size, pb + i * size, size) != 0) {
      if (first < 0) first = i;
      ++differ;
    }
  if (differ > 0)
    ADD_FAILURE() << what << ": " << differ << " of " << a.numel() << " elements differ, the "
                  << "first at " << first << ": " << ha.item(first) << " and " << hb.item(first);
}

/// Runs `op` on host copies and on device (cuda:0) copies of `args`, then compares every arg at
/// the tolerance of its dtype: bf16 1e-2, f64 1e-10, anything else (f32, i32) `f32_tol`.
inline void same_on_both(const std::string& what, std::vector<Tensor> args,
                         const std::function<void(std::vector<Tensor>&)>& op,
                         double f32_tol = 1e-4) {
  const Device gpu = Device::cuda(0);
  std::vector<Tensor> host, dev;
  for (const Tensor& t : args) {
    host.push_back(t.clone());
    dev.push_back(t.to(gpu));
  }
  op(host);
  op(dev);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const DType dt = args[i].dtype();
    const double tol = dt == DType::bf16 ? 1e-2 : dt == DType::f64 ? 1e-10 : f32_tol;
    expect_close(dev[i], host[i], tol, what + " arg " + std::to_string(i));
  }
}

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
