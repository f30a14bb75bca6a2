// Lab 05 graders. The heart: `accum` micro-batches of m rows give the gradient of one batch of
// accum*m rows, on one device and with DDP, computed here against the single-device run.
// Tolerances (the fixture's contract, tests/support/lab_fixture.hpp): accumulating equal-size
// micro-batches adds the same terms in another grouping (each matmul sums over m rows, then the
// micro-batches add up), so single-device accumulation is compared at 1e-6 relative (+1e-7
// absolute for the gradients that are nearly 0); with DDP the all-reduce changes the order
// again: 1e-5 relative / 1e-6 absolute. DDP is lab 04's overlapped reducer: the test's Launch
// sees every bucket start and checks that the bucket then holds this rank's FULLY accumulated
// gradient (so it started in the last micro-batch, after the no-sync ones).
// Memory is measured by the allocator's counters, which are exact: no timing anywhere.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/allocator.hpp"
#include "common/errors.hpp"
#include "common/exec_log.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/work.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/scalar.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/reference.hpp"
#include "ddp.hpp"
#include "ddp_overlap.hpp"
#include "grad_accumulation.hpp"
#include "tests/04_ddp_overlap/test_buckets.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/lab_fixture.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"
#include "tests/support/traffic_budget.hpp"
#include "tests/support/what_it_did.hpp"

using namespace scalelab;
using labtest::close_on_every_rank;
using labtest::world;

namespace {

constexpr labtest::Setup kLab{.seed = 99, .global_batch = 16, .corpus_seed = 5};
constexpr uint64_t kSeed = kLab.seed;
constexpr int64_t kGlobalBatch = kLab.global_batch;  // 1, 2, 4 ranks x accum 1, 2, 4
constexpr double kAccumRtol = 1e-6, kAccumAtol = 1e-7;
constexpr double kDdpRtol = labtest::kAllReduceRtol, kDdpAtol = labtest::kAllReduceAtol;

data::Batch global_batch(int64_t step = 0) { return kLab.batch(step); }

// The planted fault of step 1: micro-batch losses NOT scaled by 1/accum.
double unscaled_accumulation(nn::GPT& model, const data::Batch& batch, int accum) {
  model.zero_grad();
  double sum = 0;
  const int64_t m = batch.batch_size() / accum;
  for (int i = 0; i < accum; ++i) {
    sum += model.forward(batch.x.rows(i * m, (i + 1) * m), batch.y.rows(i * m, (i + 1) * m));
    model.backward();  // fault: loss_scale 1 instead of 1/accum
  }
  return sum / accum;
}

// The training passes of `model` in the execution log (exec_log.hpp), in order: 'F' for each
// forward (its head_forward, where the loss is computed), 'B' for each backward (its
// embed_backward, the backward's last piece). Evaluation (model.loss()) records no piece.
std::string passes(const std::vector<exec_log::Event>& log, const nn::GPT& model) {
  std::string out;
  for (const exec_log::Event& e : log) {
    if (e.object != &model) continue;
    if (e.what == "head_forward") out += 'F';
    if (e.what == "embed_backward") out += 'B';
  }
  return out;
}

int64_t count_of(const std::string& s, char c) { return std::count(s.begin(), s.end(), c); }

// The allocator's peak above what was held at the start, around one accumulate_gradients: the
// test's own measurement, on the model it is given (a fresh one: no activations held).
std::size_t peak_around_accumulation(nn::GPT& model, const data::Batch& batch, int accum) {
  const Device dev = model.device();
  reset_peak_memory(dev);
  const std::size_t before = memory_stats(dev).current;
  lab05::accumulate_gradients(model, batch, accum);
  return memory_stats(dev).peak - before;
}

}  // namespace

// ---- Step 1 -------------------------------------------------------------------------------------

