// Lab 08 driver (not edited by attendees): pipeline-parallel training, one stage per rank, then
// the timeline of one step and the table of measured bubbles and activation memory.
//
//   ./scalelab run 08 -n 4                                        # your code, 1F1B on 4 stages
//   ./scalelab run 08 --solution -n 4 -- --schedule afab --micro-batches 8
//   ./scalelab run 08 --solution -n 2 -- --schedule interleaved --chunks 2 --trace pp.json
#include <algorithm>
#include <cmath>

#include "common/allocator.hpp"
#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/session.hpp"
#include "common/train/sizing.hpp"
#include "pipeline_parallel.hpp"

using namespace scalelab;
using namespace scalelab::lab08;

namespace {

std::vector<nn::Parameter*> all_parameters(const std::vector<nn::GPT*>& pieces) {
  std::vector<nn::Parameter*> out;
  for (nn::GPT* g : pieces)
    for (nn::Parameter* x : g->parameters()) out.push_back(x);
  return out;
}

// Every rank's value of x, on every rank.
std::vector<double> gather(double x, comm::Communicator& comm) {
  Tensor in = Tensor::from_vector({x}, {1}, DType::f64);
  Tensor out = Tensor::zeros({comm.size()}, DType::f64);
  comm.all_gather(in, out);
  return out.to_vector();
}

// Every rank's forwards and backwards of one step (seconds), on rank 0 (collective).
std::vector<std::vector<Span>> gather_spans(const ExecStats& stats, int max_units,
                                            comm::Communicator& comm) {
  std::vector<double> mine(static_cast<std::size_t>(max_units) * 5, -1.0);
  int n = 0;
  for (const Timed& t : stats.actions)
    if ((t.action.op == Op::forward || t.action.op == Op::backward) && n < max_units) {
      double* row = &mine[static_cast<std::size_t>(n++) * 5];
      row[0] = t.action.op == Op::forward ? 0 : 1;
      row[1] = t.action.mb;
      row[2] = t.action.chunk;
      row[3] = t.begin_s;
      row[4] = t.end_s;
    }
  Tensor in = Tensor::from_vector(mine, {static_cast<int64_t>(mine.size())}, DType::f64);
  Tensor out = Tensor::zeros({static_cast<int64_t>(mine.size()) * comm.size()}, DType::f64);
  comm.all_gather(in, out);
  const std::vector<double> all = out.to_vector();
  std::vector<std::vector<Span>> spans(comm.size());
  for (int r = 0; r < comm.size(); ++r)
    for (int i = 0; i < max_units; ++i) {
      const double* row = &all[(static_cast<std::size_t>(r) * max_units + i) * 5];
      if (row[0] < 0) break;
      spans[r].push_back({{row[0] == 0 ? Op::forward : Op::backward, static_cast<int>(row[1]),
                           static_cast<int>(row[2])},
                          row[3], row[4]});
    }
  return spans;
}

// "1 stage", "4 stages".
std::string count(int64_t n, const std::string& one, const std::string& many = "") {
  return fmt::format("{} {}", n, n == 1 ? one : many.empty() ? one + "s" : many);
}

std::string list(const std::vector<double>& xs, const char* fmt_spec) {
  std::string s;
  for (double x : xs) s += (s.empty() ? "" : " ") + fmt::format(fmt::runtime(fmt_spec), x);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    train::Session session("lab08_pipeline_parallel",
                     "Lab 08: pipeline-parallel training, one stage per rank",
                     {.batch = 16, .steps = 20});
    session.add_options("lab 08")
        ("schedule", "afab, 1f1b or interleaved",
         cxxopts::value<std::string>()->default_value("1f1b"))
        ("micro-batches", "micro-batches per step (m)", cxxopts::value<int>()->default_value("8"))
        ("chunks", "model chunks per rank for --schedule interleaved (v)",
         cxxopts::value<int>()->default_value("2"))
        ("twin-steps", "steps compared with the single-device twin (rank 0)",
         cxxopts::value<int>()->default_value("3"))
        ("reps", "repetitions per row of the bubble table (the fastest is shown)",
         cxxopts::value<int>()->default_value("3"));
    const auto& parsed = session.parse(argc, argv);
    const auto& run = session.run();
    const auto& opt = session.opt();
    const Kind kind = parse_kind(parsed["schedule"].as<std::string>());
    const int m = parsed["micro-batches"].as<int>();
    const int chunks = parsed["chunks"].as<int>();
    // --chunks was read by the interleaved schedule only (--chunks -5 with 1F1B trained): a
    // given one is checked whatever the schedule (the default, 2, is for interleaved)
    check_chunks(kind, kind == Kind::interleaved || parsed.count("chunks") ? chunks : 1);
    const int v = kind == Kind::interleaved ? chunks : 1;
    const int twin_steps = parsed["twin-steps"].as<int>();
    const int reps = parsed["reps"].as<int>();
    SCALELAB_REQUIRE(reps >= 1, "--reps must be at least 1, got {}", reps);
    SCALELAB_REQUIRE(twin_steps >= 0, "--twin-steps must be at least 0, got {}", twin_steps);
    // an MoE block routes each micro-batch as its own group (capacity, balancing loss), the
    // single-device twin the whole batch: their losses part (exit 1 on the twin check)
    session.require_dense("lab 08's pipeline trains dense blocks only");

    comm::Communicator& comm = session.comm();
    const int p = comm.size(), stage = comm.rank();
    const ModelConfig& config = session.config();
    const int L = static_cast<int>(config.n_layer);
    // Bad configurations are usage errors on every rank, before any data is read.
    stage_layers(L, p, stage);
    if (kind == Kind::interleaved) chunk_layers(L, p, v, stage, 0);
    const Schedule schedule = make_schedule(kind, p, m, v, stage);
    SCALELAB_REQUIRE(opt.batch % m == 0, "--batch {} does not split into {} equal micro-batches",
                     opt.batch, m);

    const Device device = session.device();
    // One micro-batch through this stage's blocks (and the head on the last); rank 0 also runs
    // the single-device twin on the whole batch. On a GPU the activations are the GPU's, and
    // only the batch is host memory. Too large: a usage error on every rank.
    const LayerRange mine_layers = stage_layers(L, p, stage);
    const bool twin_here = stage == 0 && twin_steps > 0;
    train::require_host_memory(
        train::step_bytes_at_least(
            config, {.global_batch = opt.batch,
                     .rows = !device.in_host_memory() ? 0 : twin_here ? opt.batch : opt.batch / m,
                     .layers = twin_here ? L : mine_layers.size(),
                     .head = twin_here || stage == p - 1},
            run.precision),
        fmt::format("--batch {}", opt.batch), "a training step");
    data::Sampler& sampler = session.sampler();
    const nn::GPTOptions model_options = session.model_options(run.seed);
    auto pieces = build_pieces(config, kind, p, v, stage, model_options);
    const std::vector<nn::GPT*> mine = pointers(pieces);
    optim::AdamW adamw(optim::groups(all_parameters(mine)));
    session.announce(fmt::format(
        "lab 08 pipeline_parallel: model {} ({}), {}, schedule {}{}, {} of {}, {}", config.name,
        count(L, "layer"), count(p, "stage"), kind_name(kind),
        v > 1 ? fmt::format(" with {} chunks per rank", v) : std::string(),
        count(m, "micro-batch", "micro-batches"), count(opt.batch / m, "row"),
        count(opt.steps, "step")));
    for (int r = 0; r < p; ++r) {  // what every stage holds (the same rule on every rank)
      std::string blocks;
      for (int c = 0; c < v; ++c) {
        const LayerRange x = kind == Kind::interleaved ? chunk_layers(L, p, v, r, c)
                                                       : stage_layers(L, p, r);
        blocks += fmt::format("{}[{}, {})", c == 0 ? "" : " ", x.first, x.last);
      }
      log::info("stage {} (rank {}): blocks {}{}{}", r, r, blocks, r == 0 ? ", embedding" : "",
                r == p - 1 ? ", ln_f and head" : "");
    }

    // The single-device twin (rank 0): the same seed, the same global batches, AdamW. The pipeline
    // must match it: fp32 to 1e-5 relative (only the order of the gradient sums over micro-batches
    // differs), bf16 to 1e-3 (every activation rounds to 8 bits; the micro-batches' weight
    // gradients are summed in fp32 in another order than one batch's).
    train::TwinCheck twin_check(run.precision);
    std::unique_ptr<nn::GPT> twin;
    std::unique_ptr<optim::AdamW> twin_opt;
    if (stage == 0 && twin_steps > 0) {
      twin = std::make_unique<nn::GPT>(config, model_options);  // the same precision
      twin_opt = std::make_unique<optim::AdamW>(optim::groups(twin->parameters()));
    }
    // --diverge: one step, each stage's (and chunk's) tensors compared with the twin's, every
    // micro-batch at its rows of the global batch
    std::shared_ptr<train::DivergenceRecorder> diverge;
    for (nn::GPT* piece : mine) {
      if (!diverge) diverge = session.watch_divergence(*piece);
      else train::watch(*piece, diverge);
    }
    ExecStats last;
    for (int64_t step = 0; step < opt.steps; ++step) {
      const double lr = session.lr(step);
      metrics::Timer timer(device);
      const data::Batch batch = sampler.batch(step);
      const double loss = pipeline_step(mine, schedule, batch, m, comm, &last);
      adamw.step(lr);
      log::info("{}", session.step_line(step, loss, timer.elapsed()));
      if (twin && step < twin_steps) {
        const data::Batch on = batch.to(device);
        twin->zero_grad();
        const double want = twin->forward(on.x, on.y);
        twin->backward();
        twin_opt->step(lr);
        log::info("  single-device twin step={} loss={:.6f} (pipeline - twin: {:+.2e})", step, want,
                  loss - want);
        if (!twin_check.add(loss, want))
          log::info("  the pipeline's loss against the twin's: {}", twin_check.verdict());
      }
    }

    if (diverge) {
      for (nn::GPT* piece : mine) diverge->record_gradients(*piece);  // tied copies summed
      return session.divergence_exit(*diverge, model_options);
    }

    // One more step, timed alone (the twin and the optimizer are not in it; every rank starts
    // after a barrier, so the ranks' clocks, each started at its own entry, line up), for the
    // measured timeline; beside it the simulator's for the same schedule.
    comm.barrier();
    pipeline_step(mine, schedule, sampler.batch(opt.steps), m, comm, &last);
    const auto spans = gather_spans(last, 2 * m * v, comm);
    double measured_end = 0;
    for (const auto& row : spans)
      for (const Span& s : row) measured_end = std::max(measured_end, s.end);
    const double column = measured_end / 100;  // 100 columns for the whole step
    std::vector<Schedule> all;
    for (int s = 0; s < p; ++s) all.push_back(make_schedule(kind, p, m, v, s));
    const SimResult sim = simulate(all, m, v);
    log::info("");
    log::info("simulated timeline of one step (forward 1 tick, backward 2; Fi/Bi = micro-batch "
              "i{}, . idle):", v > 1 ? ", letter = chunk" : "");
    log::info("{}", ascii_timeline(sim.spans, 1.0 / v, 120));
    log::info("measured timeline of one step on the ranks (one column = {:.2f} ms; an action "
              "shorter than a column may not show: --trace keeps every one):", column * 1e3);
    log::info("{}", ascii_timeline(spans, column, 100));

    // The table: each schedule and m, the bubble measured on every rank beside the formula and
    // the simulator, and the peak activation memory per stage.
    log::info("bubble = 1 - compute / step time per rank (fastest of {}); compute/wait: "
              "time in forwards and backwards / in receives; peak = allocator peak of one step "
              "above the model, per stage", count(reps, "step"));
    log::info("{:<12} {:>3} {:>7} {:>7}  {:<24} {:<36} {:>8}  {:<12} {}", "schedule", "m",
              "formula", "sim", "measured per rank", "compute/wait ms per rank", "step ms",
              "in flight", "peak activations per rank");
    std::vector<Kind> kinds = {Kind::afab, Kind::one_f_one_b};
    if (L % (p * 2) == 0) kinds.push_back(Kind::interleaved);
    bool sane = true;
    // The table needs the optional steps (5: the measurements, 6: the interleaved rows). Without
    // them it stops where the first missing one is called (on every rank at the same point: the
    // same code runs everywhere) and says so: the training above is the core's result.
    try {
      for (Kind k : kinds) {
        const int vk = k == Kind::interleaved ? (kind == Kind::interleaved ? v : 2) : 1;
        auto table_pieces = build_pieces(config, k, p, vk, stage, model_options);
        const auto ptrs = pointers(table_pieces);
        for (int mm : {1, 2, 4, 8, 16}) {
          if (opt.batch % mm != 0 || (k == Kind::interleaved && mm % p != 0)) continue;
          const Schedule sched = make_schedule(k, p, mm, vk, stage);
          std::vector<Schedule> sall;
          for (int s = 0; s < p; ++s) sall.push_back(make_schedule(k, p, mm, vk, s));
          const SimResult sr = simulate(sall, mm, vk);
          const data::Batch batch = sampler.batch(opt.steps);
          StageTime best;
          best.step_s = 1e30;
          for (int r = 0; r < reps; ++r) {
            ExecStats st;
            comm.barrier();  // every rank starts together
            pipeline_step(ptrs, sched, batch, mm, comm, &st);
            const StageTime t = measure_stage_time(st);
            if (t.step_s < best.step_s) best = t;
          }
          std::vector<data::Batch> micro;
          for (int i = 0; i < mm; ++i)
            micro.push_back(batch.rows(i * (opt.batch / mm), (i + 1) * (opt.batch / mm)));
          comm.barrier();
          const double peak =
              static_cast<double>(measure_peak_activation_bytes(ptrs, sched, micro, comm));
          const std::vector<double> bubbles = gather(best.bubble, comm);
          const std::vector<double> compute_ms = gather(best.compute_s * 1e3, comm);
          const std::vector<double> wait_ms = gather(best.wait_s * 1e3, comm);
          std::string times;
          for (int r = 0; r < p; ++r)
            times += fmt::format("{}{:.1f}/{:.1f}", r == 0 ? "" : " ", compute_ms[r], wait_ms[r]);
          const std::vector<double> step_ms = gather(best.step_s * 1e3, comm);
          const std::vector<double> peaks = gather(peak, comm);
          std::vector<double> flights;
          for (int x : sr.max_in_flight) flights.push_back(x);
          std::string peak_text;
          for (double b : peaks)
            peak_text += (peak_text.empty() ? "" : " ") + metrics::human_bytes(b);
          log::info("{:<12} {:>3} {:>7.3f} {:>7.3f}  {:<24} {:<36} {:>8.1f}  {:<12} {}",
                    k == Kind::interleaved ? fmt::format("interleaved{}", vk) : kind_name(k), mm,
                    bubble_formula(k, p, mm, vk), sr.bubble.empty() ? 0.0 : sr.bubble[0],
                    list(bubbles, "{:.2f}"), times,
                    *std::max_element(step_ms.begin(), step_ms.end()), list(flights, "{:.0f}"),
                    peak_text);
          sane = sane && !sr.deadlock;
        }
      }
    } catch (const NotImplemented& e) {
      log::info("the table stops here: {} (an optional step: ./scalelab grade 08 lists them)",
                e.what());
    }
    return train::on_every_rank(sane && twin_check.ok, comm) ? kExitOk : kExitFailed;
  });
}
