// Lab 11 driver (not edited by attendees): trains a GPT at a long context with the sequence cut
// over every rank (context parallelism, --cp = the number of ranks), attention by the ring
// (steps 2-3) or by all-to-all (--attention all-to-all, step 4). Rank 0 also runs the
// single-device twin (same seed, same global batches, the whole sequence on one device) for the
// first --twin-steps steps and prints both losses. Then one measured step: the bytes each rank
// sent for attention and the activations it held, beside the formulas, and the causal work of
// every rank under the zig-zag split beside the contiguous one.
//
//   ./scalelab run 11 -n 4 -- --cp 4                        # your code on 4 ranks
//   ./scalelab run 11 --solution -n 4 -- --cp 4 --attention all-to-all
#include <algorithm>
#include <memory>

#include "common/allocator.hpp"
#include "common/cli.hpp"
#include "common/comm/stats.hpp"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/data/sampler.hpp"
#include "common/train/loop.hpp"
#include "common/train/sizing.hpp"
#include "context_parallel.hpp"

using namespace scalelab;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
std::string mib(double bytes) { return fmt::format("{:.3f}", bytes / kMiB); }

}  // namespace

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    auto options = cli::make_options("lab11_context_parallel", "Lab 11: context parallelism");
    cli::add_run_options(options, /*mixed_precision=*/true);
    train::add_train_options(options, {.batch = 2, .steps = 4});
    options.add_options("lab 11")
        ("cp", "context-parallel ranks: the sequence is cut over them (default: every rank)",
         cxxopts::value<int>()->default_value("0"))
        ("attention", "ring (steps 2-3) or all-to-all (step 4)",
         cxxopts::value<std::string>()->default_value("ring"))
        ("context", "tokens per sequence (default: 4 x the model's block size)",
         cxxopts::value<int64_t>()->default_value("0"))
        ("twin-steps", "rank 0 also runs the single-device model for this many steps and "
                       "prints both losses (0: off)",
         cxxopts::value<int64_t>()->default_value("2"));
    const auto parsed = cli::parse(options, argc, argv);
    const auto run = cli::run_options(parsed);
    const auto opt = train::read_train_options(parsed);
    const lab11::Attention attention = lab11::parse_attention(parsed["attention"].as<std::string>());
    const int64_t twin_steps = parsed["twin-steps"].as<int64_t>();
    SCALELAB_REQUIRE(twin_steps >= 0, "--twin-steps must be at least 0, got {}", twin_steps);

    auto comm = comm::Communicator::world(run.backend);
    const int cp = parsed["cp"].as<int>() == 0 ? comm.size() : parsed["cp"].as<int>();
    ModelConfig config = model_config(opt.model);
    const int64_t T = parsed["context"].as<int64_t>() == 0 ? 4 * config.block_size
                                                           : parsed["context"].as<int64_t>();
    SCALELAB_REQUIRE(T >= 1, "--context must be at least 1, got {}", T);
    // Bad input is refused on every rank alike, before any data is read.
    lab11::check_cp(cp, comm.size(), T, config.n_head, attention);
    config.block_size = T;  // the position table covers the long context
    const Device device = train::rank_device(run.device);
    // Sized before anything is allocated: a rank's forward holds B rows of T/cp tokens (rank 0's
    // twin B rows of T), fused attention keeps no (T, T) probabilities. On a GPU the
    // activations are the GPU's, and only the batch is host memory. Too large: a usage error on
    // every rank.
    ModelConfig rows_config = config;
    rows_config.block_size = comm.rank() == 0 && twin_steps > 0 ? T : T / cp;
    train::require_host_memory(
        train::step_bytes_at_least(rows_config,
                                   {.global_batch = opt.batch,
                                    .rows = device.is_cpu() ? opt.batch : 0,
                                    .layers = config.n_layer,
                                    .attention_probabilities = false},
                                   run.precision),
        fmt::format("--batch {}", opt.batch), "a training step");
    const auto tokens = train::load_train_tokens(opt);
    data::Sampler sampler(tokens, opt.batch, T, run.seed);

    // Every rank holds the whole model (its weights are replicated, like DDP's) and T/cp rows
    // of every sequence of the batch; the fused attention core is the lab's.
    const nn::GPTOptions model_options{.device = device, .seed = run.seed,
                                       .compute_dtype = run.precision, .flash_attention = true};
    nn::GPT model(config, model_options);
    const std::vector<int64_t> positions = lab11::zigzag_positions(T, cp, comm.rank());
    model.set_mappings(lab11::make_cp_mappings(comm, positions, attention, config.n_head));
    optim::AdamW adamw(optim::groups(model.parameters()));
    const auto shard = [&](const Tensor& t) { return lab11::shard_sequence(t, cp, comm.rank()); };

    std::unique_ptr<nn::GPT> single;  // rank 0's single-device twin: the whole sequence
    std::unique_ptr<optim::AdamW> single_opt;
    if (comm.rank() == 0 && twin_steps > 0) {
      single = std::make_unique<nn::GPT>(config, model_options);
      single_opt = std::make_unique<optim::AdamW>(optim::groups(single->parameters()));
    }
    // fp32 1e-5 relative (attention's sums merge blocks in another order, the gradients are
    // all-reduced), bf16 1e-3 (every activation rounds to 8 bits), as labs 07-10.
    train::TwinCheck twin_check(run.precision);
    log::info("lab 11 context parallel: model {} at T = {} ({} x its block size), {} attention, "
              "cp = {} ranks of {} rows (chunks {} and {} of {} on rank 0), global batch {}, {} "
              "steps, backend {}", config.name, T, T / model_config(opt.model).block_size,
              lab11::attention_name(attention), cp, T / cp, 0, 2 * cp - 1, 2 * cp, opt.batch,
              opt.steps, comm.backend());
    train::StepReporter reporter(config, opt.batch * T, device, opt.peak_tflops, comm,
                                 run.precision);
    log::info("{}", train::precision_note(run.precision));
    std::size_t single_acts = 0;
    for (int64_t step = 0; step < opt.steps; ++step) {
      const data::Batch global = sampler.batch(step);
      const double lr = train::learning_rate(opt, step);
      metrics::Timer timer(device);
      const double loss = lab11::cp_forward_backward(model, global.x, global.y, comm, shard);
      adamw.step(lr);
      log::info("{}", reporter.line(step, loss, timer.elapsed(), lr));
      if (single && step < twin_steps) {
        single->zero_grad();
        const data::Batch g = global.to(device);
        const double single_loss = single->forward(g.x, g.y);
        if (step == 0) single_acts = single->activation_bytes();
        single->backward();
        single_opt->step(lr);
        log::info("    single-device loss={:.6f}  |cp - single|={:.2e}", single_loss,
                  std::abs(loss - single_loss));
        if (!twin_check.add(loss, single_loss))
          log::info("    the loss against the single-device twin's: {}", twin_check.verdict());
      }
    }
    single.reset();
    single_opt.reset();

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
    // ring: (cp-1) blocks forward, (cp-1) again and cp dK/dV blocks backward, per layer;
    // all-to-all: q, k, v in and y out forward, dy in and dq, dk, dv out backward, per layer.
    const double formula = attention == lab11::Attention::ring ? L * (3.0 * cp - 2) * kv
                                                               : L * 8.0 * rows;
    const double ring_formula = L * (3.0 * cp - 2) * kv, a2a_formula = L * 8.0 * rows;
    if (comm.rank() == 0) {
      log::info("");
      log::info("one step, rank 0 (payload bytes, byte counters; B {} x T/cp {} rows x C {}, "
                "{}-byte activations):", B, T / cp, C, static_cast<int>(es));
      log::info("  attention sent ({}): {} MiB; formula {} MiB  [ring: L (3cp-2) x 2 B (T/cp) C "
                "= {} MiB; all-to-all: L x 8 B (T/cp) C = {} MiB]", lab11::attention_name(attention),
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