TEST(Step1_MicroBatches, EqualSlicesInOrder) {
  const data::Batch b = global_batch();
  for (int accum : {1, 2, 4, 16}) {
    const auto mbs = lab05::micro_batches(b, accum);
    ASSERT_EQ(static_cast<int>(mbs.size()), accum);
    const int64_t m = kGlobalBatch / accum;
    for (int i = 0; i < accum; ++i) {
      EXPECT_EQ(mbs[i].batch_size(), m);
      EXPECT_TRUE(mbs[i].x.shares_storage_with(b.x)) << "views, not copies";
      EXPECT_EQ(mbs[i].x.to_vector(), b.x.rows(i * m, (i + 1) * m).to_vector());
      EXPECT_EQ(mbs[i].y.to_vector(), b.y.rows(i * m, (i + 1) * m).to_vector());
    }
  }
  EXPECT_THROW(lab05::micro_batches(b, 0), UsageError) << "accum 0";
  EXPECT_THROW(lab05::micro_batches(b, 3), UsageError) << "16 rows into 3";
  EXPECT_THROW(lab05::micro_batches(b, 32), UsageError) << "more micro-batches than rows";
}

TEST(Step1_Accumulate, MicroBatchesEqualTheBigBatch) {
  const data::Batch b = global_batch();
  const train::Reference ref = kLab.reference(b);
  for (int accum : {1, 2, 4}) {
    nn::GPT model(kLab.config(), {.seed = kSeed});
    const double loss = lab05::accumulate_gradients(model, b, accum);
    EXPECT_NEAR(loss, ref.loss, 1e-6 * ref.loss) << "accum " << accum;
    const train::Diff d = train::compare(model.params().grads(), ref.grads);
    EXPECT_TRUE(d.within(kAccumRtol, kAccumAtol)) << "accum " << accum << ": " << d.str();
    if (accum == 1) EXPECT_TRUE(d.bitwise) << "one micro-batch IS the big batch: " << d.str();
  }
}

TEST(Step1_Accumulate, StartsFromZeroGradients) {
  const data::Batch b = global_batch();
  nn::GPT model(kLab.config(), {.seed = kSeed});
  ops::fill(model.params().grads(), 3.0);  // stale gradients of the last step
  lab05::accumulate_gradients(model, b, 2);
  const train::Reference ref = kLab.reference(b);
  const train::Diff d = train::compare(model.params().grads(), ref.grads);
  EXPECT_TRUE(d.within(kAccumRtol, kAccumAtol))
      << "with every gradient 3 before the call: " << d.str()
      << ": the gradients of an earlier step were counted (a step starts from zero gradients)";
}

// The micro-batches' losses add where they are (on the GPU, a device number) and the sum is read
// to the host once, on return: a read per micro-batch would stall a GPU's queue every time. On
// the CPU the reads are counted all the same (host_reads, common/scalar.hpp).
TEST(Step1_Accumulate, ReadsTheLossToTheHostOnce) {
  const data::Batch b = global_batch();
  nn::GPT model(kLab.config(), {.seed = kSeed});
  const int64_t before = host_reads();
  lab05::accumulate_gradients(model, b, 4);
  const int64_t reads = host_reads() - before;
  if (reads > 1)
    LABTEST_FAIL() << "accumulate_gradients with accum 4 read " << reads
                   << " numbers back to the host, want 1: add the micro-batches' losses as "
                   << "Scalars and let the one read happen on return";
}

// Accumulation runs each micro-batch's forward and then its backward before the next one's
// forward (the execution log: the model's pieces as they were called): a single pass over the
// whole batch, or every forward first, gives the same gradient and holds more than one
// micro-batch's activations.
TEST(Step1_Accumulate, EachMicroBatchForwardThenBackward) {
  const data::Batch b = global_batch();
  for (int accum : {2, 4}) {
    nn::GPT model(kLab.config(), {.seed = kSeed});
    std::string ran;
    {
      exec_log::Recording rec;
      lab05::accumulate_gradients(model, b, accum);
      ran = passes(rec.events(), model);
    }
    std::string want;
    for (int i = 0; i < accum; ++i) want += "FB";
    if (ran != want)
      LABTEST_FAIL() << "accumulate_gradients with accum " << accum << " ran "
                     << count_of(ran, 'F') << " forward(s) and " << count_of(ran, 'B')
                     << " backward(s), in the order " << ran << " (F forward, B backward): "
                     << "each of the " << accum << " micro-batches runs its forward, then its "
                     << "backward, before the next micro-batch's forward";
  }
}

