// Lab 11 driver (not edited by attendees): trains a GPT at a long context with the sequence cut
// over every rank (context parallelism, --cp = the number of ranks), attention by the ring
// (steps 2-3) or by all-to-all (--attention all-to-all, step 4). Rank 0 also runs the
// single-device twin (same seed, same global batches, the whole sequence on one device) for the
// first --twin-steps steps and prints both losses. Then one measured step: the bytes each rank
// sent for attention and the activations it held, beside the formulas, and the causal work of
// every rank under the zig-zag split beside the contiguous one. With --overlap it trains nothing
// and measures instead how much of the ring's communication its blocks' compute hides.
//
//   ./scalelab run 11 -n 4 -- --cp 4                        # your code on 4 ranks
//   ./scalelab run 11 --solution -n 4 -- --cp 4 --attention all-to-all
//   ./scalelab run 11 --solution -n 4 -- --cp 4 --overlap   # the overlap table
//   ./scalelab run 11 --solution -n 4 -- --cp 4 --trace cp.json   # Perfetto: blocks vs messages
#include <algorithm>
#include <cmath>
#include <optional>

#include "common/allocator.hpp"
#include "common/comm/communicator.hpp"
#include "common/comm/stats.hpp"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/data/sampler.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/session.hpp"
#include "common/train/sizing.hpp"
#include "common/trace.hpp"
#include "common/train/twin.hpp"
#include "context_parallel.hpp"

using namespace scalelab;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
std::string mib(double bytes) { return fmt::format("{:.3f}", bytes / kMiB); }

// ---- --overlap: how much of the ring's communication the blocks' compute hides -----------------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The ring's transfers with no compute: `per_step` block-sized messages round the ring at each
// of cp-1 steps (each: recv from r-1 and send to r+1 posted as one batch, as the ring does, both
// waited), then `last_hops` more (the backward's dK/dV home). Milliseconds.
double transfers_alone_ms(comm::Communicator& cp, const Tensor& block, int per_step, int last_hops) {
  const int n = cp.size(), r = cp.rank();
  Tensor in = Tensor::empty(block.shape(), block.dtype(), block.device());
  cp.barrier();
  const double t0 = trace::now_us();
  const int messages = (n - 1) * per_step + (n > 1 ? last_hops : 0);
  for (int m = 0; m < messages; ++m) {
    std::vector<comm::Work> step = cp.send_recv_async(
        {comm::P2POp::recv(in, (r - 1 + n) % n, m % 2), comm::P2POp::send(block, (r + 1) % n, m % 2)});
    comm::wait_all(step);
  }
  device_synchronize(block.device());
  return (trace::now_us() - t0) / 1e3;
}

// One pass (forward or backward) timed: wall time and the time this rank was blocked in waits.
struct Timed {
  double total_ms = 0, waited_ms = 0;
};
template <class F>
Timed timed(comm::Communicator& cp, const Device& device, F&& pass) {
  cp.barrier();
  const double w0 = comm::wait_seconds(), t0 = trace::now_us();
  pass();
  device_synchronize(device);
  return {(trace::now_us() - t0) / 1e3, (comm::wait_seconds() - w0) * 1e3};
}

// Per pass (forward, backward) and mode (overlapped, no overlap): the medians of total, compute
// (total - waiting) and exposed (waiting) ms; per pass the same transfers alone.
struct OverlapRow {
  double total, compute, exposed;
};

