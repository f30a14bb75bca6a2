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
#include <gtest/gtest.h>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
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
    const double loss = lab05::ddp_accumulate(model, b, accum, world(), ddp);
    why.step_done(b);
    EXPECT_EQ(check.launches, static_cast<int>(ddp.buckets().size()))
        << "accum " << accum << ": each bucket all-reduced once per step, not per micro-batch";
    EXPECT_TRUE(check.problems.empty()) << "accum " << accum << ": " << check.problems.front();
    EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss) << "accum " << accum << ": the global loss";
    EXPECT_TRUE(close_on_every_rank(model.params().grads(), ref.grads, kDdpRtol, kDdpAtol, why))
        << "accum " << accum;
  }
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
    lab05::ddp_accumulate(model, b, 2, world(), ddp);
    sgd.step(kLr);
    single.zero_grad();
    single.forward(b.x, b.y);
    single.backward();
    sgd1.step(kLr);
  }
  EXPECT_TRUE(close_on_every_rank(model.params().values(), single.params().values(), kDdpRtol,
                                  kDdpAtol));
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
