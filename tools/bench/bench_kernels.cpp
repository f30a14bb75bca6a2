// scalelab_bench_kernels: the version pairs of lab 02's step kernels, side by side at one shape
// (llm.c's dev/cuda practice): version 1, the readable kernel, beside version 2, the fast one,
// each checked against the host and timed in the same run. Not a test.
//
//   LayerNorm backward       v1: a dx kernel, then dbias and dweight as two column-sum passes
//                            v2: dx, dweight and dbias from one read (layernorm_backward_v2)
//   MLP backward (proj, GELU) v1: dg = dout @ W into a zeroed buffer, then a gelu_backward pass
//                            v2: one cuBLASLt call, GELU' in its epilogue (dgelu_epilogue)
//   Linear dweight + dbias   v1: dW += dout^T x, then dbias by column-sum passes over dout
//                            v2: one cuBLASLt call, dbias summed in its epilogue (bias_grad_epilogue)
//   bias gradient alone      v1: column sums, one element a thread a row (column_sums.cuh)
//                            v2: 16-byte loads, each lane's sums in registers (bias_backward_v2)
//   residual add             v1: one element a thread
//                            v2: 8 elements a thread, 16-byte loads and stores (add_16_bytes)
//   sum of squares (clip)    v1: 256 blocks, one f32 a thread a load
//                            v2: 512 blocks, 16-byte loads (sums_16_bytes)
//   embedding backward (wte) v1: every vocabulary row scans all N tokens (O(V N C))
//                            v2: the tokens grouped by id first, each row sums its own (O(N C))
//                            v3: v2's groups cut into chunks of 64, two passes (grouped_rows_in_chunks)
//
// Each row picks its version (common/ops/trial_kernels.hpp: "none" is every op's version 1):
// the DGELU and BGRADB epilogues and the embedding's version 3 passed their trial on an H200 and
// are the default; LayerNorm's version 2 is still on trial (checked, but slower there). The
// embedding's version 1 stays beside the others as ops::cuda::embedding_backward_v1. Default
// shape: gpt-85m at batch 16 x context 1024
// (N = 16384 rows, C = 768), bf16 data with f32 parameter gradients, as lab 02 runs it.
//   build/common/scalelab_bench_kernels                         # on cuda:0
//   build/common/scalelab_bench_kernels --rows 512 --device cpu # the host's one path, smoke
// Each row: best and median ms of --repeats calls after --warmup, the bytes the op must move
// over its best time (GB/s), and the largest difference from the host relative to
// max(1, |host|) over the checked elements (the host runs the same op once, at version 1).
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/cli.hpp"
#include "common/errors.hpp"
#include "common/metrics.hpp"
#include "common/ops/fused_backend.hpp"
#include "common/ops/fused_linear.hpp"
#include "common/ops/cuda/ops_cuda.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/trial_kernels.hpp"
#include "common/runtime.hpp"
#include "tools/bench/bench_timing.hpp"

namespace {
using namespace scalelab;
using bench::time_ms;

// The largest |a - b| / max(1, |b|) over the first `count` elements of a (any device) and b.
double max_rel_diff(const Tensor& a, const Tensor& b, int64_t count) {
  const std::vector<double> x = a.to(Device::cpu()).flat(0, count).to_vector();
  const std::vector<double> y = b.to(Device::cpu()).flat(0, count).to_vector();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(x[i] - y[i]) / std::max(1.0, std::abs(y[i])));
  return worst;
}

// A row of the table.
void print_row(const std::string& op, const std::string& version, std::pair<double, double> ms,
               double bytes, double diff) {
  fmt::print("{:<26} {:<44} {:>9.3f} {:>10.3f} {:>8.0f} {:>11.2e}\n", op, version, ms.first,
             ms.second, bytes / (ms.first * 1e-3) / 1e9, diff);
}
}  // namespace

