// FLOPs per token, MFU, peak table and the step line.
#include <gtest/gtest.h>

#include "common/metrics.hpp"

using namespace scalelab;

TEST(Metrics, FlopsPerTokenIs6NPlusAttention) {
  const ModelConfig c = model_config("gpt-85m");
  const double N = static_cast<double>(parameter_count(c) - 1024 * 768);  // without wpe
  EXPECT_DOUBLE_EQ(metrics::flops_per_token(c, 1024), 6 * N + 12.0 * 12 * 12 * 64 * 1024);
  // 12 (12 C^2 + 13 C) + V C + T C + 2 C with C = 768, V = 256, T = 1024
  EXPECT_EQ(parameter_count(c), 86039040);
}

TEST(Metrics, Mfu) {
  EXPECT_DOUBLE_EQ(metrics::mfu(1000, 1e9, 2.0), 0.5);  // 1 TFLOP/s of 2
  EXPECT_EQ(metrics::mfu(1000, 1e9, 0.0), 0.0);         // unknown peak
}

TEST(Metrics, PeakTable) {
  EXPECT_EQ(metrics::gpu_peak_tflops("NVIDIA H100 80GB HBM3", metrics::Precision::bf16), 989.4);
  EXPECT_EQ(metrics::gpu_peak_tflops("NVIDIA A100-SXM4-80GB", metrics::Precision::fp32), 19.5);
  EXPECT_EQ(metrics::gpu_peak_tflops("NVIDIA H200", metrics::Precision::tf32), 494.7);
  EXPECT_EQ(metrics::gpu_peak_tflops("Some CPU", metrics::Precision::fp32), 0.0);
}

TEST(Metrics, StepLine) {
  metrics::StepStats s;
  s.step = 10;
  s.loss = 3.15;
  s.dt_s = 0.282;
  s.tokens_per_s = 926000;
  s.world = 4;
  s.mfu = 0.463;
  s.peak_bytes = static_cast<std::size_t>(1.2 * 1024 * 1024 * 1024);
  EXPECT_EQ(metrics::step_line(s),
            "step=10 loss=3.1500 dt=282ms tps=926k tps/rank=232k mfu=46.3% mem=1.2GiB");
  EXPECT_EQ(metrics::human_bytes(512), "512B");
  EXPECT_EQ(metrics::human_count(1.5e6), "1.5M");
}