// The work (ops::work_stats: matmul FLOPs, LayerNorm rows, attention score pairs) of one
// accumulation is that of one forward and backward of the whole batch, done here by the test:
// accumulation cuts the batch, it adds no work. A second forward for the loss (model.loss())
// is more.
TEST(Step1_Accumulate, DoesTheWorkOfTheWholeBatchOnce) {
  const data::Batch b = global_batch();
  nn::GPT model(kLab.config(), {.seed = kSeed}), twin(kLab.config(), {.seed = kSeed});
  const ops::WorkCount before = ops::work_stats();
  lab05::accumulate_gradients(model, b, 4);
  const ops::WorkCount did = ops::work_stats() - before;
  const ops::WorkCount twin_before = ops::work_stats();
  twin.zero_grad();
  twin.forward(b.x, b.y);
  twin.backward();
  const ops::WorkCount want = ops::work_stats() - twin_before;
  if (did.matmul_flops != want.matmul_flops || did.layernorm_rows != want.layernorm_rows ||
      did.attention_pairs != want.attention_pairs)
    LABTEST_FAIL() << "accumulate_gradients with accum 4 did " << did.matmul_flops
                   << " matmul FLOPs and " << did.layernorm_rows << " LayerNorm rows; one "
                   << "forward and backward of the whole batch's " << b.batch_size()
                   << " rows does " << want.matmul_flops << " and " << want.layernorm_rows
                   << ": each row runs forward and backward once, and the micro-batch's loss is "
                   << "the one its forward computed";
}

// What accumulation is for: the allocator's peak during accumulate_gradients (measured here by
// the test) is one micro-batch's, not the whole batch's, nor every micro-batch's at once.
TEST(Step1_Accumulate, ThePeakIsOneMicroBatch) {
  const data::Batch b = global_batch();
  nn::GPT one(kLab.config(), {.seed = kSeed}), four(kLab.config(), {.seed = kSeed});
  const std::size_t big = peak_around_accumulation(one, b, 1);
  const std::size_t small = peak_around_accumulation(four, b, 4);
  if (static_cast<double>(small) >= 0.40 * static_cast<double>(big))
    LABTEST_FAIL() << "during accumulate_gradients the memory held rose by " << small
                   << " bytes at most with accum 4, " << big << " with accum 1: a quarter of the "
                   << "rows at a time should hold about a quarter (under 40% here): hold one "
                   << "micro-batch's activations at a time";
}

// The micro-batch's loss as the contract says: unscaled, the mean over its rows, as the model's
// forward computes it (the 1/accum scale belongs to the backward only).
TEST(Step1_Accumulate, MicroBatchStepReturnsTheForwardsLoss) {
  const data::Batch b = global_batch();
  const data::Batch micro = b.rows(0, kGlobalBatch / 4);
  nn::GPT model(kLab.config(), {.seed = kSeed}), twin(kLab.config(), {.seed = kSeed});
  model.zero_grad();
  const double got = lab05::micro_batch_step(model, micro, 4).value();
  const double want = twin.forward(micro.x, micro.y).value();
  if (std::abs(got - want) > 1e-9 * std::abs(want))  // the same rows and kernels: the same loss
    LABTEST_FAIL() << "micro_batch_step of a micro-batch of accum 4 returned " << got
                   << ", the model's forward gives " << want << " on the same rows: return the "
                   << "micro-batch's own mean loss, unscaled";
}

