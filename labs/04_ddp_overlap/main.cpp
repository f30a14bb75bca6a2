// Lab 04 driver (not edited by attendees): DDP training with bucketed all-reduces overlapped with
// backward, then a table: no overlap (lab 03's flat all-reduce) against overlap with a sweep of
// bucket sizes: step time, all-reduce time, exposed communication, and how much of it is hidden.
//
//   ./scalelab run 04 -n 2                                     # your code on 2 ranks
//   ./scalelab run 04 --solution -n 2 -- --trace overlap.json  # open in ui.perfetto.dev
#include <algorithm>

#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/log.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/trace.hpp"
#include "common/train/global_loss.hpp"
#include "common/train/session.hpp"
#include "ddp.hpp"
#include "ddp_overlap.hpp"

using namespace scalelab;

namespace {

struct Row {
  std::string mode;
  std::size_t buckets = 0;
  double step_ms = 0, backward_ms = 0, comm_ms = 0, exposed_ms = 0;
};

// "1 rank", "2 ranks": the program's lines read as sentences at any count.
std::string count_of(std::size_t n, const char* word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

// The median: on a shared machine a few steps are slowed down by other processes.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The same all-reduces on their own (no compute beside them): what overlap tries to hide.
double comm_alone_ms(nn::GPT& model, comm::Communicator& comm,
                     const std::vector<lab04::Bucket>& buckets) {
  comm.barrier();
  const double t0 = trace::now_us();
  for (const lab04::Bucket& b : buckets) comm.all_reduce(model.params().grads().flat(b.offset, b.count));
  return (trace::now_us() - t0) / 1e3;
}

// A bucket size of the table: as given (MiB, the row's name) and in bytes (checked once).
struct BucketSize {
  double mb = 0;
  std::size_t bytes = 0;
};

// `reps` measured steps (after one warm-up) of forward + backward + gradient sync on `mine`;
// the median of each column. size.mb <= 0: no overlap (one flat all-reduce after backward).
Row measure(nn::GPT& model, comm::Communicator& comm, const data::Batch& mine, BucketSize size,
            int reps) {
  const bool overlap = size.mb > 0;
  std::vector<lab04::Bucket> buckets =
      overlap ? lab04::assign_buckets(model.params(), lab04::ready_order(model), size.bytes)
              : std::vector<lab04::Bucket>{{0, model.num_parameters(), {}}};
  Row row{overlap ? fmt::format("overlap {:g} MiB", size.mb) : "no overlap", buckets.size()};
  std::unique_ptr<lab04::OverlappedDDP> ddp;
  if (overlap) {
    ddp = std::make_unique<lab04::OverlappedDDP>(model, comm, buckets);
    ddp->attach();
  }
  std::vector<double> step, backward, exposed, alone;
  for (int r = -1; r < reps; ++r) {
    comm.barrier();
    const double t0 = trace::now_us();
    model.zero_grad();
    model.forward(mine.x, mine.y);
    model.backward();
    // On a GPU, backward() returns when its kernels are queued: wait for them, so backward_end
    // is when the gradients exist (a no-op on the CPU). With NCCL this also waits for the
    // all-reduces already queued on the device: there, read the overlap in a profiler's trace.
    device_synchronize(model.device());
    const double backward_end = trace::now_us();
    std::vector<double> done;
    if (overlap) {
      done = ddp->finish();
    } else {
      lab03::all_reduce_gradients(model, comm);
      done = {trace::now_us()};
    }
    const double t1 = trace::now_us();
    // A fast rank's wait after its backward includes waiting for the slow ranks (imbalance, not
    // communication); the slowest rank's wait is the communication left: take the minimum.
    Tensor exposed_min =
        Tensor::from_vector({lab04::exposed_time(backward_end, done)}, {1}, DType::f64);
    comm.all_reduce(exposed_min, comm::ReduceOp::min);
    const double comm_ms = comm_alone_ms(model, comm, buckets);
    if (r < 0) continue;  // warm-up
    step.push_back((t1 - t0) / 1e3);
    backward.push_back((backward_end - t0) / 1e3);
    exposed.push_back(exposed_min.item() / 1e3);
    alone.push_back(comm_ms);
  }
  row.step_ms = median(step);
  row.backward_ms = median(backward);
  row.exposed_ms = median(exposed);
  row.comm_ms = median(alone);
  if (ddp) ddp->detach();
  model.free_activations();
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    train::Session session("lab04_ddp_overlap",
                     "Lab 04: DDP with bucketed all-reduces overlapped with backward",
                     {.batch = 16, .steps = 20});
    session.add_options("lab 04")
        ("bucket-mb", "bucket size in MiB for training", cxxopts::value<double>()->default_value("0.25"))
        ("sweep", "bucket sizes (MiB) for the table", cxxopts::value<std::vector<double>>()->default_value("0.0625,0.25,1,4"))
        ("reps", "measured steps per row of the table", cxxopts::value<int>()->default_value("7"));
    const auto& parsed = session.parse(argc, argv);
    const double bucket_mb = parsed["bucket-mb"].as<double>();
    const int reps = parsed["reps"].as<int>();
    const std::size_t bucket = cli::mib_to_bytes("--bucket-mb", bucket_mb);
    std::vector<BucketSize> sweep;  // all of them checked before any training
    for (double mb : parsed["sweep"].as<std::vector<double>>())
      sweep.push_back({mb, cli::mib_to_bytes("--sweep", mb)});
    SCALELAB_REQUIRE(reps >= 1, "--reps must be at least 1, got {}", reps);
    const auto& opt = session.opt();
    const ModelConfig& config = session.config();
    comm::Communicator& comm = session.comm();
    const Device device = session.device();
    session.require_dense(lab03::kDenseOnly);
    // A rank's share of the batch through the whole model (the table's steps too); the whole batch
    // on every rank with --diverge (the twin of step 0).
    session.require_step_memory(session.diverge() ? opt.batch : opt.batch / comm.size());
    data::Sampler& sampler = session.sampler();
    const int64_t rows = lab03::local_batch(sampler.batch(0), comm.rank(), comm.size()).batch_size();

    nn::GPT model(config, session.model_options(session.run().seed + comm.rank()));
    lab03::broadcast_parameters(model, comm);
    model.params().refresh_compute();  // bf16: the broadcast replaced the fp32 master weights
    optim::AdamW adamw(optim::groups(model.parameters()));
    const auto buckets = lab04::assign_buckets(model.params(), lab04::ready_order(model), bucket);
    // --diverge: one step, every tensor compared with the single-device twin's rows (watched
    // from here: ready_order ran a step of its own)
    auto diverge = session.watch_divergence(model, {.first_row = comm.rank() * rows});
    session.announce(fmt::format(
        "lab 04 ddp_overlap: model {} ({} parameters, {} of gradients), {}, global batch {} "
        "x {} tokens ({} rows per rank), {} of <= {:g} MiB, {} steps", config.name,
        metrics::human_count(static_cast<double>(model.num_parameters())),
        metrics::human_bytes(static_cast<double>(model.params().grads().nbytes())),
        count_of(comm.size(), "rank"), opt.batch, config.block_size, rows,
        count_of(buckets.size(), "bucket"), bucket_mb, opt.steps));
    {
      lab04::OverlappedDDP ddp(model, comm, buckets);
      ddp.attach();
      for (int64_t step = 0; step < opt.steps; ++step) {
        metrics::Timer timer(device);
        const data::Batch mine =
            lab03::local_batch(sampler.batch(step), comm.rank(), comm.size()).to(device);
        model.zero_grad();
        Scalar loss;  // on the model's device until the step line reads it
        {
          trace::Scope s("forward");
          loss = model.forward(mine.x, mine.y);
        }
        {
          trace::Scope s("backward");  // bucket all-reduces start in here
          model.backward();
        }
        {
          trace::Scope s("wait buckets");
          ddp.finish();
        }
        const double global = train::global_loss(loss, comm);
        adamw.step(session.lr(step));
        log::info("{}", session.step_line(step, global, timer.elapsed()));
      }
      ddp.detach();
    }
    if (diverge) {
      diverge->record_gradients(model);  // the buckets' all-reduces finished
      return session.divergence_exit(*diverge, session.model_options(session.run().seed));
    }
    const double divergence = lab03::parameter_divergence(model, comm);
    log::info("after {} steps: max |p - p on rank 0| over {} = {:.3g}", opt.steps,
              count_of(comm.size(), "rank"), divergence);

    // The table (rank 0's times; every rank runs the same steps).
    const data::Batch mine =
        lab03::local_batch(sampler.batch(opt.steps), comm.rank(), comm.size()).to(device);
    std::vector<Row> table = {measure(model, comm, mine, {}, reps)};
    for (const BucketSize& size : sweep) table.push_back(measure(model, comm, mine, size, reps));
    log::info("");
    log::info("{}, {} rows x {} tokens per rank, median of {} steps (rank 0). all-reduce: the "
              "same all-reduces alone; exposed: backward end to latest bucket done, on the rank "
              "that waits least; hidden: - where nothing can be (one bucket, or one rank)",
              count_of(comm.size(), "rank"), mine.batch_size(), config.block_size, reps);
    log::info("{:<18} {:>7} {:>9} {:>12} {:>14} {:>11} {:>7}", "mode", "buckets", "step ms",
              "backward ms", "all-reduce ms", "exposed ms", "hidden");
    for (const Row& r : table) {
      // One bucket starts only when backward has ended, and one rank has nothing to send: no
      // overlap by construction, so a percentage there would only measure timer noise.
      const std::string hidden =
          r.buckets == 1 || comm.size() == 1
              ? std::string("-")
              : fmt::format("{:.0f}%", 100 * lab04::hidden_fraction(r.exposed_ms, r.comm_ms));
      log::info("{:<18} {:>7} {:>9.1f} {:>12.1f} {:>14.2f} {:>11.2f} {:>7}", r.mode, r.buckets,
                r.step_ms, r.backward_ms, r.comm_ms, r.exposed_ms, hidden);
    }
    return divergence == 0 ? kExitOk : kExitFailed;
  });
}
