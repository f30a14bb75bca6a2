// Lab 10 driver (not edited by attendees): trains one GPT on a dp x tp x pp grid of ranks (your
// step 2 model, your step 3 step), prints the grid's group table (once your step 1 lays the
// ranks out as it does), this rank layout's stages and the single-device twin's losses beside its
// own for the first steps.
//
//   ./scalelab run 10 --solution -n 8 -- --dp 2 --tp 2 --pp 2
//   ./scalelab run 10 -n 4 -- --dp 1 --tp 2 --pp 2 --grid-order picotron --steps 5
//   ./scalelab run 10 --solution -n 8 -- --zero 3 --checkpoint --micro-batches 4  # dp 2 tp 2 pp 2
//   ./scalelab run 10 --solution -n 8 -- --dp 2 --tp 2 --pp 2 --zero 2 --schedule interleaved
//   ./scalelab run 10 --solution -n 8 -- --dp 2 --cp 2 --tp 2   # 4D: lab 11's ring over cp
//   ./scalelab run 10 --solution -n 8 -- --plan --model gpt-85m --ranks 8 --memory 80GiB
//   ./scalelab run 10 --solution -n 4 -- --check-plan
//
// --plan trains nothing: it measures this machine (sgemm rate, all-reduce bandwidth and latency
// over the ranks started), then lists the configurations your step 4 predicts fit in --memory
// per rank for --ranks ranks, fastest first.
// --check-plan (step 5) runs every configuration --plan lists for the ranks started (ZeRO 0-3,
// checkpointing off and on) for 1 + --check-steps steps and prints the planner's memory and step
// time beside the measured ones (the allocator's peak, the largest over the ranks; the median
// step of the slowest rank), with the relative errors.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "3d_parallel.hpp"
#include "common/allocator.hpp"
#include "common/comm/stats.hpp"
#include "common/log.hpp"
#include "common/metrics.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/session.hpp"
#include "common/train/sizing.hpp"

using namespace scalelab;
using namespace scalelab::lab10;