// On the simulated GPU (Device::sim: host memory that only the ops may touch, as a GPU's) with
// the batch on the host, as the sampler makes it: the same gradients as on the host, bit for bit
// (the same CPU kernels). A micro-batch never moved to the model's device is refused by the
// first op there ("ids on cpu, data on sim"), as a GPU would refuse it.
TEST(Step1_Accumulate, RunsOnTheSimulatedGpuAsOnTheHost) {
  const data::Batch b = global_batch();
  nn::GPT host(kLab.config(), {.seed = kSeed});
  nn::GPT sim(kLab.config(), {.device = Device::sim(), .seed = kSeed});
  const double want = lab05::accumulate_gradients(host, b, 4);
  std::string same;
  const std::string stopped = labtest::runs_on_sim([&] {
    const double got = lab05::accumulate_gradients(sim, b, 4);
    same = labtest::step_same_on_sim("accum 4: ", want, got, "the gradients",
                                     host.params().grads(), sim.params().grads());
  });
  const std::string all = labtest::joined({stopped, same});
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

TEST(Step1_PlantedFault, UnscaledMicroBatchLossIsCaught) {
  const data::Batch b = global_batch();
  nn::GPT model(kLab.config(), {.seed = kSeed});
  unscaled_accumulation(model, b, 4);
  const train::Reference ref = kLab.reference(b);
  EXPECT_FALSE(train::compare(model.params().grads(), ref.grads).within(kAccumRtol, kAccumAtol))
      << "the check of Step1_Accumulate must fail when the micro-batch losses are not scaled";
}

// ---- Step 2 -------------------------------------------------------------------------------------

namespace {

// Watches the launches of a reducer: each bucket once per step, holding this rank's complete
// local gradient (`local`) when it starts.
struct LaunchCheck {
  Tensor local;
  int launches = 0;
  std::vector<std::string> problems;
  lab04::Launch launch() {
    return [this](int b, const Tensor& grads) {
      ++launches;
      const train::Diff d =
          train::compare(grads, local.flat(grads.offset(), grads.numel()));
      if (!d.within(1e-6, 1e-7))
        problems.push_back(fmt::format("bucket {} started before its gradient was complete: {}",
                                       b, d.str()));
      return world().all_reduce_async(grads);
    };
  }
};

// This rank's gradient before any all-reduce: the single-device run on its rows.
Tensor local_gradient(const data::Batch& global) {
  return kLab.reference(labtest::my_rows(global)).grads;
}

// ddp_accumulate, checked to leave the reducer finished, as lab 04's step does: every
// all-reduce it started was waited for before it returned (an unfinished reducer also keeps
// this step's bookkeeping, and the next step's backward then fails inside lab 04's code). The
// execution log of the call goes to `log` when given.
double checked_ddp_accumulate(nn::GPT& model, const data::Batch& global, int accum,
                              lab04::OverlappedDDP& ddp,
                              std::vector<exec_log::Event>* log = nullptr) {
  double loss = 0;
  std::vector<exec_log::Event> events;
  {
    exec_log::Recording rec;
    loss = lab05::ddp_accumulate(model, global, accum, world(), ddp);
    events = rec.events();
  }
  const labtest::Waits waits = labtest::waits_in(events);
  if (!waits.unwaited.empty())
    LABTEST_FAIL() << "ddp_accumulate with accum " << accum << " returned with "
                   << waits.unwaited.size() << " of the " << waits.started
                   << " operations it started never waited for: "
                   << "the step ends with the reducer finished (every bucket waited for and "
                   << "averaged, ready for the next step)";
  if (log) *log = std::move(events);
  return loss;
}

}  // namespace

TEST(Step2_NoSync, HooksAreOffInsideTheScope) {
  const data::Batch b = global_batch();
  nn::GPT model(kLab.config(), {.seed = kSeed});
  LaunchCheck check{local_gradient(b)};
  lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3), check.launch());
  ddp.attach();
  {
    lab05::NoSync scope(ddp);
    model.zero_grad();
    model.forward(b.x.rows(0, 2), b.y.rows(0, 2));
    model.backward();
    EXPECT_EQ(check.launches, 0) << "no all-reduce inside a no-sync scope";
  }
  model.forward(b.x.rows(0, 2), b.y.rows(0, 2));
  model.backward();
  // ASSERT: finish() would throw on buckets never launched, and its message names lab 04's code
  ASSERT_EQ(check.launches, static_cast<int>(ddp.buckets().size()))
      << "after the scope, backward starts every bucket again (the hooks are attached again)";
  ddp.finish();
}

TEST(Step2_DdpAccumulate, EqualsSingleDeviceWithOneSyncPerStep) {
  const data::Batch b = global_batch();
  const train::Reference ref = kLab.reference(b);
  for (int accum : {1, 2, 4}) {
    nn::GPT model(kLab.config(), {.seed = kSeed});
    LaunchCheck check{local_gradient(b)};
    // The buckets before the explainer: test_buckets runs a forward + backward of its own
    // (ready_order), which the explainer would record as micro-batch 0 and blame the forward.
    lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3), check.launch());
    // a failure names the first tensor off the twin (this rank's rows, micro-batch by micro-batch)
    labtest::Explain why(model, {.seed = kSeed},
                         {.first_row = world().rank() * (kGlobalBatch / world().size())});
    ddp.attach();
    const double loss = checked_ddp_accumulate(model, b, accum, ddp);
    why.step_done(b);
    EXPECT_EQ(check.launches, static_cast<int>(ddp.buckets().size()))
        << "accum " << accum << ": each bucket all-reduced once per step, not per micro-batch";
    EXPECT_TRUE(check.problems.empty()) << "accum " << accum << ": " << check.problems.front();
    EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss) << "accum " << accum << ": the global loss";
    EXPECT_TRUE(close_on_every_rank(model.params().grads(), ref.grads, kDdpRtol, kDdpAtol, why))
        << "accum " << accum;
  }
}

