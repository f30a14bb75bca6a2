#include "common/metrics.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "common/device.hpp"
#include "common/ops/ops.hpp"
#include "common/tensor.hpp"

namespace scalelab::metrics {

double flops_per_token(const ModelConfig& c, int64_t T) {
  // The ACTIVE parameters: a mixture of experts computes k of its E experts per token.
  ModelConfig active = c;
  active.moe.n_expert = c.moe.top_k;
  const double N = static_cast<double>(parameter_count(c.moe.enabled() ? active : c) -
                                       c.block_size * c.n_embd);
  const double L = static_cast<double>(c.n_layer), H = static_cast<double>(c.n_head),
               Q = static_cast<double>(c.n_embd / c.n_head);
  return 6.0 * N + 12.0 * L * H * Q * static_cast<double>(T);
}

double mfu(double tokens_per_s, double flops_per_token, double peak_tflops) {
  if (peak_tflops <= 0) return 0.0;
  return tokens_per_s * flops_per_token / (peak_tflops * 1e12);
}

double gpu_peak_tflops(const std::string& device_name, Precision p) {
  std::string n = device_name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::toupper(c); });
  struct Row { const char* key; double fp32, tf32, bf16; };
  // dense (no 2:4 sparsity) figures from NVIDIA's data sheets; SXM parts
  static const Row rows[] = {
      {"H200", 67.0, 494.7, 989.4},
      {"H100", 67.0, 494.7, 989.4},
      {"A100", 19.5, 156.0, 312.0},
  };
  for (const Row& r : rows) {
    if (n.find(r.key) == std::string::npos) continue;
    switch (p) {
      case Precision::fp32: return r.fp32;
      case Precision::tf32: return r.tf32;
      case Precision::bf16: return r.bf16;
    }
  }
  return 0.0;
}

std::string Peak::str() const {
  if (tflops <= 0) return "no known peak (pass --peak-tflops)";
  return fmt::format("{:.1f} {} ({})", tflops >= 1 ? tflops : tflops * 1e3,
                     tflops >= 1 ? "TFLOP/s" : "GFLOP/s", source);
}

Peak peak_for(Device device, double given, Precision precision) {
  if (given > 0) return {given, "--peak-tflops"};
  if (device.is_cuda()) {
    const std::string name = cuda_device_name(device.index);
    const char* p = precision == Precision::fp32 ? "fp32"
                    : precision == Precision::tf32 ? "tf32" : "bf16";
    return {gpu_peak_tflops(name, precision), fmt::format("{} {} data sheet", name, p)};
  }
  // no data sheet for a CPU: the best sgemm this process achieves stands in for the peak
  return {measure_matmul_tflops(device), "this CPU's measured 512^3 sgemm; --peak-tflops overrides"};
}

double measure_matmul_tflops(Device device, int64_t n, int reps) {
  // See metrics.hpp: the best of several timings, each a run of at least kMinTiming seconds.
  constexpr double kMinTiming = 0.02, kBudget = 0.5, kHardLimit = 1.0;
  Tensor a = Tensor::zeros({n, n}, DType::f32, device), b = Tensor::zeros({n, n}, DType::f32, device),
         c = Tensor::zeros({n, n}, DType::f32, device);
  ops::fill(a, 0.5);
  ops::fill(b, 0.25);
  ops::matmul(c, a, b);  // warm-up (thread pools, cuBLAS handle)
  Timer one(device);
  ops::matmul(c, a, b);  // how many matmuls make one timing
  const double single = std::max(one.elapsed(), 1e-9);
  const int per_timing = static_cast<int>(std::clamp(std::ceil(kMinTiming / single), 1.0, 1e5));
  double best = 1e30;
  Timer total(device);
  for (int i = 0;; ++i) {
    const double spent = total.elapsed();
    if (i > 0 && (spent >= kHardLimit || (i >= reps && spent >= kBudget))) break;
    Timer t(device);
    for (int k = 0; k < per_timing; ++k) ops::matmul(c, a, b);
    best = std::min(best, t.elapsed() / per_timing);
  }
  return 2.0 * static_cast<double>(n * n * n) / best / 1e12;
}

void Timer::start() {
  device_synchronize(device_);
  t0_ = std::chrono::steady_clock::now();
}

double Timer::elapsed() {
  device_synchronize(device_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.1f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.0f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string human_bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.1f}GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f}MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f}KiB", b / 1024.0);
  return fmt::format("{:.0f}B", b);
}

std::string step_line(const StepStats& s) {
  std::string line = fmt::format("step={} loss={:.4f}", s.step, s.loss);
  if (s.lr >= 0) line += fmt::format(" lr={:.2e}", s.lr);
  line += fmt::format(" dt={:.0f}ms tps={} tps/rank={}", s.dt_s * 1e3, human_count(s.tokens_per_s),
                      human_count(s.tokens_per_s / std::max(1, s.world)));
  if (s.mfu > 0) line += fmt::format(" mfu={:.1f}%", s.mfu * 100);
  // mem= is the allocator's peak of live tensor bytes (exact); the process's RSS is larger (glibc
  // keeps freed memory, plus code and MPI's buffers), and so is a GPU pool's reservation.
  line += fmt::format(" mem={}", human_bytes(static_cast<double>(s.peak_bytes)));
  return line;
}

}  // namespace scalelab::metrics