namespace {

std::string mib(std::size_t bytes) { return fmt::format("{:.1f}", bytes / 1048576.0); }

// A plan's schedule as a table cell: "1f1b", "afab", "int2" (interleaved, 2 chunks per rank).
std::string schedule_cell(const Plan& p) {
  return p.schedule == lab08::Kind::interleaved ? fmt::format("int{}", p.chunks)
                                                : std::string(lab08::kind_name(p.schedule));
}
// Its attention over cp: "ring", "a2a" (all-to-all), "-" without a cp axis.
std::string attention_cell(const Plan& p) {
  if (p.grid.cp == 1) return "-";
  return p.attention == lab11::Attention::ring ? "ring" : "a2a";
}
// The whole plan in one phrase: "2x1x2x1 m=2 zero=1 ckpt=no 1f1b" (dp x cp x tp x pp).
std::string plan_phrase(const Plan& p) {
  return fmt::format("{}x{}x{}x{} m={} zero={} ckpt={} {}{}", p.grid.dp, p.grid.cp, p.grid.tp,
                     p.grid.pp, p.micro_batches, p.zero_stage, p.checkpoint ? "yes" : "no",
                     schedule_cell(p), p.grid.cp > 1 ? " " + attention_cell(p) : std::string());
}

// --memory: a size with a unit, "80GiB", "512MiB"; a plain number is MiB. From one byte to what
// a 64-bit byte count holds (16 EiB): beyond it the conversion used to wrap around to "0 MiB per
// rank", and below a byte nothing is left to plan with.
std::size_t parse_memory(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "MiB" ? 1048576.0 : unit == "GiB" ? 1073741824.0 : 0;
  SCALELAB_REQUIRE(used > 0 && scale > 0 && std::isfinite(value),
                   "--memory '{}': expected a size such as 512MiB or 80GiB (a plain number is MiB)",
                   text);
  SCALELAB_REQUIRE(value > 0, "--memory must be positive, got '{}'", text);
  return cli::bytes_in_range("--memory " + text, value * scale,
                             "give one rank's memory: a plain number is MiB, e.g. --memory 512 or "
                             "--memory 80GiB");
}

// The micro-batch rows --plan measures the machine on: about what the plans run (the global
// batch over the ranks), but at most kMeasureTokens tokens (a GEMM's rate no longer changes
// beyond a few thousand rows, while the time to measure grows with them) and never more than this
// machine holds at once (planning for a cluster must not need the cluster's memory here): a
// block's lower bound (train::step_bytes_at_least) within an eighth of a rank's memory, as its
// LayerNorms, q, k, v and backward temporaries, which the bound leaves out, take a few times
// more. The same on every rank (collective): the least any rank can hold.
constexpr int64_t kMeasureTokens = 8192;
int64_t measure_rows(const ModelConfig& config, int64_t wanted, DType precision,
                     comm::Communicator& world) {
  const std::size_t memory = train::host_memory().per_rank() / 8;
  const std::size_t per_row =
      std::max<std::size_t>(1, train::step_bytes_at_least(config, {.rows = 1, .layers = 1,
                                                                   .head = false}, precision));
  Tensor fit = Tensor::from_vector(
      {static_cast<double>(std::max<std::size_t>(1, memory / per_row))}, {1}, DType::f64);
  world.all_reduce(fit, comm::ReduceOp::min);
  const int64_t by_tokens = std::max<int64_t>(1, kMeasureTokens / config.block_size);
  return std::min({wanted, by_tokens, static_cast<int64_t>(fit.item())});
}

// The most ranks a grid of `config` (its block_size the --context planned for) and `batch` can
// have, from the limits check_4d sets each axis: dp divides the batch (dp x micro-batches does),
// cp cuts the T tokens into 2 cp equal chunks (at most T / 2), tp divides the heads, pp is at
// most the layers. Beyond what an int holds: INT64_MAX (no --ranks is that many).
int64_t most_ranks(const ModelConfig& config, int64_t batch) {
  const int64_t cp = config.block_size / 2;  // an odd context: no grid (check_4d), 0
  long double most = static_cast<long double>(batch) * static_cast<long double>(cp) *
                     static_cast<long double>(config.n_head) *
                     static_cast<long double>(config.n_layer);
  return most > static_cast<long double>(std::numeric_limits<int>::max())
             ? std::numeric_limits<int64_t>::max()
             : static_cast<int64_t>(most);
}

// --ranks that no grid of the model and batch has: why, and the most a grid can have.
[[noreturn]] void no_grid(const ModelConfig& config, int ranks, int64_t batch) {
  const int64_t most = most_ranks(config, batch);
  throw UsageError(fmt::format(
      "--ranks {}: no dp x cp x tp x pp grid of {} ranks runs model {} with --batch {}: dp x "
      "micro-batches must divide the {} rows, cp must cut its {} tokens into 2 cp equal chunks, "
      "tp must divide its {} heads and pp must be at most its {} layers ({})", ranks, ranks,
      config.name, batch, batch, config.block_size, config.n_head, config.n_layer,
      most <= std::numeric_limits<int>::max()
          ? fmt::format("so a grid has at most {} ranks, and not every number below is one", most)
          : std::string("not every number of ranks is one")));
}

// --plan found no configuration within --memory: say why, and what would fit (every rank: the
// predictions are the same everywhere, so is the error).
[[noreturn]] void explain_nothing_fits(const ModelConfig& config, int ranks, int64_t batch,
                                       const Machine& machine, const std::string& memory,
                                       DType precision) {
  const auto any = plan_all(config, ranks, batch, machine,
                            std::numeric_limits<std::size_t>::max(), precision);
  if (any.empty()) no_grid(config, ranks, batch);  // the sizes check_4d and check_runnable accept
  const auto smallest = std::min_element(any.begin(), any.end(), [](const auto& a, const auto& b) {
    return a.second.total_bytes < b.second.total_bytes;
  });
  const auto& [p, d] = *smallest;
  const std::size_t mib_needed = (d.total_bytes + 1048575) / 1048576;
  throw UsageError(fmt::format(
      "--memory {}: no configuration of model {} for {} ranks and --batch {} fits; the smallest "
      "needs {} MiB per rank (dp {} x cp {} x tp {} x pp {}, {} micro-batches, ZeRO-{}, "
      "checkpointing {}, schedule {}): give --memory {}MiB or more, or a smaller --batch", memory,
      config.name, ranks, batch, mib(d.total_bytes), p.grid.dp, p.grid.cp, p.grid.tp, p.grid.pp,
      p.micro_batches, p.zero_stage,
      p.checkpoint ? "on" : "off", schedule_cell(p), mib_needed));
}

// The grid to run. No size given (./scalelab demo): tp 2 and pp 2 where the ranks and the model
// allow, dp the rest. Otherwise a size not given is 1, except dp: the ranks left over.
GridShape default_grid(int dp, int tp, int pp, int world, const ModelConfig& c, GridOrder order,
                       int cp = 1) {
  SCALELAB_REQUIRE(dp >= 0 && tp >= 0 && pp >= 0, "--dp, --tp and --pp must not be negative, got "
                   "{}, {}, {}", dp, tp, pp);
  SCALELAB_REQUIRE(cp >= 1, "--cp must be at least 1, got {}", cp);
  if (dp == 0 && tp == 0 && pp == 0 && cp == 1) {
    tp = world % 2 == 0 && c.n_head % 2 == 0 ? 2 : 1;
    pp = (world / tp) % 2 == 0 && c.n_layer >= 2 ? 2 : 1;
  }
  tp = tp == 0 ? 1 : tp;
  pp = pp == 0 ? 1 : pp;
  if (dp == 0) dp = world % (tp * pp * cp) == 0 ? world / (tp * pp * cp) : 1;  // check_4d says
  return GridShape{dp, tp, pp, order, cp};
}

// --plan: measure, predict every configuration, print the ranking (rank 0).
int plan(const ModelConfig& model, int64_t batch, DType precision,
         const cxxopts::ParseResult& parsed, comm::Communicator& world) {
  // --context: plan for sequences of that many tokens (long contexts are where cp pays); the
  // machine is still measured on the model's own context (a block of a long one would not fit)
  ModelConfig config = model;
  const int64_t context = parsed["context"].as<int64_t>();
  SCALELAB_REQUIRE(context >= 0, "--context must not be negative (0: the model's), got {}",
                   context);
  // every grid cuts a sequence into 2 cp zig-zag chunks (cp 1 too: check_4d)
  SCALELAB_REQUIRE(context % 2 == 0, "--context {}: the zig-zag split cuts a sequence into 2 cp "
                   "equal chunks: give an even number of tokens", context);
  if (context > 0) config.block_size = context;
  SCALELAB_REQUIRE(parsed["ranks"].as<int>() >= 0, "--ranks must be positive, got {}",
                   parsed["ranks"].as<int>());
  const int ranks = parsed["ranks"].as<int>() > 0 ? parsed["ranks"].as<int>() : world.size();
  // more ranks than any grid has: said before the machine is measured
  if (ranks > most_ranks(config, batch)) no_grid(config, ranks, batch);
  const std::size_t budget = parse_memory(parsed["memory"].as<std::string>());
  const double budget_mib = static_cast<double>(budget) / 1048576.0;
  const int top = parsed["top"].as<int>();
  SCALELAB_REQUIRE(top >= 1, "--top must be at least 1, got {}", top);
  // the model's rate on a micro-batch of about the size the plans run (what this machine holds)
  const int64_t wanted_rows = std::max<int64_t>(1, batch / ranks);
  const int64_t rows_measured = measure_rows(model, wanted_rows, precision, world);
  const Machine m = measure_machine(world, model, rows_measured, precision);
  const auto rows = plan_all(config, ranks, batch, m, budget, precision);
  if (rows.empty())
    explain_nothing_fits(config, ranks, batch, m, parsed["memory"].as<std::string>(), precision);
  log::info("lab 10 planner: model {} ({} parameters), global batch {} x {} tokens, {} ranks, "
            "{:.0f} MiB per rank, {} + AdamW", config.name, parameter_count(config), batch,
            config.block_size, ranks, budget_mib,
            precision == DType::bf16 ? "bf16 mixed precision" : "fp32");
  log::info("machine (measured on the {} ranks started{}): a block's forward + backward {:.1f} "
            "GFLOP/s per rank (sgemm n = {}: {:.1f}), all-reduce bus bandwidth {:.2f} GB/s, "
            "latency {:.1f} us{}", world.size(),
            rows_measured < wanted_rows
                ? fmt::format(", on micro-batches of {} rows instead of the plans' {}",
                              rows_measured, wanted_rows)
                : std::string(),
            m.flops / 1e9, config.n_embd, m.gemm_flops / 1e9, m.bus_bytes_per_s / 1e9,
            m.latency_s * 1e6,
            m.shared_cores ? "; more ranks than cores: the bubble is not idle time" : "");
  log::info("{} configurations fit; the fastest {} (memory and time of the busiest stage):",
            rows.size(), std::min<std::size_t>(rows.size(), top));
  log::info("{:>3} {:>3} {:>3} {:>3} {:>3} {:>4} {:>4} {:>5} {:>4}  {:>10} {:>9} {:>9} {:>8} "
            "{:>9}  {:>9} {:>6} {:>7} {:>7} {:>7} {:>7} {:>9}", "dp", "cp", "tp", "pp", "m",
            "zero", "ckpt", "sched", "attn", "params", "state MiB", "acts MiB", "bwd MiB", "total MiB", "compute ms", "bubble",
            "tp ms", "pp ms", "cp ms", "dp ms", "step ms");
  for (std::size_t i = 0; i < rows.size() && static_cast<int>(i) < top; ++i) {
    const auto& [p, d] = rows[i];
    log::info("{:>3} {:>3} {:>3} {:>3} {:>3} {:>4} {:>4} {:>5} {:>4}  {:>10} {:>9} {:>9} {:>8} "
              "{:>9}  {:>9.2f} {:>6.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>9.2f}", p.grid.dp,
              p.grid.cp, p.grid.tp, p.grid.pp, p.micro_batches, p.zero_stage,
              p.checkpoint ? "yes" : "no", schedule_cell(p), attention_cell(p), d.params, mib(d.state_bytes),
              mib(d.activation_bytes), mib(d.transient_bytes), mib(d.total_bytes),
              d.compute_s * 1e3, d.bubble, d.tp_s * 1e3, d.pp_s * 1e3, d.cp_s * 1e3,
              d.dp_s * 1e3, d.step_s * 1e3);
  }
  return 0;
}

// An option of one mode given in the other was silently ignored (./scalelab plan --dp 3 planned
// every grid; --memory without --plan trained): a usage error names it and what it is for.
void refuse_options_of_the_other_mode(const cxxopts::ParseResult& parsed) {
  const bool planning = parsed["plan"].as<bool>() || parsed["check-plan"].as<bool>();
  // what --plan and --check-plan choose themselves, or do not use
  for (const char* name : {"dp", "tp", "pp", "grid-order", "micro-batches", "zero", "checkpoint",
                           "twin-steps", "schedule", "chunks", "cp", "attention"})
    SCALELAB_REQUIRE(!planning || parsed.count(name) == 0,
                     "--{} is for a training run: --plan and --check-plan try every grid, "
                     "micro-batch count, ZeRO stage and checkpointing themselves", name);
  for (const char* name : {"ranks", "memory", "top", "check-steps"})
    SCALELAB_REQUIRE(planning || parsed.count(name) == 0,
                     "--{} is for --plan or --check-plan (this run trains)", name);
  SCALELAB_REQUIRE(!parsed.count("top") || parsed["plan"].as<bool>(), "--top is for --plan");
  SCALELAB_REQUIRE(!parsed.count("context") || parsed["plan"].as<bool>(),
                   "--context is for --plan (a training run's context is the model's)");
  SCALELAB_REQUIRE(!parsed.count("check-steps") || parsed["check-plan"].as<bool>(),
                   "--check-steps is for --check-plan");
}

// ---- --check-plan (step 5): pure helpers -------------------------------------------------------

// (measured - predicted) / measured: -0.5 means the planner said 1.5 x the measured figure.
double relative_error(double predicted, double measured) {
  return measured != 0 ? (predicted - measured) / measured : 0.0;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Spearman's rank correlation of two rankings of the same n items (1-based, no ties): 1 the same
// order, -1 reversed, ~0 unrelated.
double rank_correlation(const std::vector<std::size_t>& a, const std::vector<std::size_t>& b) {
  const double n = static_cast<double>(a.size());
  if (a.size() < 2) return 1.0;
  double d2 = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    d2 += d * d;
  }
  return 1.0 - 6.0 * d2 / (n * (n * n - 1.0));
}

struct Measured {
  double peak_bytes = 0;  ///< the allocator's peak above the data, the largest over the ranks
  double step_s = 0;      ///< median over the timed steps of the slowest rank's step_3d
  double min_s = 0, max_s = 0;  ///< the fastest and slowest of those steps (the noise)
  double optimizer_s = 0; ///< median of the slowest rank's optimizer step (not predicted)
};

// Runs one plan on `world` (collective): builds the grid and model, 1 warm-up + `steps` steps.
Measured measure_plan(const ModelConfig& config, const Plan& p, data::Sampler& sampler,
                      int steps, uint64_t seed, DType precision, comm::Communicator& world) {
  const Device cpu = Device::cpu();
  const comm::ProcessGrid grid(world, p.grid);  // plan_all's: megatron's order
  Groups g = groups_of(grid);
  world.barrier();
  const std::size_t base = memory_stats(cpu).current;
  reset_peak_memory(cpu);
  Measured out;
  std::vector<double> times, optimizer_times;
  {
    Trainer3D trainer(config, g, p, nn::GPTOptions{.seed = seed, .compute_dtype = precision});
    for (int step = 0; step <= steps; ++step) {  // step 0: warm-up (AdamW allocates m and v)
      const data::Batch batch = sampler.batch(step);
      world.barrier();
      metrics::Timer timer(cpu);
      trainer.step(batch);
      const double step_s = timer.elapsed();
      timer.start();
      trainer.optimizer_step(1e-4);
      Tensor dt = Tensor::from_vector({step_s, timer.elapsed()}, {2}, DType::f64);
      world.all_reduce(dt, comm::ReduceOp::max);
      const std::vector<double> both = dt.to_vector();
      if (step > 0) {
        times.push_back(both[0]);
        optimizer_times.push_back(both[1]);
      }
    }
    Tensor peak = Tensor::from_vector(
        {static_cast<double>(memory_stats(cpu).peak - base)}, {1}, DType::f64);
    world.all_reduce(peak, comm::ReduceOp::max);
    out.peak_bytes = peak.item();
  }
  out.step_s = median(times);
  out.min_s = *std::min_element(times.begin(), times.end());
  out.max_s = *std::max_element(times.begin(), times.end());
  out.optimizer_s = median(optimizer_times);
  world.barrier();
  return out;
}

// --check-plan: every plan --plan lists for the ranks started, predicted vs measured (rank 0).
int check_plan(train::Session& session, const cxxopts::ParseResult& parsed) {
  const ModelConfig& config = session.config();
  const train::TrainOptions& opt = session.opt();
  const uint64_t seed = session.run().seed;
  const DType precision = session.run().precision;
  comm::Communicator& world = session.comm();
  const std::size_t budget = parse_memory(parsed["memory"].as<std::string>());
  const double budget_mib = static_cast<double>(budget) / 1048576.0;
  const int steps = parsed["check-steps"].as<int>();
  SCALELAB_REQUIRE(steps >= 1, "--check-steps must be at least 1, got {}", steps);
  SCALELAB_REQUIRE(!parsed["plan"].as<bool>(), "--check-plan and --plan: give one of them");
  SCALELAB_REQUIRE(parsed["ranks"].as<int>() == 0 || parsed["ranks"].as<int>() == world.size(),
                   "--check-plan runs on the ranks started ({}), got --ranks {}", world.size(),
                   parsed["ranks"].as<int>());
  // Every plan draws the global batch, and the machine is measured on one block with a rank's
  // share of it: too large for this machine is a usage error on every rank.
  train::require_host_memory(
      train::step_bytes_at_least(config, {.global_batch = opt.batch,
                                          .rows = opt.batch / world.size(), .layers = 1,
                                          .head = false}, precision),
      fmt::format("--batch {}", opt.batch), "--check-plan");
  const Machine m = measure_machine(world, config,
                                    std::max<int64_t>(1, opt.batch / world.size()), precision);
  const auto rows = plan_all(config, world.size(), opt.batch, m, budget, precision);
  data::Sampler& sampler = session.sampler();  // the corpus is read here, after the checks
  log::info("lab 10 planner check: model {}, {}, global batch {} x {} tokens, {} ranks, {:.0f} MiB "
            "per rank; machine: a block's forward + backward {:.1f} GFLOP/s per rank (sgemm n = "
            "{}: {:.1f}), all-reduce {:.2f} GB/s, {:.1f} us{}", config.name,
            precision == DType::bf16 ? "bf16 mixed precision" : "fp32", opt.batch,
            config.block_size, world.size(), budget_mib, m.flops / 1e9, config.n_embd,
            m.gemm_flops / 1e9, m.bus_bytes_per_s / 1e9, m.latency_s * 1e6,
            m.shared_cores ? "; more ranks than cores: the bubble is not idle time" : "");
  struct Row { Plan p; Prediction d; Measured x; };
  std::vector<Row> ran;
  for (const auto& [p, d] : rows)  // plan_all lists only what the 3D step runs (check_runnable)
    ran.push_back({p, d, measure_plan(config, p, sampler, steps, seed, precision, world)});
  log::info("{} configurations fit; all run (1 warm-up + {} timed steps each)", rows.size(), steps);
  if (ran.empty()) return 0;
  log::info("memory: predicted state + activations + backward transient of the busiest rank vs "
            "the allocator's peak (max over ranks), MiB; step: predicted vs the slowest rank's "
            "step (forward, backward, communication: what the planner models), median ms "
            "(min..max), and the "
            "optimizer step after it (not predicted); err = (predicted - measured) / measured; "
            "rank: by predicted / by measured step time");
  log::info("{:>3} {:>3} {:>3} {:>3} {:>3} {:>4} {:>4} {:>5} {:>4}  {:>8} {:>8} {:>6}  {:>7} "
            "{:>7} {:>13} {:>6} {:>6}  {:>4} {:>4}", "dp", "cp", "tp", "pp", "m", "zero", "ckpt",
            "sched", "attn", "mem pred", "mem meas", "err",
            "ms pred", "ms meas", "(min..max)", "err", "opt ms", "pred", "meas");
  std::vector<std::size_t> by_measured(ran.size());
  for (std::size_t i = 0; i < ran.size(); ++i) by_measured[i] = i;
  std::stable_sort(by_measured.begin(), by_measured.end(), [&](std::size_t a, std::size_t b) {
    return ran[a].x.step_s < ran[b].x.step_s;
  });
  std::vector<std::size_t> measured_rank(ran.size());
  for (std::size_t r = 0; r < ran.size(); ++r) measured_rank[by_measured[r]] = r + 1;
  double mem_abs = 0, time_abs = 0;
  for (std::size_t i = 0; i < ran.size(); ++i) {  // in the planner's order: fastest first
    const auto& [p, d, x] = ran[i];
    const double em = relative_error(static_cast<double>(d.total_bytes), x.peak_bytes);
    const double et = relative_error(d.step_s, x.step_s);
    mem_abs += std::abs(em);
    time_abs += std::abs(et);
    log::info("{:>3} {:>3} {:>3} {:>3} {:>3} {:>4} {:>4} {:>5} {:>4}  {:>8} {:>8} {:>+5.0f}%  "
              "{:>7.1f} {:>7.1f} {:>13} {:>+5.0f}% {:>6.1f}  {:>4} {:>4}", p.grid.dp, p.grid.cp,
              p.grid.tp, p.grid.pp, p.micro_batches, p.zero_stage, p.checkpoint ? "yes" : "no",
              schedule_cell(p), attention_cell(p), mib(d.total_bytes),
              mib(static_cast<std::size_t>(x.peak_bytes)), em * 100, d.step_s * 1e3,
              x.step_s * 1e3, fmt::format("({:.1f}..{:.1f})", x.min_s * 1e3, x.max_s * 1e3),
              et * 100, x.optimizer_s * 1e3, i + 1, measured_rank[i]);
  }
  const Row& best = ran[by_measured[0]];
  std::vector<std::size_t> predicted_rank(ran.size());
  for (std::size_t i = 0; i < ran.size(); ++i) predicted_rank[i] = i + 1;
  log::info("mean |err|: memory {:.0f}%, step time {:.0f}%; rank correlation of predicted and "
            "measured step times (Spearman) {:+.2f}", 100 * mem_abs / ran.size(),
            100 * time_abs / ran.size(), rank_correlation(predicted_rank, measured_rank));
  log::info("predicted best {} ({:.2f} ms measured) {} the measured best {} ({:.2f} ms); the "
            "predicted best ranks {} of {} measured (dp x cp x tp x pp)", plan_phrase(ran[0].p),
            ran[0].x.step_s * 1e3, by_measured[0] == 0 ? "IS" : "is NOT", plan_phrase(best.p),
            best.x.step_s * 1e3, measured_rank[0], ran.size());
  // The errors by schedule and by cp attention: where the model of each is checked.
  std::map<std::string, std::vector<std::pair<double, double>>> groups;  // (memory, time) errors
  for (const Row& r : ran) {
    const std::pair<double, double> e{
        relative_error(static_cast<double>(r.d.total_bytes), r.x.peak_bytes),
        relative_error(r.d.step_s, r.x.step_s)};
    groups["schedule " + schedule_cell(r.p)].push_back(e);
    if (r.p.grid.cp > 1) groups["cp " + attention_cell(r.p)].push_back(e);
  }
  for (const auto& [name, errs] : groups) {
    double mem = 0, time = 0, lo = errs[0].first, hi = errs[0].first;
    for (const auto& [em, et] : errs) {
      mem += std::abs(em);
      time += std::abs(et);
      lo = std::min(lo, em);
      hi = std::max(hi, em);
    }
    const double n = static_cast<double>(errs.size());
    log::info("{}: {} plans, memory mean |err| {:.1f}% ({:+.1f}%..{:+.1f}%), step time mean "
              "|err| {:.0f}%", name, errs.size(), 100 * mem / n, 100 * lo, 100 * hi,
              100 * time / n);
  }
  return 0;
}

// Step 1, seen. The grid's table (comm::grid_table: the layout the program's communicators
// follow, with its formula "rank = pp*4 + dp*2 + tp") is step 1's answer for this grid: it is
// printed only once your step 1 lays these ranks out the same way (every rank's coordinate,
// its way back, its three groups), so it shows your own work and hands over nothing before step
// 1 is done. Until then the title line (no formula) and why. With cp > 1 (lab 11's axis, not
// step 1's) step 1 is compared on the grid's dp x tp x pp. Pure index math: every rank alike.
std::string grid_lines(const comm::ProcessGrid& grid) {
  const GridShape& shape = grid.shape();
  GridShape three = shape;
  three.cp = 1;
  std::string why;
  try {
    // every coordinate first: the groups are made of them
    for (int r = 0; r < three.world_size() && why.empty(); ++r) {
      const GridCoord c = lab10::grid_coord(three, r);
      if (!(c == comm::grid_coord(three, r)) || lab10::grid_rank(three, c) != r)
        why = fmt::format("your grid_coord or grid_rank places rank {} elsewhere", r);
    }
    for (int r = 0; r < three.world_size() && why.empty(); ++r)
      if (lab10::group_ranks(three, r, Axis::tp) != comm::tp_group_ranks(three, r) ||
          lab10::group_ranks(three, r, Axis::dp) != comm::dp_group_ranks(three, r) ||
          lab10::group_ranks(three, r, Axis::pp) != comm::pp_group_ranks(three, r))
        why = fmt::format("your group_ranks gives rank {} other groups", r);
  } catch (const NotImplemented&) {
    why = "your step 1 is not written yet";
  } catch (const std::exception& e) {
    why = fmt::format("your step 1 stopped: {}", e.what());
  }
  if (why.empty())
    return grid.table() +
           "(a group cell such as \"pp1 [1 3]\" is group number 1 of that kind and its world "
           "ranks in group-rank order, not a coordinate: the coordinates are the dp, tp, pp "
           "columns)\n";  // a blank line before the stages
  return fmt::format(
      "process grid: dp {} x tp {} x pp {}{} = {} ranks, order {}\n(each rank's coordinates "
      "and groups are shown here once your step 1 lays these ranks out as the library's "
      "comm::ProcessGrid does, whose communicators this program uses; {}: ./scalelab grade 10 "
      "tests it)\n",
      shape.dp, shape.tp, shape.pp, shape.cp > 1 ? fmt::format(" x cp {}", shape.cp) : "",
      shape.world_size(), comm::grid_order_name(shape.order), why);
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    train::Session session("lab10_3d_parallel",
                           "Lab 10: one GPT trained on a dp x tp x pp grid of ranks",
                           {.model = "small", .batch = 8, .steps = 10});
    session.add_options("lab 10")
        ("dp", "data-parallel replicas (0: the ranks left over by tp and pp)",
         cxxopts::value<int>()->default_value("0"))
        ("tp", "tensor-parallel ranks per stage (0: see --dp)", cxxopts::value<int>()->default_value("0"))
        ("pp", "pipeline stages (0: see --dp)", cxxopts::value<int>()->default_value("0"))
        ("cp", "context-parallel ranks per sequence (lab 11: each keeps T/cp zig-zag tokens)",
         cxxopts::value<int>()->default_value("1"))
        ("attention", "--cp > 1: lab 11's ring or all-to-all attention over the cp group",
         cxxopts::value<std::string>()->default_value("ring"))
        ("grid-order", "megatron (tp, dp, pp from the inside out) or picotron (tp, pp, dp)",
         cxxopts::value<std::string>()->default_value("megatron"))
        ("micro-batches", "micro-batches per replica and step (m)",
         cxxopts::value<int>()->default_value("2"))
        ("twin-steps", "steps compared with the single-device twin (rank 0)",
         cxxopts::value<int>()->default_value("3"))
        ("zero", "0: a whole AdamW on every rank; 1, 2, 3: ZeRO-1/2/3 over the dp group (lab "
                 "09; 2 and 3 reduce / gather every unit once per micro-batch)",
         cxxopts::value<int>()->default_value("0"))
        ("schedule", "the pipeline schedule (lab 08): afab, 1f1b or interleaved",
         cxxopts::value<std::string>()->default_value("1f1b"))
        ("chunks", "model chunks per rank for --schedule interleaved (v; 0: 2 when "
                   "interleaved, else 1)", cxxopts::value<int>()->default_value("0"))
        ("checkpoint", "full activation checkpointing of every block (recomputed in backward)")
        ("plan", "list the configurations step 4 predicts, fastest first (trains nothing)")
        ("ranks", "--plan: ranks to plan for (default: the ranks started)",
         cxxopts::value<int>()->default_value("0"))
        ("memory", "--plan, --check-plan: memory per rank, e.g. 80GiB or 512MiB (a plain "
                   "number is MiB)", cxxopts::value<std::string>()->default_value("1GiB"))
        ("top", "--plan: rows shown", cxxopts::value<int>()->default_value("20"))
        ("context", "--plan: tokens per sequence to plan for (0: the model's context); long "
                    "ones make cp pay", cxxopts::value<int64_t>()->default_value("0"))
        ("check-plan", "step 5: run every configuration --plan lists for the ranks started; "
                       "predicted vs measured memory and step time")
        ("check-steps", "--check-plan: timed steps per configuration (after 1 warm-up)",
         cxxopts::value<int>()->default_value("10"));
    // --plan and --check-plan refuse --device cuda before a device is picked (picking a GPU where
    // there is none fails first), and a training run checks its grid first: the lab picks it.
    const auto& parsed = session.parse(argc, argv, train::Session::DevicePick::by_lab);
    const auto& run = session.run();
    const auto& opt = session.opt();
    const GridOrder order = comm::parse_grid_order(parsed["grid-order"].as<std::string>());
    const int m = parsed["micro-batches"].as<int>();
    const int twin_steps = parsed["twin-steps"].as<int>();
    SCALELAB_REQUIRE(twin_steps >= 0, "--twin-steps must be at least 0, got {}", twin_steps);
    const int zero = parsed["zero"].as<int>();
    const ModelConfig& config = session.config();
    refuse_options_of_the_other_mode(parsed);
    // the library's MoE block has no tensor-parallel cut, its routing under cp and micro-batches
    // no twin to match, and the planner's formulas count dense blocks (training, --plan and
    // --check-plan alike)
    session.require_dense("lab 10's grids and planner take dense blocks only");

    comm::Communicator& world = session.comm();
    if (parsed["check-plan"].as<bool>()) {
      // the planner's machine model (measure_machine) is the CPU's: sgemm, MPI, shared cores
      SCALELAB_REQUIRE(run.device == "cpu", "--check-plan measures the CPU's time model "
                                            "(--device cpu), got --device {}", run.device);
      return check_plan(session, parsed);
    }
    if (parsed["plan"].as<bool>()) {
      // the planner measures this machine's CPU, what lab 10 runs on: a GPU is not measured
      SCALELAB_REQUIRE(run.device == "cpu", "--plan measures the CPU (lab 10 runs on the CPU), "
                                            "got --device {}", run.device);
      return plan(config, opt.batch, run.precision, parsed, world);
    }
    const GridShape shape = default_grid(parsed["dp"].as<int>(), parsed["tp"].as<int>(),
                                         parsed["pp"].as<int>(), world.size(), config, order,
                                         parsed["cp"].as<int>());
    const lab11::Attention attention = lab11::parse_attention(parsed["attention"].as<std::string>());
    // Bad grids are usage errors on every rank, before any data is read.
    check_4d(config, shape, world.size(), opt.batch, m, attention);
    const lab08::Kind schedule = lab08::parse_kind(parsed["schedule"].as<std::string>());
    const int chunks = parsed["chunks"].as<int>() != 0 ? parsed["chunks"].as<int>()
                       : schedule == lab08::Kind::interleaved ? 2 : 1;
    const Plan run_plan{shape, m, zero, parsed["checkpoint"].as<bool>(), schedule, chunks,
                        attention};
    check_runnable(run_plan);
    if (schedule == lab08::Kind::interleaved)  // the layers must split into pp x v equal pieces
      lab08::chunk_layers(static_cast<int>(config.n_layer), shape.pp, chunks, 0, 0);
    session.pick_device();
    const Device device = session.device();

    const comm::ProcessGrid grid(world, shape);
    Groups g = groups_of(grid);
    // A micro-batch of this replica through this stage's blocks split over tp (1F1B keeps up to
    // min(pp - stage, m) of them), the head on the last stage; rank 0 also runs the single-device
    // twin on the whole batch. Too large for this machine: a usage error on every rank.
    const int stage = grid.coord().pp;
    const lab08::LayerRange blocks = lab08::stage_layers(static_cast<int>(config.n_layer), shape.pp, stage);
    // With cp a rank's rows are T/cp tokens and its attention core is fused (no (T, T)
    // probabilities): sized on a context of T/cp.
    const bool twin_rank = world.rank() == 0 && twin_steps > 0;
    ModelConfig rows_config = config;
    if (!twin_rank) rows_config.block_size = config.block_size / shape.cp;
    const train::StepShape step_shape =
        twin_rank
            ? train::StepShape{.global_batch = opt.batch, .rows = opt.batch, .layers = config.n_layer}
            : train::StepShape{.global_batch = opt.batch, .rows = opt.batch / shape.dp / m,
                               .in_flight = std::min(shape.pp - stage, m), .layers = blocks.size(),
                               .tp = shape.tp, .head = stage == shape.pp - 1,
                               .checkpoint = run_plan.checkpoint,
                               .attention_probabilities = shape.cp == 1};
    train::require_host_memory(train::step_bytes_at_least(rows_config, step_shape, run.precision),
                               fmt::format("--batch {}", opt.batch), "a training step");
    data::Sampler& sampler = session.sampler();
    // Said before the model is built: the grid (step 1) shows while step 2 is still a stub.
    session.announce(fmt::format(
        "lab 10 3d_parallel: model {} ({} layers, {} heads), global batch {} = dp {} x {} "
        "micro-batches of {} rows, {} steps, {}{}, schedule {}{}", config.name, config.n_layer,
        config.n_head, opt.batch, shape.dp, m, opt.batch / shape.dp / m, opt.steps,
        zero == 0 ? "AdamW whole on every rank" : fmt::format("ZeRO-{} over dp", zero),
        run_plan.checkpoint ? ", every block checkpointed" : "", lab08::kind_name(schedule),
        chunks > 1 ? fmt::format(" with {} chunks per rank", chunks) : ""), /*mfu_note=*/false);
    if (shape.cp > 1)
      log::info("cp {}: each rank keeps {} of the {} tokens of every sequence (lab 11's zig-zag "
                "chunks), attention by {} over its cp group; gradients and loss averaged over dp "
                "x cp = {} ranks{}", shape.cp, config.block_size / shape.cp, config.block_size,
                lab11::attention_name(attention), shape.dp * shape.cp,
                zero > 0 ? ", ZeRO sharded over them" : "");
    log::info("{}", grid_lines(grid));
    for (int s = 0; s < shape.pp; ++s) {  // what every stage holds (the same rule on every rank)
      // interleaved: v chunks per stage, chunk k the virtual stage k pp + s (lab08::chunk_layers)
      std::string held;
      for (int k = 0; k < chunks; ++k) {
        const lab08::LayerRange r =
            chunks > 1 ? lab08::chunk_layers(static_cast<int>(config.n_layer), shape.pp, chunks,
                                             s, k)
                       : lab08::stage_layers(static_cast<int>(config.n_layer), shape.pp, s);
        held += fmt::format("{}[{}, {})", k == 0 ? "" : k + 1 == chunks ? " and " : ", ",
                            r.first, r.last);
      }
      log::info("stage {}: blocks {}{}{}{}, {}", s, held,
                chunks > 1 ? fmt::format(" ({} chunks)", chunks) : "",
                s == 0 ? ", embedding (wte split by vocabulary)" : "",
                s == shape.pp - 1 ? ", ln_f and head (logits split by vocabulary)" : "",
                shape.tp > 1 ? fmt::format("each block split over tp {}", shape.tp)
                             : std::string("blocks whole (tp 1)"));
    }
    // bf16: mixed precision (fp32 master, gradients and AdamW state; bf16 compute copy and
    // activations, sent through the pipeline and all-reduced over tp in bf16)
    const nn::GPTOptions model_options = session.model_options(run.seed);
    Trainer3D trainer(config, g, run_plan, model_options);
    nn::GPT* model = &trainer.model();
    // --diverge: one step, this rank's micro-batches (its replica's rows, its cp positions), its
    // stage's blocks, tp heads and vocabulary columns compared with the twin's
    std::shared_ptr<train::DivergenceRecorder> diverge;
    for (nn::GPT* piece : trainer.pieces()) {
      const train::RowLayout rows = {
          .first_row = g.coord.dp * (opt.batch / shape.dp),
          .positions = shape.cp > 1
                           ? lab11::zigzag_positions(config.block_size, shape.cp, g.coord.cp)
                           : std::vector<int64_t>{}};
      if (!diverge) diverge = session.watch_divergence(*piece, rows);
      else train::watch(*piece, diverge);
    }

    // The single-device twin (world rank 0): the same seed, the same global batches, AdamW, the
    // same precision. The 3D step must match it: fp32 to 1e-5 relative (sums over tp, micro-
    // batches and dp run in another order), bf16 to 1e-3 (each tp rank rounds its partial sums
    // to bf16 before the all-reduce adds them).
    train::TwinCheck twin_check(run.precision);
    std::unique_ptr<nn::GPT> twin;
    std::unique_ptr<optim::AdamW> twin_opt;
    if (world.rank() == 0 && twin_steps > 0) {
      twin = std::make_unique<nn::GPT>(config, model_options);
      twin_opt = std::make_unique<optim::AdamW>(optim::groups(twin->parameters()));
    }

    // Parameters per rank (every piece it holds: interleaved, its v chunks): gathered to show
    // that the model is cut, not copied.
    int64_t held_parameters = 0;
    for (const nn::GPT* piece : trainer.pieces()) held_parameters += piece->num_parameters();
    Tensor mine = Tensor::from_vector({static_cast<double>(held_parameters)}, {1}, DType::f64);
    Tensor all = Tensor::zeros({world.size()}, DType::f64);
    world.all_gather(mine, all);
    std::string per_rank;
    for (double x : all.to_vector()) per_rank += fmt::format(" {:.0f}", x);
    log::info("parameters per rank:{} (the whole model: {})", per_rank, parameter_count(config));
    for (int64_t step = 0; step < opt.steps; ++step) {
      const double lr = session.lr(step);
      metrics::Timer timer(device);
      const data::Batch batch = sampler.batch(step);  // on the host: each stage moves its rows
      if (step == 0) comm::reset_comm_stats();
      const comm::CommStats before_step = comm::comm_stats();
      const double loss = trainer.step(batch);
      const comm::CommStats after_step = comm::comm_stats();
      trainer.optimizer_step(lr);
      const double dt = timer.elapsed();
      if (step == 0) {
        const comm::CommStats first = comm::comm_stats();
        // What ZeRO costs over dp, from the byte counters: ZeRO-2 reduces every unit's gradient
        // once per micro-batch, ZeRO-3 gathers every unit for every micro-batch's forward and
        // backward and reduce-scatters it once per micro-batch: m times one batch's traffic.
        const int64_t in_step =
            comm::comm_total(after_step - before_step, g.replicas().name()).bytes;
        const int64_t in_opt = comm::comm_total(first - after_step, g.replicas().name()).bytes;
        // ZeRO 0/1 average the gradients once, after the last micro-batch: no per-micro-batch
        // figure there.
        log::info("dp traffic of step 0 on rank 0 (group {}): {} payload bytes in the step ({}), "
                  "{} in the optimizer step", g.replicas().name(), in_step,
                  zero >= 2 ? fmt::format("{} per micro-batch over m = {}, {} unit {}",
                                          in_step / m, m, trainer.unit_collectives(),
                                          zero == 2 ? "reductions" : "gathers")
                            : std::string("the gradients once, after the last micro-batch"),
                  in_opt);
        // m and v of every parameter this rank holds (all its pieces), in the master dtype
        const int64_t whole_adamw = 2 * held_parameters *
                                    static_cast<int64_t>(dtype_size(model->params().dtype()));
        if (zero > 0)
          log::info("ZeRO-{}: rank 0 keeps {} bytes of AdamW state (a whole AdamW of what it "
                    "holds: {}, {:.0f}% of it)", zero, trainer.optimizer_state_bytes(),
                    whole_adamw, 100.0 * static_cast<double>(trainer.optimizer_state_bytes()) /
                                     static_cast<double>(whole_adamw));
        log::info("payload bytes of step 0 on rank 0, per group (tp: the blocks' all-reduces; "
                  "pp: activations and gradients, the tied embedding; dp: the gradients):\n{}",
                  comm::format_comm_stats(first));
        // the model calls its tp mappings whatever tp is: on a group of 1 they move nothing
        if (shape.tp == 1)
          log::info("(tp 1: the tp group is each rank alone; its all-reduces above are the "
                    "blocks' calls on a group of size 1, which send nothing to another rank)");
      }
      log::info("{}", session.step_line(step, loss, dt));
      if (twin && step < twin_steps) {
        twin->zero_grad();
        const data::Batch on_device = batch.to(device);
        const double want = twin->forward(on_device.x, on_device.y);
        twin->backward();
        twin_opt->step(lr);
        log::info("  single-device twin step={} loss={:.6f} (3D - twin: {:+.2e})", step, want,
                  loss - want);
        if (!twin_check.add(loss, want))
          log::info("  the 3D step's loss against the twin's: {}", twin_check.verdict());
      }
    }
    if (diverge) {
      if (zero < 2)  // ZeRO-2/3 keep their gradient shards inside the trainer: activations only
        for (nn::GPT* piece : trainer.pieces()) diverge->record_gradients(*piece);
      nn::GPTOptions twin = model_options;
      twin.flash_attention = shape.cp > 1;  // cp's fused core keeps log-sum-exps
      return static_cast<int>(session.divergence_exit(*diverge, twin));
    }
    return static_cast<int>(train::on_every_rank(twin_check.ok, world) ? kExitOk : kExitFailed);
  });
}
