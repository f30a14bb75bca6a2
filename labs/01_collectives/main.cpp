// Lab 01 driver (not edited by attendees).
//
//   ./scalelab run 01 -n 4                      # steps 1-3: what each collective does, and your
//                                               # ring versions checked against the library's
//   ./scalelab run 01 -n 4 -- --bench           # step 4: your ring vs the library's all-reduce
//   ./scalelab run 01 -n 2 -- --bench --max-bytes 1M --iters 10
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives.hpp"
#include "common/cli.hpp"
#include "common/comm/communicator.hpp"
#include "common/device.hpp"
#include "common/log.hpp"
#include "common/runtime.hpp"
#include "common/train/loop.hpp"

using namespace scalelab;
using namespace scalelab::lab01;

namespace {

// The bench's largest buffer: 4G.
constexpr std::size_t kMaxBenchBytes = std::size_t{1} << 32;

// "64M", "4K", "1G" or a plain number of bytes, from one byte to 4G. The unit applies before the
// bounds (0.5K is 512 bytes); inf and 1e30 are above the limit, not wrapped around to 0.
std::size_t parse_bytes(const std::string& text, const char* option) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  double scale = 1;
  if (unit == "K" || unit == "k" || unit == "KiB") scale = 1024;
  else if (unit == "M" || unit == "MiB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") scale = -1;
  const double bytes = v * scale;
  SCALELAB_REQUIRE(end != text.c_str() && scale > 0 && !std::isnan(bytes),
                   "--{} must be a size like 4, 64K or 16M, got '{}'", option, text);
  // A number, but not one f32 element: the bench's buffers are whole f32s.
  SCALELAB_REQUIRE(bytes >= 4, "--{} {}: at least 4 bytes (one f32)", option, text);
  SCALELAB_REQUIRE(bytes <= static_cast<double>(kMaxBenchBytes),
                   "--{} {}: at most 4G ({} bytes)", option, text, kMaxBenchBytes);
  return static_cast<std::size_t>(bytes);
}

std::string values(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{:g}", i ? " " : "", v[i]);
  return s + "]";
}

// Rank 0 prints one line per rank: every rank formats its line, rank 0 gathers them (stdout of
// different ranks would otherwise interleave in any order).
void print_in_rank_order(const std::string& line) {
  constexpr int kBytes = 256;
  char mine[kBytes] = {0};
  std::strncpy(mine, line.c_str(), kBytes - 1);
  std::vector<char> all(world_rank() == 0 ? world_size() * kBytes : 0);
  MPI_Gather(mine, kBytes, MPI_CHAR, all.data(), kBytes, MPI_CHAR, 0, MPI_COMM_WORLD);
  for (int r = 0; r < world_size() && world_rank() == 0; ++r) log::info("{}", &all[r * kBytes]);
}

// "broadcast (root 0)": the rooted collectives of step 1 name their root, as the README does.
std::string title(const std::string& name) {
  const bool rooted =
      name == "broadcast" || name == "reduce" || name == "scatter" || name == "gather";
  return rooted ? name + " (root 0)" : name;
}

int demo(Communicator& world, Device device) {
  // Step 1: every collective once, before/after on every rank.
  const auto results = run_each_collective(world, device);
  // The `before` column as wide as the widest input of any rank (scatter's on the root grows
  // with the ranks), so every `after` lines up.
  std::size_t width = 0;
  for (const std::string& name : step1_collectives())
    for (int r = 0; r < world.size(); ++r)
      width = std::max(width, values(step1_input(name, r, world.size())).size());
  for (std::size_t i = 0; i < results.size(); ++i) {
    log::info("{}:", title(results[i].name));
    print_in_rank_order(fmt::format("  rank {}: before {:<{}} after {}", world.rank(),
                                    values(results[i].before), width, values(results[i].after)));
  }
  // Steps 2 and 3: the ring versions against the library, on a size no rank count divides.
  const int64_t n = 1000003;
  int wrong = 0;
  // On a GPU (--device cuda) the buffers live on it: the ring's messages go over NCCL on an nccl
  // group and its adds run as kernels; the library's all-reduce is NCCL's own.
  Tensor values_host = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i)
    values_host.data<float>()[i] = static_cast<float>((i % 1000) * (world.rank() + 1));
  Tensor mine = values_host.to(device), lib = values_host.to(device);
  ring_all_reduce(world, mine);
  world.all_reduce(lib);
  const Tensor mine_h = mine.to(Device::cpu()), lib_h = lib.to(Device::cpu());
  for (int64_t i = 0; i < n; ++i) wrong += mine_h.data<float>()[i] != lib_h.data<float>()[i];
  log::info("ring all-reduce of {} floats vs library: {}", n,
            wrong ? fmt::format("{} wrong on rank 0", wrong) : "equal");
  Tensor b = Tensor::from_vector({static_cast<double>(world.rank())}, {1}).to(device);
  ring_broadcast(world, b, world.size() - 1);
  Tensor g = Tensor::zeros({world.size()}, DType::f32, device);
  ring_all_gather(world, Tensor::from_vector({10.0 * world.rank()}, {1}).to(device), g);
  log::info("ring broadcast from rank {}: {}; ring all-gather: {}", world.size() - 1,
            values(b.to_vector()), values(g.to_vector()));
  return wrong ? kExitFailed : kExitOk;
}

