// Lab 06 driver (not edited by attendees): DDP training with activation checkpointing, then a
// table per policy: measured activation memory and step time beside the estimates.
//
//   ./scalelab run 06 -n 4                                  # your code on 4 ranks
//   ./scalelab run 06 --solution -n 1 -- --checkpoint every:2 --batch 8
#include <algorithm>
#include <cstdint>

#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/log.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/global_loss.hpp"
#include "common/train/session.hpp"
#include "activation_checkpointing.hpp"
#include "ddp.hpp"

using namespace scalelab;

namespace {

struct Row {
  std::string policy;
  std::size_t held = 0, estimate = 0, peak = 0;
  std::int64_t allocated = 0;  // the allocator's bytes after forward above the start
  double ms = 0;
};

// One forward + backward under `plan` on this rank's rows: held bytes after forward (the sum of
// saved.acts), the allocator's bytes after forward and its peak above the start, and the best of
// `reps` step times.
Row measure(nn::GPT& model, const data::Batch& mine, const lab06::Policy& policy, int reps) {
  const lab06::Plan plan = lab06::make_plan(policy, static_cast<int>(model.config().n_layer));
  Row row{policy.str()};
  row.estimate = lab06::model_activation_bytes(model.config(), mine.batch_size(),
                                               mine.x.size(1), plan);
  // That count is for fp32 (step 4). In mixed precision (--precision bf16) the blocks keep bf16
  // activations (2 bytes an element) but fp32 LayerNorm statistics: 4 tensors of (B*T), 16 bytes
  // per token, in each block that keeps its activations (not the fully checkpointed ones).
  if (model.params().compute_dtype() == DType::bf16) {
    std::size_t kept = 0;
    for (bool full : plan.full) kept += full ? 0 : 1;
    const std::size_t stats = 16 * static_cast<std::size_t>(mine.x.numel()) * kept;
    row.estimate = (row.estimate - stats) / 2 + stats;
  }
  row.ms = 1e30;
  for (int r = 0; r < reps; ++r) {
    model.free_activations();
    model.zero_grad();
    reset_peak_memory(model.device());
    const std::size_t before = memory_stats(model.device()).current;
    metrics::Timer timer(model.device());
    lab06::Saved saved;
    lab06::forward(model, mine, plan, saved);
    row.held = lab06::held_activation_bytes(saved);
    row.allocated = static_cast<std::int64_t>(memory_stats(model.device()).current) -
                    static_cast<std::int64_t>(before);
    lab06::backward(model, saved);
    row.ms = std::min(row.ms, timer.elapsed() * 1e3);
    row.peak = memory_stats(model.device()).peak - before;
  }
  model.free_activations();
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    train::Session session("lab06_activation_checkpointing",
                     "Lab 06: DDP training with activation checkpointing",
                     {.batch = 16, .steps = 20});
    session.add_options("lab 06")
        ("checkpoint", "policy for training: none, every, every:K, selective",
         cxxopts::value<std::string>()->default_value("every"))
        ("reps", "repetitions per policy in the table (the best time is shown)",
         cxxopts::value<int>()->default_value("3"));
    const auto& parsed = session.parse(argc, argv);
    const int reps = parsed["reps"].as<int>();
    SCALELAB_REQUIRE(reps >= 1, "--reps must be at least 1, got {}", reps);
    const auto& opt = session.opt();
    const ModelConfig& config = session.config();
    session.require_dense("lab 06's forward runs dense blocks (attention, then an MLP) itself");
    const lab06::Policy policy = lab06::parse_policy(parsed["checkpoint"].as<std::string>());
    // A bad policy (an interval larger than the model) is a usage error on every rank.
    const lab06::Plan plan = lab06::make_plan(policy, static_cast<int>(config.n_layer));

    comm::Communicator& comm = session.comm();
    const Device device = session.device();
    // A rank's share of the batch through the whole model: rank 0's table runs it without
    // checkpointing; the whole batch, not checkpointed, on every rank with --diverge (the twin of
    // step 0).
    const bool whole = session.diverge();
    session.require_step_memory(
        whole ? opt.batch : opt.batch / comm.size(),
        {.checkpoint = !whole && comm.rank() != 0 && policy.kind != lab06::Policy::none});
    data::Sampler& sampler = session.sampler();
    const int64_t rows = lab03::local_batch(sampler.batch(0), comm.rank(), comm.size()).batch_size();

    nn::GPT model(config, session.model_options(session.run().seed + comm.rank()));
    lab03::broadcast_parameters(model, comm);
    model.params().refresh_compute();  // bf16: the broadcast replaced the fp32 master weights
    optim::AdamW adamw(optim::groups(model.parameters()));
    // --diverge: one step compared with the single-device twin's rows (this lab's forward runs
    // the blocks itself, outside the model's hooks: the report sees the head and the gradients)
    auto diverge = session.watch_divergence(model, {.first_row = comm.rank() * rows});
    session.announce(fmt::format(
        "lab 06 activation_checkpointing: model {} ({} parameters), {} rank{}, global batch {} x {} "
        "tokens ({} rows per rank), checkpoint policy {}, {} steps", config.name,
        metrics::human_count(static_cast<double>(model.num_parameters())), comm.size(),
        comm.size() == 1 ? "" : "s", opt.batch,
        config.block_size, rows, policy.str(), opt.steps));
    for (int64_t step = 0; step < opt.steps; ++step) {
      metrics::Timer timer(device);
      const data::Batch mine =
          lab03::local_batch(sampler.batch(step), comm.rank(), comm.size()).to(device);
      model.zero_grad();
      lab06::Saved saved;
      const Scalar loss = lab06::forward(model, mine, plan, saved);  // stays on the device
      lab06::backward(model, saved);
      lab03::all_reduce_gradients(model, comm);
      const double global = train::global_loss(loss, comm);
      adamw.step(session.lr(step));
      log::info("{}", session.step_line(step, global, timer.elapsed()));
    }
    if (diverge) {
      diverge->record_gradients(model);  // recomputed, all-reduced
      return session.divergence_exit(*diverge, session.model_options(session.run().seed));
    }

    // The table: every policy on this rank's rows of the next batch (no communication).
    const data::Batch mine =
        lab03::local_batch(sampler.batch(opt.steps), comm.rank(), comm.size()).to(device);
    std::vector<lab06::Policy> policies = {{lab06::Policy::none}, {lab06::Policy::selective}};
    for (int k = static_cast<int>(config.n_layer); k >= 2; k /= 2)
      policies.push_back({lab06::Policy::every_kth, k});
    policies.push_back({lab06::Policy::every});
    // Rank 0 measures while the others wait, so its timings do not share cores with them.
    std::vector<Row> table;
    if (comm.rank() == 0)
      for (const lab06::Policy& p : policies) table.push_back(measure(model, mine, p, reps));
    comm.barrier();
    const double L = config.n_layer, s = config.block_size, b = mine.batch_size(),
                 h = config.n_embd, a = config.n_head;
    log::info("");
    log::info("rank 0, {} rows x {} tokens, best of {} (held: bytes the blocks keep after forward; "
              "peak: allocator peak of forward+backward above the start)", mine.batch_size(),
              config.block_size, reps);
    log::info("{:<10} {:>12} {:>12} {:>12} {:>10} {:>9}", "policy", "held", "estimate", "peak",
              "step ms", "vs none");
    for (const Row& r : table)
      log::info("{:<10} {:>12} {:>12} {:>12} {:>10.1f} {:>8.2f}x", r.policy,
                metrics::human_bytes(static_cast<double>(r.held)),
                metrics::human_bytes(static_cast<double>(r.estimate)),
                metrics::human_bytes(static_cast<double>(r.peak)), r.ms, r.ms / table[0].ms);
    // the model's own count is the `none` row's estimate (step 4 writes it; its mapping from the
    // lecture's terms is a hint, not printed here)
    if (!table.empty())
      log::info("lecture formula L*s*b*h*(34 + 5*a*s/h) (16-bit, dropout) for this shape: {}; "
                "this model's count ({}, no dropout): {}",
                metrics::human_bytes(lab06::lecture_activation_bytes(L, s, b, h, a)),
                dtype_name(model.params().compute_dtype()),
                metrics::human_bytes(static_cast<double>(table[0].estimate)));
    // `held` sums what saved.acts holds; the allocator sees every live allocation: after forward,
    // the blocks' bytes plus the head's activations, the same under every policy. Both must
    // agree with the estimate (activations kept outside saved.acts show only in the allocator).
    bool exact = true, allocator_agrees = true;
    for (const Row& r : table) {
      exact = exact && r.held == r.estimate;
      allocator_agrees = allocator_agrees && r.allocated - static_cast<std::int64_t>(r.estimate) ==
                                                 table[0].allocated -
                                                     static_cast<std::int64_t>(table[0].estimate);
    }
    if (!table.empty())
      log::info("allocator after forward - estimate: {} for every policy (the head's "
                "activations): {}",
                metrics::human_bytes(static_cast<double>(table[0].allocated) -
                                     static_cast<double>(table[0].estimate)),
                allocator_agrees ? "yes" : "NO");
    exact = exact && allocator_agrees;
    log::info("estimate == measured for every policy: {}", exact ? "yes" : "NO");
    exact = train::on_every_rank(exact, comm);
    return exact ? kExitOk : kExitFailed;
  });
}