// Step 2 with the model on the simulated GPU (tests/support/on_sim.hpp) and the global batch on
// the host, accum 2: the host's loss and averaged gradients bit for bit.
TEST(Step2_DdpAccumulate, RunsOnTheSimulatedGpuAsOnTheHost) {
  const data::Batch b = global_batch();
  const auto step = [&](nn::GPT& model) {
    lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3));
    ddp.attach();
    return lab05::ddp_accumulate(model, b, 2, world(), ddp);
  };
  nn::GPT host(kLab.config(), {.seed = kSeed});
  nn::GPT sim(kLab.config(), {.device = Device::sim(), .seed = kSeed});
  const double want = step(host);
  std::vector<std::string> problems;
  labtest::collective_run_on_sim([&] {
    const double got = step(sim);
    problems.push_back(labtest::step_same_on_sim("", want, got, "the averaged gradients",
                                                 host.params().grads(), sim.params().grads()));
  });
  const std::string all = labtest::joined(problems);
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

// A micro-batch that throws inside the no-sync part (here a token outside the vocabulary, on
// every rank, in the first micro-batch's forward) must not leave the reducer's hooks off: the
// next step would then accumulate without any all-reduce and train each rank on its own rows.
// A NoSync scope re-attaches however its block ends; a detach() ... attach() pair does not.
TEST(Step2_DdpAccumulate, AMicroBatchThatThrowsLeavesTheHooksOn) {
  const data::Batch b = global_batch();
  nn::GPT model(kLab.config(), {.seed = kSeed});
  LaunchCheck check{local_gradient(b)};
  lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3), check.launch());
  ddp.attach();
  data::Batch bad{b.x.clone(), b.y};
  ops::fill(bad.x, static_cast<double>(kLab.config().vocab_size));  // every token out of range
  EXPECT_THROW(lab05::ddp_accumulate(model, bad, 2, world(), ddp), CheckFailed)
      << "the embedding's check of the first micro-batch";
  ASSERT_EQ(check.launches, 0) << "nothing to all-reduce: the first micro-batch threw";
  model.zero_grad();
  model.forward(b.x.rows(0, 2), b.y.rows(0, 2));
  model.backward();
  if (check.launches != static_cast<int>(ddp.buckets().size())) {
    // no finish(): it would throw on buckets never launched, naming lab 04's code
    LABTEST_FAIL() << "after ddp_accumulate threw inside its no-sync part, backward started "
                   << check.launches << " of " << ddp.buckets().size()
                   << " buckets: the hooks were left off (a detach() whose attach() the exception "
                      "skipped; a NoSync scope attaches again however its block ends)";
    return;
  }
  ddp.finish();
}

TEST(Step2_DdpAccumulate, StepAfterStepWithSgd) {
  constexpr double kLr = 0.5;
  nn::GPT model(kLab.config(), {.seed = kSeed}), single(kLab.config(), {.seed = kSeed});
  lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3));
  ddp.attach();
  optim::SGD sgd(optim::groups(model.parameters())), sgd1(optim::groups(single.parameters()));
  for (int step = 0; step < 3; ++step) {
    const data::Batch b = global_batch(step);
    checked_ddp_accumulate(model, b, 2, ddp);
    sgd.step(kLr);
    single.zero_grad();
    single.forward(b.x, b.y);
    single.backward();
    sgd1.step(kLr);
  }
  EXPECT_TRUE(close_on_every_rank(model.params().values(), single.params().values(), kDdpRtol,
                                  kDdpAtol));
}

