// scalelab_bench_attention: causal attention forward and backward at one shape, side by side:
// the unfused path of common/nn/attention.cpp (batched_matmul, causal_softmax, batched_matmul:
// (BH, T, T) matrices), flash attention's CUDA version 1 (scalar, one query row per thread) and
// version 2 (tensor cores) on (BH, T, hs) heads, both again in the layout nn::CausalSelfAttention
// uses (q, k, v read from the (B, T, 3C) QKV output, y written (B, T, C): version 1 pays for
// split_heads / merge_heads copies there, version 2 reads in place), version 2's trial kernels
// (the forward with two row tiles a warp, the backward as one kernel), and, with --torch-python,
// PyTorch's scaled_dot_product_attention with its FlashAttention-2 and cuDNN backends
// (tools/bench_attention_torch.py) at the same shape. Prints, for each, the best and median ms of
// --repeats calls after --warmup, the TFLOP/s and the allocator's peak. Not a test. FLOPs as the
// FlashAttention papers count them: forward 4 BH T^2 hs, halved for the causal mask; backward
// 2.5 x forward (the useful work: scalelab's deterministic two-pass backward recomputes more,
// which this count leaves out, so its TFLOP/s is the useful rate, comparable with PyTorch's).
// --mask none times the flash kernels without a mask (lab 11's off-diagonal blocks: every query
// sees every key; FLOPs not halved; the unfused path is causal only, so its rows are left out):
// the one-kernel backward's key blocks then all start at query tile 0 and take their turns there
// one after the other, a cost the causal mask does not have.
//   build/common/scalelab_bench_attention --device cuda --dtype bf16            # gpt-85m, B 16
//   build/common/scalelab_bench_attention --torch-python python3                # + PyTorch
//   build/common/scalelab_bench_attention --device cpu --batch 1 --context 256 --dtype f32
//   build/common/scalelab_bench_attention --mask none --torch-python python3    # lab 11's blocks
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/allocator.hpp"
#include "common/cli.hpp"
#include "common/errors.hpp"
#include "common/metrics.hpp"
#include "common/ops/flash_attention.hpp"
#include "common/ops/fused_backend.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/trial_kernels.hpp"
#include "common/runtime.hpp"
#include "tools/bench/bench_timing.hpp"

namespace {
using namespace scalelab;
using bench::time_ms;

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f64") return DType::f64;
  throw UsageError(fmt::format("--dtype {}: f32, bf16 or f64", s));
}