int main(int argc, char** argv) {
  return scalelab::run_main(argc, argv, [](int argc, char** argv) {
    auto options = cli::make_options(
        "scalelab_bench_kernels",
        "Time lab 02's kernel versions side by side, each checked against the host.");
    options.add_options()
        ("rows", "N: batch x context", cxxopts::value<int64_t>()->default_value("16384"))
        ("width", "C: the model's width (the MLP's hidden width is 4C)",
         cxxopts::value<int64_t>()->default_value("768"))
        ("check-rows", "rows of the MLP's input gradient checked against the host",
         cxxopts::value<int64_t>()->default_value("256"))
        ("repeats", "timed calls", cxxopts::value<int>()->default_value("20"))
        ("warmup", "untimed calls first", cxxopts::value<int>()->default_value("3"))
        ("device", "cpu or cuda[:N]", cxxopts::value<std::string>()->default_value("cuda"));
    auto r = cli::parse(options, argc, argv);
    const int64_t N = r["rows"].as<int64_t>(), C = r["width"].as<int64_t>(), H = 4 * C;
    const int64_t check = std::min(r["check-rows"].as<int64_t>(), N);
    const int repeats = r["repeats"].as<int>(), warmup = r["warmup"].as<int>();
    SCALELAB_REQUIRE(N >= 1 && C >= 1 && check >= 1, "--rows, --width and --check-rows must be >= 1");
    SCALELAB_REQUIRE(repeats >= 1 && warmup >= 0, "--repeats must be >= 1 and --warmup >= 0");
    const Device device = Device::parse(r["device"].as<std::string>());
    const DType dt = DType::bf16, gt = DType::f32;  // bf16 data, f32 parameter gradients
    auto on = [&](const Tensor& host) { return device.is_cpu() ? host.clone() : host.to(device); };

    fmt::print("lab 02's kernels, N {} rows x C {} (MLP hidden {}), {} data, {} gradients, on {}\n",
               N, C, H, dtype_name(dt), dtype_name(gt), device.str());
    fmt::print("{:<26} {:<44} {:>9} {:>10} {:>8} {:>11}\n", "op", "version", "best ms",
               "median ms", "GB/s", "vs host");

    // ---- LayerNorm backward -----------------------------------------------------------------
    {
      const Tensor x = Tensor::uniform({N, C}, 1, dt, Device::cpu(), -2, 2),
                   w = Tensor::uniform({C}, 2, dt), b = Tensor::uniform({C}, 3, dt),
                   dout = Tensor::uniform({N, C}, 4, dt);
      Tensor y = Tensor::empty({N, C}, dt), mean = Tensor::empty({N}, gt), rstd = Tensor::empty({N}, gt);
      ops::layernorm_forward(y, mean, rstd, x, w, b);
      Tensor din = Tensor::zeros({N, C}, dt), dw = Tensor::zeros({C}, gt), db = Tensor::zeros({C}, gt);
      ops::layernorm_backward(din, dw, db, dout, x, w, mean, rstd);  // the host's, once

      const Tensor x_d = on(x), w_d = on(w), dout_d = on(dout), mean_d = on(mean), rstd_d = on(rstd);
      // what it must move: x, dout read, din read and written (bf16), the statistics
      const double bytes = 4.0 * N * C * 2 + 2.0 * N * 4;
      for (int version : {1, 2, 3}) {
        if (version > 1 && device.is_cpu()) break;  // the host has one LayerNorm backward
        ops::set_trial_kernels(version == 1   ? "none"
                               : version == 2 ? "layernorm_backward_v2"
                                              : "layernorm_backward_v3");
        Tensor din_d = on(Tensor::zeros({N, C}, dt)), dw_d = on(Tensor::zeros({C}, gt)),
               db_d = on(Tensor::zeros({C}, gt));
        ops::layernorm_backward(din_d, dw_d, db_d, dout_d, x_d, w_d, mean_d, rstd_d);  // checked
        const double diff = std::max({max_rel_diff(din_d, din, N * C), max_rel_diff(dw_d, dw, C),
                                      max_rel_diff(db_d, db, C)});
        const auto ms = time_ms(device, warmup, repeats, [&] {
          ops::layernorm_backward(din_d, dw_d, db_d, dout_d, x_d, w_d, mean_d, rstd_d);
        });
        print_row("layernorm_backward",
                  version == 1   ? "v1: dx kernel + two column-sum passes"
                  : version == 2 ? "v2: one read (layernorm_backward_v2)"
                                 : "v3: one read, sums in registers (_v3)",
                  ms, bytes, diff);
        if (version == 3 && (C % 256 != 0 || C > 1024))
          fmt::print("  (version 3 takes C a multiple of 256 up to 1024: version 1 ran)\n");
      }
    }

    // ---- the MLP's proj backward through GELU ------------------------------------------------
    {
      const Tensor dout = Tensor::uniform({N, C}, 5, dt), wt = Tensor::uniform({C, H}, 6, dt),
                   pre = Tensor::uniform({N, H}, 7, dt, Device::cpu(), -3, 3);
      Tensor dpre = Tensor::empty({check, H}, dt);  // the host's, on the checked rows only
      ops::linear_dgelu_backward(dpre, dout.flat(0, check * C).view({check, C}), wt,
                                 pre.flat(0, check * H).view({check, H}));

      const Tensor dout_d = on(dout), wt_d = on(wt), pre_d = on(pre);
      Tensor dpre_d = on(Tensor::empty({N, H}, dt));
      // what it must move at the least: dout, W, pre read, dpre written (bf16)
      const double bytes = 2.0 * (N * C + C * H + 2.0 * N * H);
      for (int version : {1, 2}) {
        if (version == 2 && device.is_cpu()) break;  // the host has the unfused path only
        ops::set_trial_kernels(version == 2 ? "dgelu_epilogue" : "none");
        ops::linear_dgelu_backward(dpre_d, dout_d, wt_d, pre_d);
        const double diff = max_rel_diff(dpre_d, dpre, check * H);
        const auto ms = time_ms(device, warmup, repeats,
                                [&] { ops::linear_dgelu_backward(dpre_d, dout_d, wt_d, pre_d); });
        print_row("mlp proj backward + GELU'", version == 1 ? "v1: matmul into zeros + gelu_backward"
                                                           : "v2: cuBLASLt DGELU epilogue",
                  ms, bytes, diff);
      }
    }
    // ---- a Linear's parameter gradients (the MLP's fc: dout (N, 4C), its input (N, C)) ----------
    {
      const Tensor dout = Tensor::uniform({N, H}, 8, dt), x = Tensor::uniform({N, C}, 9, dt);
      // the host's on the checked rows (the device repeats that call to compare)
      const Tensor dout_c = dout.flat(0, check * H).view({check, H}),
                   x_c = x.flat(0, check * C).view({check, C});
      Tensor dw = Tensor::zeros({H, C}, gt), db = Tensor::zeros({H}, gt);
      ops::linear_parameter_backward(dw, db, dout_c, x_c);

      const Tensor dout_d = on(dout), x_d = on(x), dout_cd = on(dout_c), x_cd = on(x_c);
      // what it must move at the least: dout and x read (bf16), dW read and written (f32)
      const double bytes = 2.0 * (N * H + N * C) + 8.0 * H * C;
      for (int version : {1, 2}) {
        if (version == 2 && device.is_cpu()) break;  // the host has the unfused path only
        ops::set_trial_kernels(version == 2 ? "bias_grad_epilogue" : "none");
        Tensor dw_c = on(Tensor::zeros({H, C}, gt)), db_c = on(Tensor::zeros({H}, gt));
        ops::linear_parameter_backward(dw_c, db_c, dout_cd, x_cd);
        const double diff = std::max(max_rel_diff(dw_c, dw, H * C), max_rel_diff(db_c, db, H));
        Tensor dw_d = on(Tensor::zeros({H, C}, gt)), db_d = on(Tensor::zeros({H}, gt));
        const auto ms = time_ms(device, warmup, repeats,
                                [&] { ops::linear_parameter_backward(dw_d, db_d, dout_d, x_d); });
        print_row("linear dweight + dbias", version == 1 ? "v1: matmul + column-sum passes"
                                                        : "v2: cuBLASLt BGRADB epilogue",
                  ms, bytes, diff);
        Tensor sums = on(Tensor::empty({H}, gt));
        if (version == 2 && !ops::cuda::linear_bgrad_epilogue(dw_d, sums, dout_d, x_d))
          fmt::print("  (cuBLASLt has no BGRADB algorithm for this GEMM: v2's row ran v1)\n");
      }
    }
    // ---- a bias gradient alone: the column sums of the MLP fc's dout (N, 4C), then of a
    // projection's (N, C), where the second pass weighs most against the first ----------------
    for (const int64_t W : {H, C}) {
      const Tensor dout = Tensor::uniform({N, W}, 11, dt);
      const Tensor dout_c = dout.flat(0, check * W).view({check, W});
      Tensor db = Tensor::zeros({W}, gt);
      ops::bias_backward(db, dout_c);  // the host's, on the checked rows
      const Tensor dout_d = on(dout), dout_cd = on(dout_c);
      const double bytes = static_cast<double>(dtype_size(dt)) * N * W;  // dout, read once
      for (int version : {1, 2}) {
        if (version == 2 && device.is_cpu()) break;  // the host has one path
        ops::set_trial_kernels(version == 2 ? "bias_backward_v2" : "none");
        Tensor db_c = on(Tensor::zeros({W}, gt));
        ops::bias_backward(db_c, dout_cd);
        const double diff = max_rel_diff(db_c, db, W);
        Tensor db_d = on(Tensor::zeros({W}, gt));
        const auto ms = time_ms(device, warmup, repeats, [&] { ops::bias_backward(db_d, dout_d); });
        print_row(fmt::format("bias grad, {} columns", W),
                  version == 1 ? "v1: an element a thread a row" : "v2: 16-byte loads, sums in registers",
                  ms, bytes, diff);
      }
    }
    // ---- the block-end residual add, in place: out += res2, (N, C) ------------------------------
    {
      const Tensor x = Tensor::uniform({N, C}, 12, dt), r = Tensor::uniform({N, C}, 13, dt);
      Tensor sum = x.clone();
      ops::add(sum, sum, r);  // the host's
      const Tensor r_d = on(r);
      const double bytes = 3.0 * dtype_size(dt) * N * C;  // two reads, one write
      for (int version : {1, 2}) {
        if (version == 2 && device.is_cpu()) break;  // the host has one path
        ops::set_trial_kernels(version == 2 ? "add_16_bytes" : "none");
        Tensor out = on(x);
        ops::add(out, out, r_d);
        const double diff = max_rel_diff(out, sum, N * C);
        const auto ms = time_ms(device, warmup, repeats, [&] { ops::add(out, out, r_d); });
        print_row("residual add", version == 1 ? "v1: an element a thread"
                                               : "v2: 8 elements a thread, 16-byte pieces",
                  ms, bytes, diff);
      }
    }
    // ---- clipping's sum of squares over the flat f32 gradients (gpt-85m: 85.8M of them) ---------
    {
      const int64_t P = device.is_cpu() ? N * C : 85'800'000;
      const Tensor g = Tensor::uniform({P}, 14, DType::f32);
      const double want = ops::sum_squares(g);  // the host's
      const Tensor g_d = on(g);
      Tensor sq = on(Tensor::zeros({1}, DType::f64));
      for (int version : {1, 2}) {
        if (version == 2 && device.is_cpu()) break;  // the host has one path
        ops::set_trial_kernels(version == 2 ? "sums_16_bytes" : "none");
        const double diff = std::abs(ops::sum_squares(g_d) - want) / std::max(1.0, want);
        const auto ms = time_ms(device, warmup, repeats, [&] { ops::sum_squares_into(sq, g_d); });
        print_row("sum of squares (clip)", version == 1 ? "v1: 256 blocks, 4-byte loads"
                                                        : "v2: 512 blocks, 16-byte loads",
                  ms, 4.0 * P, diff);
      }
    }
    // ---- the token embedding's gradient (a byte-level vocabulary: 256 rows) ----------------------
    {
      constexpr int64_t V = 256;
      std::vector<double> ids(N);
      // as skewed as text: one token in 6 is the space (32), the rest spread over all 256 ids
      for (int64_t n = 0; n < N; ++n)
        ids[n] = n % 6 == 0 ? 32.0 : static_cast<double>((n * 2654435761u) % V);
      const Tensor tokens = Tensor::from_vector(ids, {1, N}, DType::i32),
                   dout = Tensor::uniform({1, N, C}, 10, dt);
      Tensor dwte = Tensor::zeros({V, C}, gt), no_dwpe;
      ops::embedding_backward(dwte, no_dwpe, dout, tokens);  // the host's

      const Tensor tokens_d = on(tokens), dout_d = on(dout);
      // what it must move at the least: dout read (bf16), the ids, dwte read and written (f32)
      const double bytes = 2.0 * N * C + 4.0 * N + 8.0 * V * C;
      for (int version : {1, 2, 3}) {
        if (version != 2 && device.is_cpu()) continue;  // the host has one embedding backward
        ops::set_trial_kernels(version == 3 ? "grouped_rows_in_chunks" : "none");
        auto backward = [&](Tensor& dw) {
          if (version == 1) ops::cuda::embedding_backward_v1(dw, no_dwpe, dout_d, tokens_d);
          else ops::embedding_backward(dw, no_dwpe, dout_d, tokens_d);
        };
        Tensor dw_d = on(Tensor::zeros({V, C}, gt));
        backward(dw_d);
        const double diff = max_rel_diff(dw_d, dwte, V * C);
        const auto ms = time_ms(device, warmup, repeats, [&] { backward(dw_d); });
        print_row("embedding backward (wte)",
                  device.is_cpu()  ? "the host's (its one path)"
                  : version == 1 ? "v1: every row scans all N tokens"
                  : version == 2 ? "v2: tokens grouped by id (radix sort)"
                                 : "v3: v2's groups summed in chunks of 64",
                  ms, bytes, diff);
      }
    }
    ops::set_trial_kernels("");
    fmt::print("(GB/s: the bytes each op must move over its best time; the GEMM's is compute-bound."
               " vs host: max |device - host| / max(1, |host|), bf16 ulp 3.9e-3)\n");
    return 0;
  });
}