std::string row_text(const BenchRow& r) {
  return fmt::format("{:>10.1f} {:>7.3f} {:>7.3f} {:>7}", r.time_us, r.algbw, r.busbw, r.wrong);
}

int bench(Communicator& world, const BenchConfig& config) {
  const std::string ranks = fmt::format("{} rank{}", world.size(), world.size() == 1 ? "" : "s");
  if (!config.device.is_cuda())
    log::info("# all-reduce of f32 on {}, backend {}: {} to {} bytes, {} iterations "
              "(median), {} warm-up", ranks, world.backend(), config.min_bytes,
              config.max_bytes, config.iters, config.warmup);
  else
    log::info("# all-reduce of f32 on {}, backend {}, device buffers on {}: {} to {} bytes, "
              "{} iterations posted back to back (nccl-tests: time / iterations, the slowest "
              "rank), {} warm-up", ranks, world.backend(),
              fmt::format("{} ({})", config.device.str(), cuda_device_name(config.device.index)),
              config.min_bytes, config.max_bytes, config.iters, config.warmup);
  if (world.size() == 1)
    log::info("# one rank: your ring sends nothing and the library's all-reduce is a local copy "
              "or nothing (busbw factor 0): the times are the calls' overhead; run 2+ ranks for "
              "bandwidth");
  const auto ring = run_bench(world, true, config);
  const auto library = run_bench(world, false, config);
  log::info("#{:>11} {:>11}  {:^35}  {:^35}", "", "", "ring (yours)", "library all_reduce");
  log::info("#{:>11} {:>11}  {:>10} {:>7} {:>7} {:>7}  {:>10} {:>7} {:>7} {:>7}", "size", "count",
            "time(us)", "algbw", "busbw", "#wrong", "time(us)", "algbw", "busbw", "#wrong");
  log::info("#{:>11} {:>11}  {:>10} {:>7} {:>7} {:>7}  {:>10} {:>7} {:>7} {:>7}", "(B)",
            "(elements)", "", "(GB/s)", "(GB/s)", "", "", "(GB/s)", "(GB/s)", "");
  int64_t wrong = 0;
  for (std::size_t i = 0; i < ring.size(); ++i) {
    log::info(" {:>11} {:>11}  {}  {}", ring[i].bytes, ring[i].count, row_text(ring[i]),
              row_text(library[i]));
    wrong += ring[i].wrong + library[i].wrong;
  }
  return wrong ? kExitFailed : kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    auto options = cli::make_options("lab01_collectives",
                                     "Lab 01: the collectives, a ring all-reduce, and busbw");
    cli::add_run_options(options);
    BenchConfig d;
    options.add_options("bench")
        ("bench", "step 4: time your ring all-reduce against the library's (nccl-tests tables)")
        ("min-bytes", "smallest buffer (4, 64K, 1M, ...)", cxxopts::value<std::string>()->default_value("4"))
        ("max-bytes", "largest buffer", cxxopts::value<std::string>()->default_value("64M"))
        ("iters", "timed iterations per size (the median is shown; on a GPU, the mean of the iterations posted back to back)", cxxopts::value<int>()->default_value(std::to_string(d.iters)))
        ("warmup", "untimed iterations per size", cxxopts::value<int>()->default_value(std::to_string(d.warmup)));
    auto args = cli::parse(options, argc, argv);
    const auto run = cli::run_options(args);
    // The bench's options without --bench: a usage error, not silently ignored by the demo.
    const bool bench_run = args["bench"].as<bool>();
    for (const char* name : {"min-bytes", "max-bytes", "iters", "warmup"})
      SCALELAB_REQUIRE(bench_run || args.count(name) == 0, "--{} is for --bench", name);
    // --device cuda: the buffers on this rank's GPU (local rank % GPUs, as every program).
    const Device device = train::rank_device(run.device);
    auto world = Communicator::world(run.backend);
    if (!bench_run) return demo(world, device);

    BenchConfig config;
    config.device = device;
    config.min_bytes = parse_bytes(args["min-bytes"].as<std::string>(), "min-bytes");
    config.max_bytes = parse_bytes(args["max-bytes"].as<std::string>(), "max-bytes");
    config.iters = args["iters"].as<int>();
    config.warmup = args["warmup"].as<int>();
    SCALELAB_REQUIRE(config.min_bytes <= config.max_bytes, "--min-bytes {} is above --max-bytes {}",
                     config.min_bytes, config.max_bytes);
    SCALELAB_REQUIRE(config.iters >= 1, "--iters must be at least 1, got {}", config.iters);
    SCALELAB_REQUIRE(config.warmup >= 0, "--warmup must be >= 0, got {}", config.warmup);
    return bench(world, config);
  });
}
