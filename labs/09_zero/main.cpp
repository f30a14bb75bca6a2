// Lab 09 driver (not edited by attendees): trains a GPT with ZeRO stage --stage (rank 0 also runs
// the single-device twin for the first steps and prints both losses), prints a validation loss
// (every stage, ZeRO-3 too: the model's evaluation runs its unit hooks), then measures every stage
// 0-3 at n = 1, 2, 4 ranks (the ranks that divide the world): what a rank holds between steps by
// kind and in the allocator, the peak of a step, the bytes one step communicates, beside the
// formulas of the ZeRO paper. --precision bf16: mixed precision (stage 3 gathers the 2-byte
// weights, as the paper), and the table adds the paper's own mixed-precision formula beside this
// library's layout.
//
//   ./scalelab run 09 -n 4 -- --stage 2              # your code on 4 ranks
//   ./scalelab run 09 --solution -n 4 -- --stage 3   # the reference
//   ./scalelab run 09 --solution -n 4 -- --stage 3 --precision bf16
#include <optional>

#include "common/allocator.hpp"
#include "common/cli.hpp"
#include "common/comm/stats.hpp"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/session.hpp"
#include "common/train/twin.hpp"
#include "ddp.hpp"
#include "zero.hpp"

using namespace scalelab;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

struct Row {
  int stage = 0, n = 1;
  lab09::Held held, ours, paper;  // measured; this library's layout; the paper's formula
  std::size_t allocator = 0, peak = 0, comm = 0, paper_comm = 0;
  bool formulas = true;  // false while step 5 (optional) is not written: no formula columns
};

// One (stage, n) cell: the world is cut into groups of n ranks that each train on their own; the
// figures are rank 0's. Held memory is measured after one step (AdamW's state exists, the
// activations are gone), the peak and the traffic over the second step.
Row measure(int stage, int n, comm::Communicator& world, const ModelConfig& config,
            const data::Sampler& sampler, const cli::RunOptions& run, Device device, double lr) {
  comm::Communicator group =
      world.split(world.rank() / n, world.rank(), fmt::format("n{}.{}", n, world.rank() / n));
  Row row{stage, n};
  group.barrier();  // the communicator keeps its last operation's tensors until the next one
  const std::size_t base = memory_stats(device).current;
  {
    auto t = lab09::make_trainer(
        stage, config, {.device = device, .seed = run.seed, .compute_dtype = run.precision}, group);
    t->forward_backward(sampler.batch(0));
    t->step(lr);
    // The communicator keeps its last operation's tensors (the all-gather's input) until its next
    // one: a barrier (no tensors) lets them go, so the allocator shows what the trainer holds.
    group.barrier();
    row.held = t->held();
    row.allocator = memory_stats(device).current - base;
    reset_peak_memory(device);
    const comm::CommStats before = comm::comm_stats();
    t->forward_backward(sampler.batch(1));
    t->step(lr);
    row.comm = static_cast<std::size_t>(comm::comm_total(comm::comm_stats() - before).bytes);
    row.peak = memory_stats(device).peak - base;
    const int64_t psi = t->model().num_parameters();
    try {  // the same on every rank: no collective in between
      row.ours = lab09::layout_memory(stage, psi, n, run.precision);
      row.paper = lab09::paper_memory(stage, psi, n, run.precision);
      row.paper_comm = lab09::paper_comm_bytes(stage, psi, run.precision);
    } catch (const NotImplemented&) {
      row.formulas = false;
    }
  }
  world.barrier();
  return row;
}