ExitCode measure_overlap(comm::Communicator& cp, const ModelConfig& config, int64_t B, int64_t T,
                    DType dtype, const Device& device, int reps) {
  const int n = cp.size(), r = cp.rank();
  const int64_t NH = config.n_head, hs = config.n_embd / config.n_head, c = T / (2 * n);
  const int64_t BH = B * NH;
  // One layer's attention at the run's shape, in the ring's chunk-major layout.
  const Tensor q = Tensor::uniform({2, BH, c, hs}, 11 + r, dtype, device);
  const Tensor kv = Tensor::uniform({2, 2, BH, c, hs}, 23 + r, dtype, device);
  const Tensor dy = Tensor::uniform({2, BH, c, hs}, 37 + r, dtype, device);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Tensor y = Tensor::empty(q.shape(), dtype, device), lse;
  Tensor dq = Tensor::empty(q.shape(), dtype, device), dkv = Tensor::empty(kv.shape(), dtype, device);
  std::vector<double> samples[2][2][2];  // [pass][mode: 0 overlapped, 1 none][total, waited]
  std::vector<double> alone[2];
  for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up
    for (int mode = 0; mode < 2; ++mode) {  // interleaved, so drift hits both alike
      comm::set_overlap(mode == 0);
      const Timed f = timed(cp, device, [&] { lse = lab11::ring_attention_forward(y, q, kv, scale, cp); });
      const Timed b = timed(cp, device, [&] {
        lab11::ring_attention_backward(dq, dkv, dy, q, kv, y, lse, scale, cp);
      });
      comm::set_overlap(true);
      if (rep < 0) continue;
      for (const auto& [pass, t] : {std::pair{0, f}, {1, b}}) {
        samples[pass][mode][0].push_back(t.total_ms);
        samples[pass][mode][1].push_back(t.waited_ms);
      }
    }
    const double fa = transfers_alone_ms(cp, kv, 1, 0), ba = transfers_alone_ms(cp, kv, 2, 1);
    if (rep < 0) continue;
    alone[0].push_back(fa);
    alone[1].push_back(ba);
  }
  // Every rank's medians to rank 0: per pass, per mode: total, waited; per pass: alone.
  std::vector<double> mine;
  for (int pass = 0; pass < 2; ++pass) {
    for (int mode = 0; mode < 2; ++mode)
      for (int k = 0; k < 2; ++k) mine.push_back(median(samples[pass][mode][k]));
    mine.push_back(median(alone[pass]));
  }
  const int64_t width = static_cast<int64_t>(mine.size());
  const Tensor row = Tensor::from_vector(mine, {width}, DType::f64);
  Tensor all = Tensor::empty({n * width}, DType::f64);
  cp.all_gather(row, all);
  if (r != 0) return kExitOk;
  const std::vector<double> v = all.to_vector();
  log::info("ring attention overlap: one layer's attention of model {}, B {} x {} heads, T {} "
            "(T/cp = {} rows per rank, chunks of {}), head size {}, {}; K/V block {} KiB; median "
            "of {} reps, ms", config.name, B, NH, T, T / n, c, hs, dtype_name(dtype),
            kv.nbytes() / 1024, reps);
  log::info("  exposed: time blocked in waits (comm::wait_seconds); compute: total - exposed; "
            "alone: the same messages round the ring with no compute; hidden = 1 - exposed / alone");
  log::info("  no overlap: the same ring, each transfer waited for before the next block computes "
            "(comm::set_overlap(false))");
  log::info("  on one host's CPU, 'no overlap' can hide as much as 'overlapped' or more: the "
            "transfers are cheap shared-memory copies, a wait also holds a neighbour's lateness, "
            "and MPI's progress thread polls while a receive is pending, taking cycles from the "
            "compute (README, Overlap)");
  log::info("{:>5} {:<9} {:<11} {:>9} {:>9} {:>9} {:>9} {:>7}", "rank", "pass", "mode", "total",
            "compute", "exposed", "alone", "hidden");
  const auto print = [&](const std::string& who, int k, int pass, int mode) {
    const double* p = &v[k * width + pass * 5];
    const double total = p[mode * 2], waited = p[mode * 2 + 1], solo = p[4];
    const double hidden = solo > 0 ? std::clamp(1 - waited / solo, 0.0, 1.0) : 0.0;
    log::info("{:>5} {:<9} {:<11} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>6.0f}%", who,
              pass == 0 ? "forward" : "backward", mode == 0 ? "overlapped" : "no overlap", total,
              total - waited, waited, solo, 100 * hidden);
  };
  for (int k = 0; k < n; ++k)
    for (int pass = 0; pass < 2; ++pass)
      for (int mode = 0; mode < 2; ++mode) print(std::to_string(k), k, pass, mode);
  // A rank's waits also hold its neighbours' lateness (their compute, or no core to run on):
  // imbalance, not communication. The rank that waits least bounds what is left (as lab 04).
  log::info("the rank that waits least (its waits are the least imbalance):");
  for (int pass = 0; pass < 2; ++pass)
    for (int mode = 0; mode < 2; ++mode) {
      int least = 0;
      for (int k = 1; k < n; ++k)
        if (v[k * width + pass * 5 + mode * 2 + 1] < v[least * width + pass * 5 + mode * 2 + 1])
          least = k;
      print(fmt::format("min {}", least), least, pass, mode);
    }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    train::Session session("lab11_context_parallel", "Lab 11: context parallelism",
                           {.batch = 2, .steps = 4});
    session.add_options("lab 11")
        ("cp", "context-parallel ranks: the sequence is cut over them (default: every rank)",
         cxxopts::value<int>())
        ("attention", "ring (steps 2-3) or all-to-all (step 4)",
         cxxopts::value<std::string>()->default_value("ring"))
        ("context", "tokens per sequence (default: 4 x the model's block size)",
         cxxopts::value<int64_t>())
        ("twin-steps", "rank 0 also runs the single-device model for this many steps and "
                       "prints both losses (0: off)",
         cxxopts::value<int64_t>()->default_value("2"))
        ("overlap", "train nothing: measure the ring's overlap (forward and backward of one "
                    "layer's attention, overlapped and not, and the transfers alone), per rank")
        ("reps", "--overlap: measured repetitions (the median is printed)",
         cxxopts::value<int>()->default_value("20"));
    // the device is picked after the cp checks: bad input is refused alike with any --device
    const auto& parsed = session.parse(argc, argv, train::Session::DevicePick::by_lab);
    const auto& run = session.run();
    const auto& opt = session.opt();
    comm::Communicator& comm = session.comm();
    const lab11::Attention attention = lab11::parse_attention(parsed["attention"].as<std::string>());
    const int64_t twin_steps = parsed["twin-steps"].as<int64_t>();
    SCALELAB_REQUIRE(twin_steps >= 0, "--twin-steps must be at least 0, got {}", twin_steps);
    // --reps was read by --overlap only (--reps 0 trained): its range always, and only there
    const int reps = parsed["reps"].as<int>();
    SCALELAB_REQUIRE(reps >= 1, "--reps must be at least 1, got {}", reps);
    SCALELAB_REQUIRE(parsed["overlap"].as<bool>() || !parsed.count("reps"),
                     "--reps is for --overlap (this run trains)");

    // --cp 0 and --context 0 mean their defaults too, as before (no cxxopts default: its
    // "(default: 0)" would sit beside the help's own)
    const int cp_arg = parsed.count("cp") ? parsed["cp"].as<int>() : 0;
    const int cp = cp_arg == 0 ? comm.size() : cp_arg;
    const int64_t block_size = session.config().block_size;  // the model's own context
    const int64_t context_arg = parsed.count("context") ? parsed["context"].as<int64_t>() : 0;
    const int64_t T = context_arg == 0 ? 4 * block_size : context_arg;
    SCALELAB_REQUIRE(T >= 1, "--context must be at least 1, got {}", T);
    // Bad input is refused on every rank alike, before any data is read.
    lab11::check_cp(cp, comm.size(), T, session.config().n_head, attention);
    session.set_context(T);  // the position table, the sampler's rows and the FLOPs: T tokens
    const ModelConfig& config = session.config();
    session.pick_device();
    const Device device = session.device();
    if (parsed["overlap"].as<bool>()) {
      SCALELAB_REQUIRE(attention == lab11::Attention::ring,
                       "--overlap measures the ring: drop --attention {}",
                       lab11::attention_name(attention));
      return measure_overlap(comm, config, opt.batch, T, run.precision, device, reps);
    }
    // Training (--overlap times attention alone): an MoE block routes each rank's zig-zag rows
    // as their own group (capacity, balancing loss), the single-device twin whole sequences:
    // their losses part (exit 1 on the twin check).
    session.require_dense("lab 11's context parallelism trains dense blocks only");
    // Sized before anything is allocated: a rank's forward holds B rows of T/cp tokens (rank 0's
    // twin B rows of T), fused attention keeps no (T, T) probabilities. On a GPU the
    // activations are the GPU's, and only the batch is host memory. Too large: a usage error on
    // every rank.
    ModelConfig rows_config = config;
    rows_config.block_size = comm.rank() == 0 && twin_steps > 0 ? T : T / cp;
    const auto step_bytes = [&](int64_t batch) {
      return train::step_bytes_at_least(rows_config,
                                        {.global_batch = batch,
                                         .rows = device.in_host_memory() ? batch : 0,
                                         .layers = config.n_layer,
                                         .attention_probabilities = false},
                                        run.precision);
    };
    // a step that cannot hold even one sequence is --context's to shrink, not --batch's
    train::require_host_memory(step_bytes(1),
                               parsed.count("context") ? fmt::format("--context {}", T)
                                                       : fmt::format("--context (the default, {} "
                                                                     "tokens: 4 x the model's)", T),
                               "a training step of one sequence");
    train::require_host_memory(step_bytes(opt.batch), fmt::format("--batch {}", opt.batch),
                               "a training step");
    data::Sampler& sampler = session.sampler();

    // Every rank holds the whole model (its weights are replicated, like DDP's) and T/cp rows
    // of every sequence of the batch; the fused attention core is the lab's.
    nn::GPTOptions model_options = session.model_options(run.seed);
    model_options.flash_attention = true;
    nn::GPT model(config, model_options);
    const std::vector<int64_t> positions = lab11::zigzag_positions(T, cp, comm.rank());
    model.set_mappings(lab11::make_cp_mappings(comm, positions, attention, config.n_head));
    optim::AdamW adamw(optim::groups(model.parameters()));
    const auto shard = [&](const Tensor& t) { return lab11::shard_sequence(t, cp, comm.rank()); };
    // --diverge: one step, every tensor of this rank's positions compared with the twin's
    auto diverge = session.watch_divergence(model, {.positions = positions});

    std::optional<train::SingleDeviceTwin> single;  // rank 0's twin: the whole sequence
    if (comm.rank() == 0 && twin_steps > 0) single.emplace(config, model_options);
    // fp32 1e-5 relative (attention's sums merge blocks in another order, the gradients are
    // all-reduced), bf16 1e-3 (every activation rounds to 8 bits), as labs 07-10.
    train::TwinCheck twin_check(run.precision);
    session.announce(fmt::format(
        "lab 11 context parallel: model {} at T = {} ({} x its block size), {} attention, cp = {} "
        "ranks of {} rows (chunks {} and {} of {} on rank 0), global batch {}, {} steps, backend "
        "{}", config.name, T, T / block_size, lab11::attention_name(attention), cp, T / cp, 0,
        2 * cp - 1, 2 * cp, opt.batch, opt.steps, comm.backend()), /*mfu_note=*/false);
    std::size_t single_acts = 0;
    for (int64_t step = 0; step < opt.steps; ++step) {
      const data::Batch global = sampler.batch(step);
      const double lr = session.lr(step);
      metrics::Timer timer(device);
      const double loss = lab11::cp_forward_backward(model, global.x, global.y, comm, shard);
      adamw.step(lr);
      log::info("{}", session.step_line(step, loss, timer.elapsed()));
      if (single && step < twin_steps) {
        const double single_loss = single->step(global, lr);
        if (step == 0) single_acts = single->activation_bytes();
        log::info("    single-device loss={:.6f}  |cp - single|={:.2e}", single_loss,
                  std::abs(loss - single_loss));
        if (!twin_check.add(loss, single_loss))
          log::info("    the loss against the single-device twin's: {}", twin_check.verdict());
      }
    }
    single.reset();
    if (diverge) {
      diverge->record_gradients(model);  // averaged over the cp ranks
      return session.divergence_exit(*diverge, model_options);  // fused: log-sum-exps compared
    }

    // One more step, measured: the attention traffic (sends for the ring, all-to-alls for
    // Ulysses) and the activations this rank holds after its forward.
    const data::Batch global = sampler.batch(opt.steps);
    const Tensor xs = shard(global.x).to(device), ys = shard(global.y).to(device);
    model.zero_grad();
    const comm::CommStats before = comm::comm_stats();
    model.forward(xs, ys);
    const std::size_t acts = model.activation_bytes();
    model.backward(1.0 / cp);
    const comm::CommStats did = comm::comm_stats() - before;
    const double sent = static_cast<double>(
        comm::comm_total(did, "", attention == lab11::Attention::ring ? "send" : "all_to_all").bytes);
    const int64_t B = opt.batch, C = config.n_embd, L = config.n_layer;
    const double es = static_cast<double>(dtype_size(model.compute_dtype()));
    const double rows = static_cast<double>(B * T / cp) * C * es;  // B (T/cp) C: one tensor of my rows
    const double kv = 2 * rows;                                     // my K and V: one ring block
    // ring: (cp-1) blocks forward, (cp-1) again and cp dK/dV blocks backward, per layer; at
    // cp = 1 none (a ring of one rank sends nothing: its dK/dV are home already);
    // all-to-all: q, k, v in and y out forward, dy in and dq, dk, dv out backward, per layer.
    const double ring_blocks = cp == 1 ? 0.0 : 3.0 * cp - 2;
    const double ring_formula = L * ring_blocks * kv, a2a_formula = L * 8.0 * rows;
    const double formula = attention == lab11::Attention::ring ? ring_formula : a2a_formula;
    if (comm.rank() == 0) {
      log::info("");
      log::info("one step, rank 0 (payload bytes, byte counters; B {} x T/cp {} rows x C {}, "
                "{}-byte activations):", B, T / cp, C, static_cast<int>(es));
      log::info("  attention sent ({}): {} MiB; formula {} MiB  [ring: L (3cp-2) x 2 B (T/cp) C, "
                "0 at cp 1, = {} MiB; all-to-all: L x 8 B (T/cp) C = {} MiB]",
                lab11::attention_name(attention),
                mib(sent), mib(formula), mib(ring_formula), mib(a2a_formula));
      // Every activation is per row, so a rank holds 1/cp of the single device's; all-to-all
      // also keeps its heads' q, k, v and y over the whole sequence: 4 B (T/cp) C per layer.
      const double extra = attention == lab11::Attention::ring ? 0 : L * 4.0 * rows;
      log::info("  activations after forward: {} MiB{}", mib(static_cast<double>(acts)),
                single_acts ? fmt::format("; formula: single device {} MiB / cp{} = {} MiB",
                                          mib(static_cast<double>(single_acts)),
                                          extra > 0 ? " + L x 4 B (T/cp) C" : "",
                                          mib(static_cast<double>(single_acts) / cp + extra))
                            : std::string(" (the formula needs --twin-steps)"));
      log::info("");
      log::info("causal work per rank: score blocks of c x c, c = T/(2cp) = {} (single device: "
                "{} blocks)", T / (2 * cp), cp * (2 * cp + 1));
      log::info("{:>5} {:>8} {:>11}", "rank", "zig-zag", "contiguous");
      int64_t zmin = INT64_MAX, zmax = 0, cmin = INT64_MAX, cmax = 0;
      for (int r = 0; r < cp; ++r) {
        const int64_t z = lab11::causal_blocks(lab11::zigzag_positions(T, cp, r), T, cp);
        const int64_t c = lab11::causal_blocks(lab11::contiguous_positions(T, cp, r), T, cp);
        zmin = std::min(zmin, z), zmax = std::max(zmax, z), cmin = std::min(cmin, c),
        cmax = std::max(cmax, c);
        log::info("{:>5} {:>8} {:>11}", r, z, c);
      }
      log::info("{:>5} {:>8.2f} {:>11.2f}", "max/min", static_cast<double>(zmax) / zmin,
                static_cast<double>(cmax) / cmin);
    }
    return train::on_every_rank(twin_check.ok, comm) ? kExitOk : kExitFailed;
  });
}
