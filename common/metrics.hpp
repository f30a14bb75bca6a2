#pragma once
/// @file metrics.hpp
/// Measurement: step timers, tokens/s, model FLOPs utilisation (MFU) and the step line every
/// training program prints (lab 02's loop; train::StepReporter for labs 03 and up).
///
/// FLOPs per token (the PaLM paper's estimate, as nanoGPT's estimate_mfu):
///
///     6 N  +  12 L H Q T
///
/// N: parameters without the position embedding (the tied wte counts once: it is a matmul in the
/// head); 6 = 2 (multiply-add) x 3 (forward, and backward twice as much). The second term is the
/// attention matmuls (q k^T and att v, forward and backward) that parameters do not account for:
/// L layers, H heads of size Q, context T. MFU = achieved FLOP/s / the device's dense peak.
#include <chrono>
#include <cstdint>
#include <string>

#include "common/allocator.hpp"
#include "common/model_config.hpp"

namespace scalelab::metrics {

/// 6N + 12 L H Q T for a model config at context T (see above); N counts the active parameters
/// (a mixture of experts: k of its E experts, and its router as k rows).
double flops_per_token(const ModelConfig& config, int64_t T);

/// Model FLOPs utilisation in [0, 1]: tokens_per_s * flops_per_token / (peak_tflops * 1e12).
/// 0 when the peak is unknown (peak_tflops <= 0).
double mfu(double tokens_per_s, double flops_per_token, double peak_tflops);

/// Which data-sheet peak a run compares with: the precision its matmuls run in.
enum class Precision {
  fp32,  ///< plain float32 (the CPU, or a GPU with TF32 off)
  tf32,  ///< float32 data through the tensor cores' TF32 (10-bit mantissa) matmuls
  bf16   ///< bf16 matmuls on the tensor cores (`--precision bf16`)
};

/// Dense peak TFLOP/s of a GPU from its name (A100, H100, H200; fp32 / tf32 / bf16 tensor core,
/// no sparsity), or 0 if unknown: then pass --peak-tflops.
///   A100: 19.5 / 156 / 312     H100 SXM and H200: 67 / 494.7 / 989.4
double gpu_peak_tflops(const std::string& device_name, Precision precision);

/// n x n x n fp32 matmuls on `device`, in TFLOP/s (2 n^3 FLOPs each): a stand-in peak for MFU
/// where no data-sheet figure applies (a CPU). The best of several timings of a longer run: one
/// 512^3 sgemm takes a few ms, too short to time steadily (a single timing gave 31% to 72% MFU
/// for the same throughput), so each timing is a run of back-to-back matmuls of at least 20 ms,
/// and timings go on (after a warm-up) until at least `reps` are done and about 0.5 s has passed;
/// the fastest counts, since noise (other processes, a frequency change, thread start-up) only
/// makes a timing slower. Bounded: it stops after 1 s of timings whatever `reps` says.
double measure_matmul_tflops(Device device, int64_t n = 512, int reps = 5);

/// The per-rank peak TFLOP/s that MFU divides by, and where it comes from (printed once).
struct Peak {
  double tflops = 0;   ///< 0: unknown (MFU not shown)
  std::string source;  ///< e.g. "--peak-tflops", "NVIDIA H100 fp32 data sheet"
  /// "12.3 GFLOP/s (this CPU's measured 512^3 sgemm; --peak-tflops overrides)", or
  /// "no known peak (pass --peak-tflops)".
  std::string str() const;
};

/// THE rule for the peak of every program (lab 02's loop and the shared reporter of labs 03 and
/// up): `given` (--peak-tflops) when > 0; else on a GPU its data-sheet figure for `precision`
/// (gpu_peak_tflops: 0 for an unknown GPU); else on a CPU the measured sgemm
/// (measure_matmul_tflops, about 0.5 s). Several ranks on one machine should measure at the same
/// time, so each measures its share of the cores (train::StepReporter does: every rank measures
/// at once, and the average over the ranks is used). On a machine shared with other work the
/// figure moves with the load: MFU can read above 100% when the load drops after the
/// measurement. Pass --peak-tflops for figures comparable across runs.
Peak peak_for(Device device, double given, Precision precision = Precision::fp32);

/// Wall-clock timer. On a GPU, elapsed() first waits for the device's queued work, so it times
/// the kernels, not their launches.
class Timer {
 public:
  /// Starts timing at construction; on a GPU `device` says which queue elapsed() waits for.
  explicit Timer(Device device = Device::cpu()) : device_(device) { start(); }
  /// Restarts the timer from now (a loop reuses one Timer per step).
  void start();
  /// Seconds since start().
  double elapsed();

 private:
  Device device_;
  std::chrono::steady_clock::time_point t0_;
};

/// "926k", "1.2M", "12"
std::string human_count(double n);
/// "1.2GiB", "340.0MiB", "12.0KiB", "512B"
std::string human_bytes(double bytes);

/// One training step's figures, as step_line prints them.
struct StepStats {
  int64_t step = 0;          ///< the step's index, from 0
  double loss = 0;           ///< the mean cross-entropy of the global batch (nats per token)
  double dt_s = 0;           ///< seconds this step took (wall clock, Timer)
  double tokens_per_s = 0;   ///< tokens of the global batch per second, over all ranks
  int world = 1;             ///< ranks that share the step: tps/rank = tokens_per_s / world
  double mfu = 0;            ///< model FLOPs utilisation in [0, 1]; printed only when > 0
  /// The allocator's peak on this rank: bytes of live tensors (exact), not the process's RSS,
  /// which is larger (glibc keeps freed memory; code, MPI's buffers), nor a GPU pool's reservation.
  std::size_t peak_bytes = 0;
  double lr = -1;            ///< the step's learning rate; printed when >= 0
};

/// "step=10 loss=3.1500 dt=282ms tps=926k tps/rank=231k mfu=46.3% mem=1.2GiB"
std::string step_line(const StepStats& s);

}  // namespace scalelab::metrics