// What one step sends and reads (the library's ledger, comm::traffic(), and host_reads()): each
// bucket's all-reduce once and the loss's once, nothing else (no second all-reduce of the
// gradients, no broadcast, no loss all-reduced per micro-batch), and one number read back to the
// host, the loss on return.
TEST(Step2_DdpAccumulate, SendsEachBucketAndTheLossOnceAndReadsOnce) {
  const data::Batch b = global_batch();
  const int accum = 2;
  nn::GPT model(kLab.config(), {.seed = kSeed});
  lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3));
  ddp.attach();
  const int64_t grad_bytes = static_cast<int64_t>(model.params().grads().nbytes());
  const int64_t buckets = static_cast<int64_t>(ddp.buckets().size());
  int64_t reads = 0;
  const comm::Traffic moved = labtest::traffic_of([&] {
    const int64_t before = host_reads();
    checked_ddp_accumulate(model, b, accum, ddp);
    reads = host_reads() - before;
  });
  EXPECT_TRUE(labtest::exact_traffic(
      moved, labtest::TrafficBudget{}.all_reduce(world(), buckets + 1, grad_bytes + 8)))
      << "ddp_accumulate with accum " << accum << " sent: " << labtest::traffic_str(moved)
      << "; a step sends one all-reduce of each of the " << buckets << " buckets (" << grad_bytes
      << " bytes of gradients in all) and one of the loss (8 bytes), and nothing else";
  if (reads != 1)
    LABTEST_FAIL() << "ddp_accumulate with accum " << accum << " read " << reads
                   << " numbers back to the host, want 1: add the micro-batches' losses where "
                   << "they are and let the one read happen on return";
}

// The contract's "overlapped with the last backward" (the execution log): the first bucket's
// all-reduce starts after the last micro-batch's forward and before that micro-batch's backward
// ends (its last piece, the embedding's backward), so the all-reduces run under the rest of it.
TEST(Step2_DdpAccumulate, TheFirstBucketStartsDuringTheLastBackward) {
  const data::Batch b = global_batch();
  for (int accum : {1, 2}) {
    nn::GPT model(kLab.config(), {.seed = kSeed});
    lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3));
    ddp.attach();
    std::vector<exec_log::Event> log;
    checked_ddp_accumulate(model, b, accum, ddp, &log);
    int64_t last_forward = -1, last_backward_end = -1, first_all_reduce = -1;
    for (int64_t i = 0; i < static_cast<int64_t>(log.size()); ++i) {
      const exec_log::Event& e = log[static_cast<std::size_t>(i)];
      if (e.object == &model && e.what == "head_forward") last_forward = i;
      if (e.object == &model && e.what == "embed_backward") last_backward_end = i;
      if (e.what == "all_reduce" && e.group == world().name() && first_all_reduce < 0)
        first_all_reduce = i;
    }
    ASSERT_GE(first_all_reduce, 0) << "accum " << accum << ": no all-reduce on the world";
    if (first_all_reduce < last_forward || first_all_reduce > last_backward_end)
      LABTEST_FAIL() << "accum " << accum << ": the first all-reduce started "
                     << (first_all_reduce < last_forward ? "before the last micro-batch's forward"
                                                         : "after the last backward had ended")
                     << ": the buckets start from the last micro-batch's backward, each as soon "
                     << "as its gradients are ready, to overlap with the rest of that backward";
  }
}

TEST(Step2_DdpAccumulate, BadSplitsAreUsageErrors) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3));
  ddp.attach();
  EXPECT_THROW(lab05::ddp_accumulate(model, global_batch(), 0, world(), ddp), UsageError);
  EXPECT_THROW(lab05::ddp_accumulate(model, global_batch(), 64, world(), ddp), UsageError);
}

TEST(Step2_PlantedFault, SyncInEveryMicroBatchIsCaught) {
  // Without the no-sync scope every micro-batch's backward starts every bucket (and must then
  // be finished): twice the all-reduces, the first ones on half a gradient. The launch check of
  // Step2_DdpAccumulate sees both.
  const data::Batch b = global_batch();
  nn::GPT model(kLab.config(), {.seed = kSeed});
  LaunchCheck check{local_gradient(b)};
  lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3), check.launch());
  ddp.attach();
  const data::Batch mine = labtest::my_rows(b);
  model.zero_grad();
  for (const data::Batch& mb : lab05::micro_batches(mine, 2)) {
    lab05::micro_batch_step(model, mb, 2);  // fault: no NoSync around the first
    ddp.finish();
  }
  EXPECT_FALSE(check.problems.empty()) << "the launch check must see half-accumulated buckets";
  EXPECT_EQ(check.launches, 2 * static_cast<int>(ddp.buckets().size()))
      << "the launch count of Step2_DdpAccumulate must see the extra all-reduces";
}