// Runs `command` and returns what it printed (empty if it could not run).
std::string output_of(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (!p) return out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  return scalelab::run_main(argc, argv, [](int argc, char** argv) {
    auto options = cli::make_options(
        "scalelab_bench_attention",
        "Time causal attention (or unmasked: --mask none): the unfused ops against flash attention.");
    options.add_options()
        ("batch", "B", cxxopts::value<int64_t>()->default_value("16"))
        ("heads", "NH", cxxopts::value<int64_t>()->default_value("12"))
        ("context", "T", cxxopts::value<int64_t>()->default_value("1024"))
        ("head-size", "hs", cxxopts::value<int64_t>()->default_value("64"))
        ("dtype", "f32, bf16 or f64", cxxopts::value<std::string>()->default_value("bf16"))
        ("mask", "causal, or none (every query sees every key)",
         cxxopts::value<std::string>()->default_value("causal"))
        ("repeats", "timed calls", cxxopts::value<int>()->default_value("10"))
        ("warmup", "untimed calls first", cxxopts::value<int>()->default_value("3"))
        ("device", "cpu or cuda[:N]", cxxopts::value<std::string>()->default_value("cuda"))
        ("torch-python", "a python with PyTorch: adds its SDPA (flash, cuDNN) at the same shape",
         cxxopts::value<std::string>()->default_value(""))
        ("torch-script", "the script it runs",
         cxxopts::value<std::string>()->default_value(SCALELAB_SOURCE_DIR
                                                      "/tools/bench_attention_torch.py"));
    auto r = cli::parse(options, argc, argv);
    const int64_t B = r["batch"].as<int64_t>(), NH = r["heads"].as<int64_t>(),
                  T = r["context"].as<int64_t>(), hs = r["head-size"].as<int64_t>();
    const int repeats = r["repeats"].as<int>(), warmup = r["warmup"].as<int>();
    SCALELAB_REQUIRE(B >= 1 && NH >= 1 && T >= 1 && hs >= 1, "--batch, --heads, --context and --head-size must be >= 1");
    SCALELAB_REQUIRE(repeats >= 1 && warmup >= 0, "--repeats must be >= 1 and --warmup >= 0");
    const DType dt = parse_dtype(r["dtype"].as<std::string>());
    const std::string mask = r["mask"].as<std::string>();
    SCALELAB_REQUIRE(mask == "causal" || mask == "none", "--mask must be causal or none, got '{}'",
                     mask);
    const bool causal = mask == "causal";
    const Device device = Device::parse(r["device"].as<std::string>());
    const int64_t BH = B * NH;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));

    // inputs: q, k, v, dout of (BH, T, hs), small values (their size does not change the cost)
    auto input = [&] {
      Tensor t = Tensor::empty({BH, T, hs}, dt, device);
      ops::fill(t, 0.01);
      return t;
    };
    const Tensor q = input(), k = input(), v = input(), dout = input();
    Tensor out = Tensor::empty({BH, T, hs}, dt, device), dq = out.clone(), dk = out.clone(),
           dv = out.clone();
    Tensor lse = Tensor::empty({BH, T}, ops::flash_attention_lse_dtype(dt), device);

    const double fwd_flops = 4.0 * BH * T * T * hs / (causal ? 2 : 1), bwd_flops = 2.5 * fwd_flops;
    fmt::print("{} attention, B {} x NH {} x T {} x hs {}, {} on {}; forward {:.3g} GFLOP, "
               "backward {:.3g} GFLOP (FlashAttention's count)\n",
               causal ? "causal" : "unmasked", B, NH, T, hs, dtype_name(dt), device.str(),
               fwd_flops / 1e9, bwd_flops / 1e9);
    fmt::print("{:<22} {:>10} {:>10} {:>10} {:>12}\n", "", "best ms", "median ms", "TFLOP/s", "peak extra");
    auto report = [&](const char* what, double flops, const std::function<void()>& f) {
      reset_peak_memory(device);
      const std::size_t before = memory_stats(device).current;
      const auto [best, median] = time_ms(device, warmup, repeats, f);
      fmt::print("{:<22} {:>10.3f} {:>10.3f} {:>10.2f} {:>12}\n", what, best, median,
                 flops / (best * 1e-3) / 1e12,
                 metrics::human_bytes(static_cast<double>(memory_stats(device).peak - before)));
    };

    // the unfused path, as CausalSelfAttention does it (att kept from forward for backward)
    Tensor att = Tensor::empty({BH, T, T}, dt, device);
    auto unfused_forward = [&] {
      Tensor preatt = Tensor::empty({BH, T, T}, dt, device);
      ops::batched_matmul(preatt, q, k, false, true);
      ops::causal_softmax_forward(att, preatt, scale);
      ops::batched_matmul(out, att, v);
    };
    if (causal) report("unfused forward", fwd_flops, unfused_forward);
    if (causal) report("unfused backward", bwd_flops, [&] {
      Tensor datt = Tensor::empty({BH, T, T}, dt, device), dpre = Tensor::empty({BH, T, T}, dt, device);
      ops::batched_matmul(datt, dout, v, false, true);
      ops::batched_matmul(dv, att, dout, true, false);
      ops::causal_softmax_backward(dpre, att, datt, scale);
      ops::batched_matmul(dq, dpre, k);
      ops::batched_matmul(dk, dpre, q, true, false);
    });
    if (!causal) fmt::print("(unfused rows: causal only, as nn::CausalSelfAttention computes it)\n");
    att = Tensor();
    // PyTorch's SDPA at the same shape (tools/bench_attention_torch.py; CUDA only: on a machine
    // without one its rows say why they did not run)
    auto torch_rows = [&] {
      const std::string python = r["torch-python"].as<std::string>();
      if (python.empty()) return;
      const std::string command = fmt::format(
          "'{}' '{}' --batch {} --heads {} --context {} --head-size {} --dtype {} --repeats {} "
          "--warmup {} --mask {} 2>&1",
          python, r["torch-script"].as<std::string>(), B, NH, T, hs,
          dt == DType::bf16 ? "bf16" : "f32", repeats, warmup, mask);
      const std::string printed = output_of(command);
      std::istringstream lines(printed);
      std::string line;
      bool any = false;
      while (std::getline(lines, line)) {
        std::istringstream in(line);
        std::string kind, backend, pass, reason;
        double best = 0, median = 0;
        in >> kind >> backend;
        if (kind == "row" && (in >> pass >> best >> median)) {
          const double flops = pass == "forward" ? fwd_flops : bwd_flops;
          fmt::print("{:<22} {:>10.3f} {:>10.3f} {:>10.2f} {:>12}\n",
                     "torch " + backend + " " + pass, best, median,
                     flops / (best * 1e-3) / 1e12, "");
          any = true;
        } else if (kind == "skip") {
          std::getline(in >> std::ws, reason);
          fmt::print("torch {}: not run ({})\n", backend, reason);
          any = true;
        }
      }
      if (!any) fmt::print("torch: `{}` printed no rows:\n{}\n", command, printed);
    };
    if (device.is_cpu()) {  // the host has one flash attention
      report("flash forward", fwd_flops,
             [&] { ops::flash_attention_forward(out, lse, q, k, v, scale, causal); });
      report("flash backward", bwd_flops, [&] {
        ops::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, causal);
      });
      torch_rows();
      return 0;
    }
    // the fused QKV output (B, T, 3C) and y (B, T, C) of nn::CausalSelfAttention
    const int64_t C = NH * hs;
    Tensor qkv = Tensor::empty({B, T, 3 * C}, dt, device), dqkv = qkv.clone();
    ops::fill(qkv, 0.01);
    Tensor y = Tensor::empty({B, T, C}, dt, device), dy = y.clone();
    ops::fill(dy, 0.01);
    const int default_version = ops::flash_attention_version();
    // the "flash v2" rows are version 2's plain kernels (16 query rows a warp, two backward
    // kernels); the rows after them, the kernels that replace them
    const char* env = std::getenv("SCALELAB_TRY_GPU_KERNELS");
    ops::set_trial_kernels("none");
    for (int version : {1, 2}) {
      ops::set_flash_attention_version(version);
      const std::string v_name = "flash v" + std::to_string(version);
      report((v_name + " forward").c_str(), fwd_flops,
             [&] { ops::flash_attention_forward(out, lse, q, k, v, scale, causal); });
      // version 2 takes bf16 and head sizes 64, 128 only: say so when version 1 ran instead
      if (ops::cuda::last_flash_attention_version() != version)
        fmt::print("  (version {} does not take {} at head size {}: version {} ran)\n", version,
                   dtype_name(dt), hs, ops::cuda::last_flash_attention_version());
      report((v_name + " backward").c_str(), bwd_flops, [&] {
        ops::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, causal);
      });
      report((v_name + " qkv forward").c_str(), fwd_flops,
             [&] { ops::flash_attention_qkv_forward(y, lse, qkv, NH, scale, causal); });
      report((v_name + " qkv backward").c_str(), bwd_flops,
             [&] { ops::flash_attention_qkv_backward(dqkv, dy, qkv, y, lse, NH, scale, causal); });
    }
    // beside version 2's plain kernels: the forward with two row tiles a warp
    // ("flash_forward_two_row_tiles", head size 64: the default), the dK/dV kernel held to 3
    // blocks an SM ("flash_dkdv_three_blocks", on trial) and the backward as one kernel
    // ("flash_backward_one_kernel", on trial: dQ's shares added in a fixed order in the dK/dV
    // pass) or with the dS^T it made kept for the dQ kernel ("flash_dq_from_kept_ds", on trial)
    if (ops::cuda::last_flash_attention_version() == 2) {
      ops::set_trial_kernels("flash_forward_two_row_tiles");
      report("v2 2-row-tile forward", fwd_flops,
             [&] { ops::flash_attention_forward(out, lse, q, k, v, scale, causal); });
      report("v2 2-row-tile qkv fwd", fwd_flops,
             [&] { ops::flash_attention_qkv_forward(y, lse, qkv, NH, scale, causal); });
      if (ops::cuda::last_flash_v2_kernels().forward_rows_per_warp != 32)
        fmt::print("  (the two-row-tile forward takes head size 64 only: at {} the default "
                   "ran)\n", hs);
      ops::set_trial_kernels("flash_dkdv_three_blocks");
      report("v2 dkdv 3 blocks bwd", bwd_flops, [&] {
        ops::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, causal);
      });
      if (ops::cuda::last_flash_v2_kernels().dkdv_min_blocks != 3)
        fmt::print("  (the dK/dV kernel at 3 blocks an SM takes head size 64 only: at {} the "
                   "default ran)\n", hs);
      ops::set_trial_kernels("flash_backward_one_kernel");
      report("v2 1-kernel backward", bwd_flops, [&] {
        ops::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, causal);
      });
      report("v2 1-kernel qkv bwd", bwd_flops,
             [&] { ops::flash_attention_qkv_backward(dqkv, dy, qkv, y, lse, NH, scale, causal); });
      // dQ from the dS^T the dK/dV kernel kept ("flash_dq_from_kept_ds", on trial: head size 64;
      // its "peak extra" is the kept tiles)
      ops::set_trial_kernels("flash_dq_from_kept_ds");
      report("v2 kept-dS backward", bwd_flops, [&] {
        ops::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, causal);
      });
      report("v2 kept-dS qkv bwd", bwd_flops,
             [&] { ops::flash_attention_qkv_backward(dqkv, dy, qkv, y, lse, NH, scale, causal); });
      if (!ops::cuda::last_flash_v2_kernels().dq_from_kept_ds)
        fmt::print("  (the kept-dS backward takes head size 64 only: at {} the default ran)\n", hs);
      // Hopper's warpgroup MMA ("flash_forward_wgmma", "flash_backward_wgmma", on trial: head
      // size 64 on compute capability 9.0)
      ops::set_trial_kernels("flash_forward_wgmma,flash_backward_wgmma");
      report("wgmma forward", fwd_flops,
             [&] { ops::flash_attention_forward(out, lse, q, k, v, scale, causal); });
      report("wgmma backward", bwd_flops, [&] {
        ops::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, causal);
      });
      report("wgmma qkv forward", fwd_flops,
             [&] { ops::flash_attention_qkv_forward(y, lse, qkv, NH, scale, causal); });
      report("wgmma qkv backward", bwd_flops,
             [&] { ops::flash_attention_qkv_backward(dqkv, dy, qkv, y, lse, NH, scale, causal); });
      ops::set_trial_kernels("flash_backward_wgmma,flash_dq_from_kept_ds");
      report("wgmma kept-dS bwd", bwd_flops, [&] {
        ops::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, causal);
      });
      if (!ops::cuda::last_flash_v2_kernels().backward_wgmma)
        fmt::print("  (wgmma takes head size 64 on compute capability 9.0 only: here version "
                   "2's kernels ran)\n");
    }
    ops::set_trial_kernels(env ? env : "");
    ops::set_flash_attention_version(default_version);

    torch_rows();
    return 0;
  });
}
