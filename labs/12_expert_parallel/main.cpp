// Lab 12 driver (not edited by attendees): trains a mixture-of-experts GPT (tiny-moe or
// small-moe) with its experts split over an ep group (--ep, default every rank) and, beside it,
// data parallelism over world/ep replicas of the experts. Every rank routes its own rows of the
// global batch; each MoE block sends every token to the rank holding its expert and back
// (step 3: the router, dispatch and combine are the library's nn::MoE, so steps 1-2 do not run
// here: their graders check them); with ep < world, expert gradients are summed over the ranks
// holding the same experts (step 4). Rank 0 also runs the single-device twin (same seed, same
// global batch, one routing group per rank) for the first --twin-steps steps and prints both
// losses. Then one measured step: tokens per expert per rank (kept and dropped) and the
// all-to-all bytes each rank sent, beside the formula; a last FAILED line where either check
// failed (exit 1). With --diverge: one step, and the first activation or gradient
// that left the single-device twin (common/train/divergence.hpp; the experts' gradients against
// the twin's rows of the rank's experts).
//
//   ./scalelab run 12 -n 4                          # your code, ep = 4
//   ./scalelab run 12 --solution -n 4 -- --ep 2     # ep 2 x dp 2
//   ./scalelab run 12 --solution -n 4 -- --precision bf16 --top-k 1
//   ./scalelab run 12 --solution -n 4 -- --sweep      # step 5: capacity factors vs a dense model
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/allocator.hpp"

#include "common/comm/stats.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/session.hpp"
#include "common/train/twin.hpp"
#include "expert_parallel.hpp"

using namespace scalelab;