// ---- Step 3 -------------------------------------------------------------------------------------

TEST(Step3_BatchPlan, GlobalIsMicroTimesAccumTimesDp) {
  const lab05::BatchPlan p = lab05::plan_batch(64, 4, 2);
  EXPECT_EQ(p.micro, 8) << "plan_batch(64, 4, 2): a global batch of 64 over accum 4 and dp 2";
  EXPECT_EQ(p.accum, 4) << "plan_batch(64, 4, 2)";
  EXPECT_EQ(p.dp, 2) << "plan_batch(64, 4, 2)";
  EXPECT_EQ(p.global, 64);
  EXPECT_EQ(p.micro * p.accum * p.dp, p.global);
  EXPECT_EQ(lab05::plan_batch(16, 1, 1).micro, 16);
  EXPECT_EQ(lab05::plan_batch(16, 16, 1).micro, 1);
  EXPECT_EQ(lab05::plan_batch(512, 8, 64).micro, 1);
  EXPECT_EQ(lab05::plan_batch(kGlobalBatch, 2, world().size()).micro, 8 / world().size());
}

TEST(Step3_BatchPlan, BadPlansAreUsageErrors) {
  EXPECT_THROW(lab05::plan_batch(16, 0, 2), UsageError) << "accum 0";
  EXPECT_THROW(lab05::plan_batch(16, -1, 2), UsageError) << "accum -1";
  EXPECT_THROW(lab05::plan_batch(16, 1, 0), UsageError) << "dp 0";
  EXPECT_THROW(lab05::plan_batch(16, 3, 2), UsageError) << "16 rows into 3 x 2";
  EXPECT_THROW(lab05::plan_batch(4, 1, 8), UsageError) << "more ranks than rows";
  EXPECT_THROW(lab05::plan_batch(8, 4, 4), UsageError) << "micro-batch of half a row";
  EXPECT_THROW(lab05::plan_batch(0, 1, 1), UsageError) << "a global batch of 0 rows";
  EXPECT_THROW(lab05::plan_batch(-8, 2, 2), UsageError) << "a global batch of -8 rows";
  EXPECT_THROW(lab05::plan_batch(6, 2, 2), UsageError)
      << "6 rows over accum 2 x dp 2 (each of 2 and 2 divides 6, their product does not)";
  try {
    lab05::plan_batch(16, 3, 2);
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("16"), std::string::npos) << e.what();
  }
}

TEST(Step3_BatchPlan, ThePlansMicroBatchesGiveTheGlobalBatchGradient) {
  // The plan's micro-batches of this rank, accumulated and averaged over the ranks (written
  // here, so step 3 is graded on its own): the single-device gradient of the global batch.
  const lab05::BatchPlan p = lab05::plan_batch(kGlobalBatch, 2, world().size());
  ASSERT_EQ(p.micro * p.accum * p.dp, kGlobalBatch);
  const data::Batch b = global_batch(3);
  const data::Batch mine = b.rows(world().rank() * p.micro * p.accum,
                                  (world().rank() + 1) * p.micro * p.accum);
  nn::GPT model(kLab.config(), {.seed = kSeed});
  model.zero_grad();
  for (int i = 0; i < p.accum; ++i) {
    model.forward(mine.x.rows(i * p.micro, (i + 1) * p.micro),
                  mine.y.rows(i * p.micro, (i + 1) * p.micro));
    model.backward(1.0 / p.accum);
  }
  world().all_reduce(model.params().grads(), comm::ReduceOp::avg);
  const train::Reference ref = kLab.reference(b);
  EXPECT_TRUE(close_on_every_rank(model.params().grads(), ref.grads, kDdpRtol, kDdpAtol));
  EXPECT_EQ(p.str(), fmt::format("global batch 16 = micro-batch {} x accum 2 x dp {}",
                                 8 / world().size(), world().size()));
}

// ---- Step 4 -------------------------------------------------------------------------------------