std::string mib(std::size_t bytes) { return fmt::format("{:.3f}", static_cast<double>(bytes) / kMiB); }

}  // namespace

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    train::Session session("lab09_zero", "Lab 09: ZeRO stages 1, 2 and 3", {.steps = 10});
    session.add_options("lab 09")
        ("stage", "ZeRO stage to train with (0: DDP, 1, 2, 3)", cxxopts::value<int>()->default_value("1"))
        ("verify-steps", "rank 0 also runs the single-device model for this many steps and "
                         "prints both losses (0: off)",
         cxxopts::value<int64_t>()->default_value("3"))
        ("table", "measure stages 0-3 at n = 1, 2, 4 after training",
         cxxopts::value<bool>()->default_value("true"));
    const auto& parsed = session.parse(argc, argv);
    const int stage = parsed["stage"].as<int>();
    const int64_t verify_steps = parsed["verify-steps"].as<int64_t>();
    const bool table = parsed["table"].as<bool>();
    SCALELAB_REQUIRE(stage >= 0 && stage <= 3, "--stage must be 0 (DDP), 1, 2 or 3, got {}", stage);
    SCALELAB_REQUIRE(verify_steps >= 0, "--verify-steps must not be negative");
    // an MoE block routes each rank's rows as their own group (capacity, balancing loss), the
    // single-device twin the whole batch: their losses part (exit 1 on the twin check)
    session.require_dense("lab 09's ZeRO trains dense blocks only");
    const auto& run = session.run();
    const auto& opt = session.opt();
    const ModelConfig& config = session.config();
    comm::Communicator& comm = session.comm();
    const Device device = session.device();
    // A rank's share of the batch through the whole model; the whole batch on rank 0 when it
    // runs the single-device twin, and on every rank for the table's n = 1 rows.
    const bool whole = table || (comm.rank() == 0 && verify_steps > 0);
    session.require_step_memory(whole ? opt.batch : opt.batch / comm.size());
    data::Sampler& sampler = session.sampler();
    // A bad split (more ranks than rows) is a usage error on every rank, before any training.
    const int64_t local_rows = lab03::local_batch(sampler.batch(0), comm.rank(), comm.size())
                                   .batch_size();

    // Every rank builds the model from the same seed: the same starting point without a broadcast.
    const nn::GPTOptions model_options = session.model_options(run.seed);
    auto trainer = lab09::make_trainer(stage, config, model_options, comm);
    // --diverge: one step, this rank's rows and its gradients (ZeRO-2: its shard) compared with
    // the twin's
    auto diverge = session.watch_divergence(trainer->model(),
                                            {.first_row = comm.rank() * local_rows});
    std::optional<train::SingleDeviceTwin> single;  // rank 0's twin, for --verify-steps
    if (comm.rank() == 0 && verify_steps > 0)
      single.emplace(config, model_options);  // in the run's precision too
    // The twin must match the trainer's loss: fp32 to 1e-5 relative (the ranks sum the gradient
    // in another order than one batch does; AdamW amplifies the last bits a little per step),
    // bf16 to 1e-3 (the same, but every activation rounds to 8 bits of mantissa), as lab 08.
    train::TwinCheck twin_check(run.precision);
    session.announce(fmt::format(
        "lab 09 zero: stage {}, model {} ({} parameters), {} ranks, global batch {} x {} tokens = "
        "{} rows per rank, {} steps, backend {}", stage, config.name,
        metrics::human_count(static_cast<double>(trainer->model().num_parameters())), comm.size(),
        opt.batch, config.block_size, local_rows, opt.steps, comm.backend()));
    for (int64_t step = 0; step < opt.steps; ++step) {
      const data::Batch global = sampler.batch(step);
      const double lr = session.lr(step);
      metrics::Timer timer(device);
      const double loss = trainer->forward_backward(global);
      trainer->step(lr);
      log::info("{}", session.step_line(step, loss, timer.elapsed()));
      if (single && step < verify_steps) {
        const double single_loss = single->step(global, lr);
        log::info("    single-device loss={:.6f}  |zero - single|={:.2e}", single_loss,
                  std::abs(loss - single_loss));
        if (!twin_check.add(loss, single_loss))
          log::info("    the loss against the single-device twin's: {}", twin_check.verdict());
      }
    }
    if (diverge) {
      // The gradients this rank holds: the whole buffer (stages 0-1), its shard of the layout
      // (stage 2), its shard of each unit (stage 3), each against the twin's same elements.
      if (auto* z2 = dynamic_cast<lab09::Zero2*>(trainer.get())) {
        diverge->record_gradient_shard(trainer->model(), z2->grad_shard(), z2->shard().lo,
                                       z2->shard().hi);
      } else if (auto* z3 = dynamic_cast<lab09::Zero3*>(trainer.get())) {
        const auto& units = trainer->model().params().units();
        for (std::size_t u = 0; u < units.size(); ++u)
          diverge->record_gradient_shard(trainer->model(), z3->unit_grad_shard(u),
                                         units[u].lo + z3->unit_shard(u).lo,
                                         units[u].lo + z3->unit_shard(u).hi);
      } else {
        diverge->record_gradients(trainer->model());
      }
      return session.divergence_exit(*diverge, model_options);
    }
    const Tensor full = trainer->full_parameters();  // collective on every stage
    const double divergence = train::max_divergence_from_rank0(full, comm);
    // A validation loss at every stage, on one batch of the corpus's val split: each rank
    // evaluates its rows (model().loss: at stage 3 the policy gathers each unit for the
    // evaluation pass and frees it after, so it is collective), the row-weighted mean is
    // all-reduced. Rank 0's twin, given the trainer's parameters, evaluates the whole batch: the
    // same within the twin tolerance (the rows' losses are summed in another order).
    const data::Batch val_global = session.val_sampler().batch(0);
    const data::Batch val_mine =
        lab03::local_batch(val_global, comm.rank(), comm.size()).to(device);
    const double rows = static_cast<double>(val_mine.batch_size());
    Tensor val_sum = Tensor::from_vector({trainer->model().loss(val_mine.x, val_mine.y) * rows},
                                         {1}, DType::f64);
    comm.all_reduce(val_sum, comm::ReduceOp::sum);
    const double val_loss = val_sum.item() / static_cast<double>(val_global.batch_size());
    train::TwinCheck val_check(run.precision);
    std::string val_twin;
    if (single) {
      nn::GPT& twin = single->model();
      twin.params().values().copy_from(full);
      if (twin.params().mixed()) twin.params().refresh_compute();
      const data::Batch g = val_global.to(device);
      const double want = twin.loss(g.x, g.y);
      val_check.add(val_loss, want);
      val_twin = fmt::format("; the single-device model with these parameters {:.6f}, {}", want,
                             val_check.verdict());
    }
    log::info("step={} val_loss={:.6f} (one batch of the val split){}", opt.steps - 1, val_loss,
              val_twin);
    const lab09::Held held = trainer->held();
    log::info("after {} steps: max |p - p on rank 0| over {} rank{} = {:.3g} ({}); rank 0 holds "
              "{} MiB of parameters, {} MiB of gradients, {} MiB of optimizer state",
              opt.steps, comm.size(), comm.size() == 1 ? "" : "s", divergence,
              divergence == 0 ? "identical replicas" : "REPLICAS DIFFER", mib(held.params),
              mib(held.grads), mib(held.optimizer));
    trainer.reset();
    single.reset();

    bool held_ok = true;
    if (table) {
      // Every stage the attendee has written: an optional one not written yet (step 4, ZeRO-3)
      // throws NotImplemented on every rank at the same point (its trainer's constructor, before
      // any message) and is left out with a note; so are the formula columns without step 5.
      std::vector<Row> rows;
      std::vector<std::string> missing;
      for (int s = 0; s <= 3; ++s) {
        try {
          for (int n : {1, 2, 4, 8})
            if (n <= comm.size() && comm.size() % n == 0)
              rows.push_back(measure(s, n, comm, config, sampler, run, device,
                                     train::learning_rate(opt, 0)));
        } catch (const NotImplemented& e) {
          missing.push_back(fmt::format("stage {}: {}", s, e.what()));
        }
      }
      log::info("");
      log::info("per rank (rank 0), MiB; held: between steps (params / grads / optimizer state "
                "as the trainer counts them, and the allocator's live bytes); paper: the "
                "formula; peak: the allocator's peak over a step; comm: payload bytes of a step "
                "(byte counters) beside the formula");
      if (run.bf16())
        log::info("bf16: params = fp32 master + bf16 copy (stage 3: the fp32 master shard, "
                  "no copy between steps); ours: this library's layout (fp32 master whole, fp32 "
                  "grads, m and v, a bf16 copy: 18 Psi at stage 0; stage 3: 16 Psi / n); paper: "
                  "the paper's 2 + 2 + 12 Psi (16-bit params and grads, K = 12 sharded from "
                  "stage 1); comm: fp32 gradients and values at stages 0-2 (the fp32 formula), "
                  "stage 3 gathers bf16 weights (2 + 2 + 4 Psi)");
      // In fp32 our layout IS the paper's formula: one column (the format tools/plot reads);
      // bf16 adds ours beside the paper's.
      const auto formulas = [&](const std::string& ours, const std::string& paper) {
        return run.bf16() ? fmt::format("{:>9} {:>9}", ours, paper) : fmt::format("{:>9}", paper);
      };
      log::info("{:>5} {:>2} {:>8} {:>8} {:>8} {:>9} {:>9} {} {:>8} {:>9} {:>9}", "stage", "n",
                "params", "grads", "optim", "held", "allocator", formulas("ours", "paper"),
                "peak", "comm", "paper");
      for (const Row& r : rows) {
        const auto formula = [&](std::size_t bytes) { return r.formulas ? mib(bytes) : "-"; };
        log::info("{:>5} {:>2} {:>8} {:>8} {:>8} {:>9} {:>9} {} {:>8} {:>9} {:>9}", r.stage,
                  r.n, mib(r.held.params), mib(r.held.grads), mib(r.held.optimizer),
                  mib(r.held.total()), mib(r.allocator),
                  formulas(formula(r.ours.total()), formula(r.paper.total())), mib(r.peak),
                  mib(r.comm), formula(r.paper_comm));
        held_ok = held_ok && r.held.total() == r.allocator;
      }
      if (!rows.empty() && !rows.front().formulas)
        log::info("formula columns: - until step 5 (optional) is written");
      for (const std::string& m : missing)
        log::info("not in the table: {} (an optional step: ./scalelab grade 09 lists them)", m);
      if (!held_ok)
        log::info("HELD != ALLOCATOR: a trainer counts other bytes than it keeps between steps");
    }
    // the twin runs on rank 0 only: every rank exits with the same verdict
    return train::on_every_rank(divergence == 0 && twin_check.ok && val_check.ok && held_ok, comm)
               ? kExitOk
               : kExitFailed;
  });
}