namespace {

// ---- --sweep (step 5): the same steps at several capacity factors, and a dense model -----------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// --sweep-factors: "0.5,1,1.25,2", every item whole a finite number above 0 (std::stod alone took
// "1abc" as 1 and "nan", "inf" and "1e300" as factors), all checked before the first run.
std::vector<double> parse_sweep_factors(const std::string& text) {
  std::vector<double> factors;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    double cf = 0;
    std::size_t used = 0;
    try {
      cf = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SCALELAB_REQUIRE(used > 0 && used == item.size() && std::isfinite(cf) && cf > 0,
                     "--sweep-factors '{}': '{}' is not a capacity factor (finite numbers above 0, "
                     "separated by commas, e.g. 0.5,1,2)", text, item);
    factors.push_back(cf);
    if (end == text.size()) return factors;
    begin = end + 1;
  }
}

struct SweepRow {
  std::string what;
  double step_ms = 0, comm_ms = 0, peak_mib = 0, dropped = 0, a2a_kib = 0;
};

// `steps` training steps of `config` (dense when it has no experts) over ep = `ep`, from the same
// seed and batches; the medians of the step time and of the time blocked in communication (every
// collective: the all-to-alls, the gradients' all-reduces), the peak memory, the dropped pairs and
// the all-to-all bytes of the last step. Every rank's numbers, reduced: max of times and memory,
// sum of drops, max of bytes.
SweepRow sweep_run(train::Session& session, const ModelConfig& config, int ep, int64_t steps,
                   const std::string& what) {
  comm::Communicator& world = session.comm();
  const Device device = session.device();
  lab12::EpGroups groups = lab12::make_ep_groups(world, ep);
  std::unique_ptr<nn::GPT> model = std::make_unique<nn::GPT>(
      config, lab12::ep_model_options(session.model_options(session.run().seed), groups.ep));
  if (config.moe.enabled()) model->set_mappings(lab12::make_ep_mappings(groups.ep));
  optim::AdamW adamw(optim::groups(model->parameters()));
  std::vector<double> times, waits;
  double dropped = 0, a2a = 0;
  reset_peak_memory(device);
  for (int64_t step = 0; step < steps; ++step) {
    const data::Batch global = session.sampler().batch(step);
    world.barrier();
    const double w0 = comm::wait_seconds();
    const comm::CommStats before = comm::comm_stats();
    metrics::Timer timer(device);
    lab12::ep_forward_backward(*model, global.x, global.y, world, groups);
    adamw.step(session.lr(step));
    const double dt = timer.elapsed();
    if (step > 0 || steps == 1) {  // the first step warms up
      times.push_back(dt * 1e3);
      waits.push_back((comm::wait_seconds() - w0) * 1e3);
    }
    const comm::CommStats did = comm::comm_stats() - before;
    a2a = static_cast<double>(comm::comm_total(did, "", "all_to_all").bytes);
  }
  // the last step's drops: one more forward (no update)
  const int n = world.size(), r = world.rank();
  const data::Batch global = session.sampler().batch(steps);
  const int64_t b = global.x.size(0) / n;
  model->forward(global.x.rows(r * b, (r + 1) * b).to(device),
                 global.y.rows(r * b, (r + 1) * b).to(device));
  for (const nn::BlockActivations& a : model->activations().blocks) dropped += a.moe.dropped;
  model->free_activations();
  Tensor mx = Tensor::from_vector({median(times), median(waits),
                                   static_cast<double>(memory_stats(device).peak) / (1 << 20), a2a},
                                  {4}, DType::f64);
  world.all_reduce(mx, comm::ReduceOp::max);
  Tensor sum = Tensor::from_vector({dropped}, {1}, DType::f64);
  world.all_reduce(sum);
  return {what, mx.item(0), mx.item(1), mx.item(2), sum.item(), mx.item(3) / 1024};
}

// `factors`: parse_sweep_factors's, checked with lab12::check_ep before the device is picked.
ExitCode sweep(train::Session& session, const ModelConfig& config, int ep, int64_t steps,
               const std::vector<double>& factors) {
  std::vector<SweepRow> rows;
  for (const double cf : factors) {
    ModelConfig c = config;
    c.moe.capacity_factor = cf;
    rows.push_back(sweep_run(session, c, ep, steps, fmt::format("MoE, capacity factor {}", cf)));
  }
  // the dense model of the same ACTIVE parameters as top-1: one MLP per block
  ModelConfig dense = config;
  dense.moe = {};
  rows.push_back(sweep_run(session, dense, ep, steps, "dense (top-1's active parameters)"));
  if (session.comm().rank() != 0) return kExitOk;
  log::info("step 5: {} steps each (median after the first), model {} ({} experts, top-{}), ep = "
            "{}, {} ranks; the slowest rank's time and peak memory, the drops of all ranks",
            steps, config.name, config.moe.n_expert, config.moe.top_k, ep, session.comm().size());
  log::info("  comm: time blocked in communication (comm::wait_seconds: the all-to-alls and the "
            "gradients' all-reduces); a2a: the all-to-all KiB one rank sent in a step (the most)");
  log::info("{:<36} {:>9} {:>9} {:>7} {:>10} {:>9} {:>9}", "run", "step ms", "comm ms", "comm %",
            "peak MiB", "dropped", "a2a KiB");
  for (const SweepRow& r : rows)
    log::info("{:<36} {:>9.1f} {:>9.1f} {:>6.0f}% {:>10.1f} {:>9.0f} {:>9.1f}", r.what, r.step_ms,
              r.comm_ms, r.step_ms > 0 ? 100 * r.comm_ms / r.step_ms : 0.0, r.peak_mib, r.dropped,
              r.a2a_kib);
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    train::Session session("lab12_expert_parallel", "Lab 12: expert parallelism",
                           {.model = "small-moe", .batch = 8, .steps = 4});
    session.add_options("lab 12")
        ("ep", "expert-parallel ranks: the experts are split over them (default: every rank)",
         cxxopts::value<int>()->default_value("0"))
        ("top-k", "experts per token, 1 to the model's number of experts (default: the "
                  "model's)",
         cxxopts::value<int64_t>()->default_value("0"))
        ("capacity-factor", "an expert's capacity relative to an even share (default: the "
                            "model's)", cxxopts::value<double>()->default_value("0"))
        ("aux-coef", "the balancing loss's coefficient (default: the model's)",
         cxxopts::value<double>()->default_value("-1"))
        ("twin-steps", "rank 0 also runs the single-device model for this many steps and "
                       "prints both losses (0: off)",
         cxxopts::value<int64_t>()->default_value("2"))
        ("sweep", "step 5: train nothing; time --steps steps at each --sweep-factors capacity "
                  "factor and of the dense model, and print the table")
        ("sweep-factors", "--sweep: capacity factors, comma separated",
         cxxopts::value<std::string>()->default_value("0.5,1,1.25,2"));
    // the device is picked after the ep checks: bad input is refused alike with any --device
    const auto& parsed = session.parse(argc, argv, train::Session::DevicePick::by_lab);
    const auto& run = session.run();
    const auto& opt = session.opt();
    comm::Communicator& world = session.comm();
    const int64_t twin_steps = parsed["twin-steps"].as<int64_t>();
    SCALELAB_REQUIRE(twin_steps >= 0, "--twin-steps must be at least 0, got {}", twin_steps);
    ModelConfig config = session.config();
    MoEConfig& moe = config.moe;
    if (parsed.count("top-k")) moe.top_k = parsed["top-k"].as<int64_t>();
    if (parsed.count("capacity-factor"))
      moe.capacity_factor = parsed["capacity-factor"].as<double>();  // checked by check_ep
    if (parsed.count("aux-coef")) moe.aux_coef = parsed["aux-coef"].as<double>();
    SCALELAB_REQUIRE(moe.aux_coef >= 0, "--aux-coef {}: must be at least 0", moe.aux_coef);
    const bool ep_given = parsed["ep"].as<int>() != 0;
    const int ep = ep_given ? parsed["ep"].as<int>() : world.size();
    // Bad input is refused on every rank alike, before any data is read.
    lab12::check_ep(moe, ep, world.size(), ep_given);
    SCALELAB_REQUIRE(opt.batch % world.size() == 0, "--batch {}: every one of the {} ranks takes "
                     "the same number of rows", opt.batch, world.size());
    const bool do_sweep = parsed["sweep"].as<bool>();
    SCALELAB_REQUIRE(!(do_sweep && session.diverge()),
                     "--sweep and --diverge: choose one (--diverge compares one training step)");
    SCALELAB_REQUIRE(!(do_sweep && parsed.count("capacity-factor")),
                     "--capacity-factor and --sweep: the sweep times each of --sweep-factors "
                     "instead; give one of them");
    SCALELAB_REQUIRE(do_sweep || !parsed.count("sweep-factors"),
                     "--sweep-factors is for --sweep (the capacity factors it times); to train at "
                     "one, give --capacity-factor");
    // every factor of the sweep checked (finite, above 0) before the first run
    std::vector<double> sweep_factors;
    if (do_sweep) sweep_factors = parse_sweep_factors(parsed["sweep-factors"].as<std::string>());
    session.pick_device();
    const Device device = session.device();
    data::Sampler& sampler = session.sampler();
    if (do_sweep) return sweep(session, config, ep, opt.steps, sweep_factors);

    lab12::EpGroups groups = lab12::make_ep_groups(world, ep);
    const nn::GPTOptions base = session.model_options(run.seed);
    nn::GPT model(config, lab12::ep_model_options(base, groups.ep));
    model.set_mappings(lab12::make_ep_mappings(groups.ep));
    optim::AdamW adamw(optim::groups(model.parameters()));
    // --diverge: one step, every tensor compared with the twin's (this rank's rows; its experts'
    // gradients are rows [first, first + E/ep) of the twin's, their Shard says which)
    auto diverge =
        session.watch_divergence(model, {.first_row = world.rank() * (opt.batch / world.size())});
    // the single-device twin routes with one group per rank, as the ranks route their own rows
    nn::GPTOptions twin = base;
    twin.moe.groups = world.size();

    // rank 0's twin: one routing group per rank
    std::optional<train::SingleDeviceTwin> single;
    if (world.rank() == 0 && twin_steps > 0 && !diverge) single.emplace(config, twin);
    // fp32 1e-5 relative (the gradients are summed over ranks in another order), bf16 1e-3.
    train::TwinCheck twin_check(run.precision);
    session.announce(fmt::format(
        "lab 12 expert parallel: model {} ({} experts, top-{}, capacity factor {}, aux {}), ep = "
        "{} ({} experts per rank) x dp {} = {} ranks, global batch {} ({} rows per rank), {} "
        "steps, backend {}", config.name, moe.n_expert, moe.top_k, moe.capacity_factor,
        moe.aux_coef, ep, moe.n_expert / ep, world.size() / ep, world.size(), opt.batch,
        opt.batch / world.size(), opt.steps, world.backend()), /*mfu_note=*/false);
    for (int64_t step = 0; step < opt.steps; ++step) {
      const data::Batch global = sampler.batch(step);
      const double lr = session.lr(step);
      metrics::Timer timer(device);
      const double loss = lab12::ep_forward_backward(model, global.x, global.y, world, groups);
      adamw.step(lr);
      log::info("{}", session.step_line(step, loss, timer.elapsed()));
      if (single && step < twin_steps) {
        const double single_loss = single->step(global, lr);
        log::info("    single-device loss={:.6f}  |ep - single|={:.2e}", single_loss,
                  std::abs(loss - single_loss));
        if (!twin_check.add(loss, single_loss))
          log::info("    the loss against the single-device twin's: {}", twin_check.verdict());
      }
    }
    single.reset();
    if (diverge) {
      diverge->record_gradients(model);  // reduced: what the optimizer applied
      return session.divergence_exit(*diverge, twin, config);
    }

    // One more step, measured: what each rank routed, kept and dropped per expert, and the
    // all-to-all bytes it sent, against the formula for that routing.
    const data::Batch global = sampler.batch(opt.steps);
    const int n = world.size(), r = world.rank();
    const int64_t b = opt.batch / n, E = moe.n_expert, El = E / ep, C = config.n_embd;
    const Tensor xs = global.x.rows(r * b, (r + 1) * b).to(device);
    const Tensor ys = global.y.rows(r * b, (r + 1) * b).to(device);
    model.zero_grad();
    const comm::CommStats before = comm::comm_stats();
    model.forward(xs, ys);
    // per MoE block: this rank's routed (before the capacity) and kept pairs per expert
    std::vector<double> mine;
    int moe_blocks = 0;
    for (const nn::BlockActivations& a : model.activations().blocks) {
      if (!a.moe.ye.defined()) continue;
      ++moe_blocks;
      for (int64_t e = 0; e < E; ++e) mine.push_back(static_cast<double>(a.moe.assigned[e]));
      for (int64_t e = 0; e < E; ++e) mine.push_back(static_cast<double>(a.moe.kept_counts[e]));
    }
    model.backward(1.0 / n);
    const comm::CommStats did = comm::comm_stats() - before;
    const double sent = static_cast<double>(comm::comm_total(did, "", "all_to_all").bytes);
    const int64_t width = static_cast<int64_t>(mine.size()) + 1;
    mine.push_back(sent);
    const Tensor row = Tensor::from_vector(mine, {width}, DType::f64);
    Tensor all = Tensor::empty({n * width}, DType::f64);
    world.all_gather(row, all);
    bool bytes_ok = true;
    std::string bytes_off;  // the ranks whose bytes differ from the formula
    if (r == 0) {
      const std::vector<double> v = all.to_vector();
      log::info("");
      log::info("one step: tokens per expert per rank, each MoE block (routed -> kept; capacity "
                "{} per expert and rank; eN@j: expert N, held by ep index j{})",
                nn::expert_capacity(b * xs.size(1), moe),
                ep == n ? std::string(", world rank j")
                        : fmt::format(" of every ep group: world rank d x {} + j of replica d",
                                      ep));
      for (int blk = 0; blk < moe_blocks; ++blk) {
        log::info("  MoE block #{}:", blk);
        std::string head = fmt::format("  {:>5}", "rank");
        for (int64_t e = 0; e < E; ++e)
          head += fmt::format(" {:>11}", fmt::format("e{}@{}", e, e / El));
        log::info("{} {:>8}", head, "dropped");
        for (int k = 0; k < n; ++k) {
          const double* p = &v[k * width + blk * 2 * E];
          std::string line = fmt::format("  {:>5}", k);
          double dropped = 0;
          for (int64_t e = 0; e < E; ++e) {
            line += fmt::format(" {:>11}", fmt::format("{:.0f}->{:.0f}", p[e], p[E + e]));
            dropped += p[e] - p[E + e];
          }
          log::info("{} {:>8.0f}", line, dropped);
        }
      }
      // The formula, per MoE block and rank k: the counts (E i32) once, then its M kept rows
      // out and the R rows its experts got back, forward and backward: 4 E + 2 (M + R) C es.
      const double es = static_cast<double>(dtype_size(model.compute_dtype()));
      const auto kept = [&](int k, int blk, int64_t e) {
        return v[k * width + blk * 2 * E + E + e];
      };
      log::info("all-to-all bytes sent per rank (byte counters) against the formula for this "
                "routing: per MoE block 4 E (the counts) + 2 (M + R) C x {} bytes (tokens out "
                "and back, forward and backward; M: the rank's kept pairs, R: the pairs its "
                "experts got from its ep group)", static_cast<int>(es));
      for (int k = 0; k < n; ++k) {
        double want = 0;
        for (int blk = 0; blk < moe_blocks; ++blk) {
          double M = 0, R = 0;
          for (int64_t e = 0; e < E; ++e) M += kept(k, blk, e);
          const int first = k / ep * ep;  // k's ep group: ranks [first, first + ep)
          for (int s = first; s < first + ep; ++s)
            for (int64_t e = (k % ep) * El; e < (k % ep + 1) * El; ++e) R += kept(s, blk, e);
          want += 4.0 * E + 2 * (M + R) * C * es;
        }
        const double got = v[k * width + width - 1];
        bytes_ok = bytes_ok && got == want;
        log::info("  rank {}: {:.0f} bytes, formula {:.0f}{}", k, got, want,
                  got == want ? "" : "  (DIFFERENT)");
        if (got != want) bytes_off += fmt::format("{}{}", bytes_off.empty() ? "" : ", ", k);
      }
    }
    const bool ok = train::on_every_rank(twin_check.ok && bytes_ok, world);
    // rank 0 knows both verdicts (its twin, the gathered bytes): one last line says which failed
    if (!ok && r == 0) {
      std::string failed;
      if (!twin_check.ok)
        failed = fmt::format("the loss left the single-device twin's ({})", twin_check.verdict());
      if (!bytes_ok)
        failed += fmt::format("{}the all-to-all bytes of rank(s) {} differ from the formula: "
                              "step 3's exchange sent more or less than the counts once per MoE "
                              "block and the rows out and back in forward and backward",
                              failed.empty() ? "" : "; ", bytes_off);
      log::info("FAILED: {}", failed);
    }
    return ok ? kExitOk : kExitFailed;
  });
}