TEST(Step4_Memory, AccumulationCutsThePeak) {
  const data::Batch b = global_batch();
  nn::GPT model(kLab.config(), {.seed = kSeed});
  const std::size_t big = lab05::measure_step_peak_bytes(model, b, 1);
  const std::size_t four = lab05::measure_step_peak_bytes(model, b, 4);
  // the big batch's forward alone holds its activations: the peak is at least that
  nn::GPT probe(kLab.config(), {.seed = kSeed});
  probe.forward(b.x, b.y);
  EXPECT_GE(big, probe.activation_bytes());
  // activations scale with the rows: a quarter of the rows, about a quarter of the peak (the
  // fixed part is tiny here: temporaries of one layer)
  EXPECT_LT(four, big * 0.40) << "big batch " << big << " B, 4 micro-batches " << four << " B";
  EXPECT_GT(four, big * 0.15) << "big batch " << big << " B, 4 micro-batches " << four << " B";
  // measured, so repeatable (though another model, `probe`, is alive now)
  EXPECT_EQ(lab05::measure_step_peak_bytes(model, b, 4), four)
      << "the same step measured again, with another model alive: memory allocated before the "
         "step was counted (measure above what is held when the step starts)";
}

// The figure is measured around the step itself: the same bytes as the test's own measurement
// (the allocator's peak above the start, around one accumulate_gradients on a fresh model), not
// an estimate (the activations of one forward, one big batch's peak divided by accum).
TEST(Step4_Memory, MeasuredAroundTheStep) {
  const data::Batch b = global_batch();
  for (int accum : {1, 2, 4}) {
    nn::GPT mine(kLab.config(), {.seed = kSeed}), theirs(kLab.config(), {.seed = kSeed});
    const std::size_t want = peak_around_accumulation(mine, b, accum);
    const std::size_t got = lab05::measure_step_peak_bytes(theirs, b, accum);
    if (got != want)
      LABTEST_FAIL() << "measure_step_peak_bytes with accum " << accum << " gave " << got
                     << " bytes; the allocator's peak above the start around one "
                     << "accumulate_gradients on a fresh model is " << want
                     << " bytes: measure it, do not estimate it";
  }
}

// The sturdier sign of a measurement: while measure_step_peak_bytes runs, the execution log
// shows the step it measures, accum forwards and accum backwards.
TEST(Step4_Memory, RunsTheStepItMeasures) {
  const data::Batch b = global_batch();
  for (int accum : {1, 2, 4}) {
    nn::GPT model(kLab.config(), {.seed = kSeed});
    std::string ran;
    {
      exec_log::Recording rec;
      lab05::measure_step_peak_bytes(model, b, accum);
      ran = passes(rec.events(), model);
    }
    if (count_of(ran, 'F') != accum || count_of(ran, 'B') != accum)
      LABTEST_FAIL() << "measure_step_peak_bytes with accum " << accum << " ran "
                     << count_of(ran, 'F') << " forward(s) and " << count_of(ran, 'B')
                     << " backward(s): measure the step itself, run while the allocator watches";
  }
}

// Activations an earlier forward left in the model are not the step's, nor "allocated before" it:
// the step's own forward replaces them, so counting them as before would read the step low.
TEST(Step4_Memory, ActivationsAnEarlierForwardLeftAreNotTheSteps) {
  const data::Batch b = global_batch();
  nn::GPT fresh(kLab.config(), {.seed = kSeed}), used(kLab.config(), {.seed = kSeed});
  const std::size_t want = lab05::measure_step_peak_bytes(fresh, b, 2);
  used.forward(b.x, b.y);  // its activations stay in the model
  const std::size_t got = lab05::measure_step_peak_bytes(used, b, 2);
  if (got != want)
    LABTEST_FAIL() << "a model that still holds an earlier forward's activations measured " << got
                   << " bytes, a fresh one " << want
                   << ": free what the model holds of an earlier forward before measuring";
}

TEST(Step4_Memory, MeasuresAboveWhatWasAllocatedBefore) {
  const data::Batch b = global_batch();
  nn::GPT model(kLab.config(), {.seed = kSeed});
  const std::size_t alone = lab05::measure_step_peak_bytes(model, b, 2);
  Tensor ballast = Tensor::zeros({1 << 20});  // 4 MiB held across the measurement
  EXPECT_EQ(lab05::measure_step_peak_bytes(model, b, 2), alone)
      << "memory allocated before the step is not the step's";
}
