// Lab 03 driver (not edited by attendees): trains a GPT with DDP on every rank and shows that
// the replicas stay identical and follow the single-device run.
//
//   ./scalelab run 03 -n 4                          # your code on 4 ranks
//   ./scalelab run 03 --solution -n 4 -- --steps 50 # the reference, longer
#include <optional>

#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/log.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/train/session.hpp"
#include "common/train/twin.hpp"
#include "ddp.hpp"

using namespace scalelab;

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    train::Session session("lab03_ddp", "Lab 03: data-parallel training (DDP)", {.steps = 50});
    session.add_options("lab 03")
        ("verify-steps", "rank 0 also runs the single-device model for this many steps and "
                         "prints both losses (0: off)",
         cxxopts::value<int64_t>()->default_value("3"));
    const auto& parsed = session.parse(argc, argv);
    const int64_t verify_steps = parsed["verify-steps"].as<int64_t>();
    SCALELAB_REQUIRE(verify_steps >= 0, "--verify-steps must not be negative");
    const auto& run = session.run();
    const auto& opt = session.opt();
    const ModelConfig& config = session.config();
    comm::Communicator& comm = session.comm();
    session.require_dense(lab03::kDenseOnly);
    // A rank's share of the batch through the whole model; the whole batch on rank 0 when it
    // runs the single-device twin, and on every rank with --diverge (the twin of step 0).
    const bool whole = session.diverge() || (comm.rank() == 0 && verify_steps > 0);
    session.require_step_memory(whole ? opt.batch : opt.batch / comm.size());
    // A bad split (more ranks than rows) is a usage error on every rank, before any training.
    const int64_t local_rows = lab03::local_batch(session.sampler().batch(0), comm.rank(), comm.size())
                                   .batch_size();

    // Each rank starts from its own seed: only the broadcast makes them one model.
    nn::GPT model(config, session.model_options(run.seed + comm.rank()));
    lab03::broadcast_parameters(model, comm);
    model.params().refresh_compute();  // bf16: the broadcast replaced the fp32 master weights
    optim::AdamW adamw(optim::groups(model.parameters()));
    // --diverge: one step, every tensor compared with the single-device twin's rows
    auto diverge = session.watch_divergence(model, {.first_row = comm.rank() * local_rows});

    std::optional<train::SingleDeviceTwin> single;  // rank 0's twin, for --verify-steps
    if (comm.rank() == 0 && verify_steps > 0)  // in the run's precision too
      single.emplace(config, session.model_options(run.seed));

    session.announce(fmt::format(
        "lab 03 ddp: model {} ({} parameters), {} rank{}, global batch {} x {} tokens = {} rows "
        "per rank, {} steps, backend {}", config.name,
        metrics::human_count(static_cast<double>(model.num_parameters())), comm.size(),
        comm.size() == 1 ? "" : "s", opt.batch, config.block_size, local_rows, opt.steps,
        comm.backend()));

    for (int64_t step = 0; step < opt.steps; ++step) {
      const data::Batch global = session.sampler().batch(step);
      const double lr = session.lr(step);
      metrics::Timer timer(session.device());
      const double loss = lab03::forward_backward(model, global, comm);
      adamw.step(lr);
      const double dt = timer.elapsed();
      log::info("{}", session.step_line(step, loss, dt));
      if (single && step < verify_steps) {
        const double single_loss = single->step(global, lr);
        log::info("    single-device loss={:.6f}  |ddp - single|={:.2e}", single_loss,
                  std::abs(loss - single_loss));
      }
    }
    if (diverge) {
      diverge->record_gradients(model);  // all-reduced: what the optimizer applied
      return session.divergence_exit(*diverge, session.model_options(run.seed));
    }
    const double divergence = lab03::parameter_divergence(model, comm);
    log::info("after {} steps: max |p - p on rank 0| over {} rank{} = {:.3g} ({})", opt.steps,
              comm.size(), comm.size() == 1 ? "" : "s", divergence,
              divergence == 0 ? "identical replicas" : "REPLICAS DIFFER");
    return divergence == 0 ? kExitOk : kExitFailed;
  });
}
