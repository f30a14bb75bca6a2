// Lab 04 graders. The heart: the overlapped, bucketed DDP gives the single-device gradient (and
// lab 03's), computed here on every rank, at 1e-5 relative / 1e-6 absolute (the all-reduce sums
// in another order; bucket boundaries may change the MPI algorithm too). When each bucket starts
// is checked through the Launch the reducer is given: at launch time, every gradient of the
// bucket must have been reported ready by backward. The planted fault (a bucket launched at its
// FIRST ready gradient) must fail both checks. Step 4 is graded through pure functions. Planted
// submissions (solutions/04_ddp_overlap/planted/cheats.plant, labs/04_ddp_overlap/lab.cmake)
// show the checks below catching mistakes that used to pass them (lab04.planted.*).
#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/reference.hpp"
#include "ddp.hpp"
#include "ddp_overlap.hpp"
#include "tests/04_ddp_overlap/test_buckets.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/lab_fixture.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"
#include "tests/support/what_it_did.hpp"

using namespace scalelab;
using labtest::my_rows;
using labtest::world;
using lab04::Bucket;

namespace {

constexpr labtest::Setup kLab{.seed = 404, .global_batch = 8, .corpus_seed = 4};
constexpr uint64_t kSeed = kLab.seed;
constexpr double kRtol = labtest::kAllReduceRtol, kAtol = labtest::kAllReduceAtol;

data::Batch global_batch(int64_t step = 0) { return kLab.batch(step); }

testing::AssertionResult close_on_every_rank(const Tensor& got, const Tensor& want) {
  return labtest::close_on_every_rank(got, want, kRtol, kAtol);
}
// ... its failure led by the divergence report's first line (the first tensor off the twin)
testing::AssertionResult close_on_every_rank(const Tensor& got, const Tensor& want,
                                             const labtest::Explain& why) {
  return labtest::close_on_every_rank(got, want, kRtol, kAtol, why);
}
// this rank's rows of the global batch in the twin's: [r b, (r + 1) b)
train::RowLayout my_layout() {
  return {.first_row = world().rank() * (kLab.global_batch / world().size())};
}

// Watches a backward: which parameters backward has reported ready, and every launch.
struct Watch {
  nn::GPT* model = nullptr;
  std::vector<Bucket> buckets;
  std::set<const nn::Parameter*> seen;  // reported ready so far
  bool in_backward = false;
  bool synchronous = false;             // the planted fault waits at once (deterministic)
  std::vector<int> launched;            // bucket indices in launch order
  std::vector<std::string> violations;  // launched too early, twice, or outside backward
  std::vector<comm::Work> works;

  lab04::Launch launch() {
    return [this](int b, const Tensor& grads) {
      const Bucket& bucket = buckets.at(b);
      for (int i : bucket.params)
        if (!seen.count(model->parameters()[i]))
          violations.push_back(fmt::format("bucket {} launched before {} was ready", b,
                                           model->parameters()[i]->name));
      if (std::count(launched.begin(), launched.end(), b))
        violations.push_back(fmt::format("bucket {} launched twice", b));
      if (!in_backward) violations.push_back(fmt::format("bucket {} launched after backward", b));
      if (grads.offset() != bucket.offset || grads.numel() != bucket.count)
        violations.push_back(fmt::format("bucket {}: launched elements [{}, +{}), the bucket is "
                                         "[{}, +{})", b, grads.offset(), grads.numel(),
                                         bucket.offset, bucket.count));
      launched.push_back(b);
      comm::Work w = world().all_reduce_async(grads);
      if (synchronous) w.wait();
      works.push_back(w);
      return w;
    };
  }

  // Runs forward + backward with `on_ready` as the hook, recording what became ready first.
  void backward(const data::Batch& b, const std::function<void(const std::vector<nn::Parameter*>&)>& on_ready) {
    model->set_backward_hook([&](const std::vector<nn::Parameter*>& done) {
      seen.insert(done.begin(), done.end());
      on_ready(done);
    });
    model->zero_grad();
    model->forward(b.x, b.y);
    in_backward = true;
    model->backward();
    in_backward = false;
    model->set_backward_hook({});
  }
};

std::vector<Bucket> buckets_for(nn::GPT& model, std::size_t cap) {
  return lab04::assign_buckets(model.params(), lab04::ready_order(model), cap);
}

// one parameter per bucket, a few (crossing layers), everything in one
const std::vector<std::size_t> kPer = {1, 3, 1000};

// The planted fault of step 2, written here: launch a bucket when its FIRST gradient is ready.
struct EagerFault {
  std::vector<Bucket> buckets;
  std::unordered_map<const nn::Parameter*, int> bucket_of;
  std::vector<bool> launched;
  EagerFault(nn::GPT& model, std::vector<Bucket> b) : buckets(std::move(b)), launched(buckets.size()) {
    for (std::size_t k = 0; k < buckets.size(); ++k)
      for (int i : buckets[k].params) bucket_of[model.parameters()[i]] = static_cast<int>(k);
  }
  void on_ready(nn::GPT& model, const lab04::Launch& launch, const std::vector<nn::Parameter*>& done) {
    for (const nn::Parameter* p : done) {
      const int k = bucket_of.at(p);
      if (launched[k]) continue;
      launched[k] = true;  // fault: the bucket's other gradients may not be ready
      // the watch's Launch keeps the Work (the test waits for watch.works)
      (void)launch(k, model.params().grads().flat(buckets[k].offset, buckets[k].count));
    }
  }
};

}  // namespace

// ---- Step 1: buckets -------------------------------------------------------------------------

TEST(Step1_Buckets, ReadyOrderIsReverseFlatOrderWithTheEmbeddingLast) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  const std::vector<int> order = lab04::ready_order(model);
  const int n = static_cast<int>(model.parameters().size());
  ASSERT_EQ(static_cast<int>(order.size()), n);
  for (int k = 0; k < n; ++k) EXPECT_EQ(order[k], n - 1 - k);
  EXPECT_EQ(model.parameters()[order.back()]->name, "wte.weight") << "the tied weight is ready last";
}

namespace {

// Every bucket one range with no gaps, within the cap unless alone, greedy, the buckets'
// parameters concatenated the order walked. `what` names the order in messages.
void expect_partition(const nn::ParameterSet& ps, const std::vector<int>& order, std::size_t cap,
                      const std::string& what) {
  const std::vector<Bucket> buckets = lab04::assign_buckets(ps, order, cap);
  const auto end = [&](int i) { return ps.offset(i) + ps.list()[i]->numel(); };
  std::vector<int> concatenated;
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const Bucket& b = buckets[k];
    const std::string at = fmt::format("{}, cap {} bytes, bucket {}", what, cap, k);
    ASSERT_FALSE(b.params.empty()) << at;
    int64_t lo = INT64_MAX, hi = 0, total = 0;
    for (std::size_t j = 0; j < b.params.size(); ++j) {
      const int i = b.params[j];
      // Each parameter that joined must touch the range of those before it in the bucket: the
      // all-reduce is one collective on one view, so a gap would reduce a neighbour's gradient.
      if (j > 0 && end(i) != lo && ps.offset(i) != hi)
        ADD_FAILURE() << at << " took " << ps.list()[i]->name << " (elements [" << ps.offset(i)
                      << ", " << end(i) << ")), not next to the bucket's range [" << lo << ", "
                      << hi << "): a parameter that is not adjacent opens a new bucket";
      lo = std::min(lo, ps.offset(i));
      hi = std::max(hi, end(i));
      total += ps.list()[i]->numel();
      concatenated.push_back(i);
    }
    EXPECT_EQ(b.offset, lo) << at << ": offset is the lowest element of its parameters";
    EXPECT_EQ(b.count, hi - lo) << at << ": one range";
    EXPECT_EQ(b.count, total) << at << ": no gaps";
    EXPECT_TRUE(b.count * 4 <= static_cast<int64_t>(cap) || b.params.size() == 1)
        << at << " holds " << b.count * 4 << " bytes";
    if (k + 1 < buckets.size()) {  // greedy: the next parameter did not fit
      const int next = buckets[k + 1].params.front();
      const bool adjacent = end(next) == b.offset || ps.offset(next) == b.offset + b.count;
      EXPECT_TRUE(!adjacent || (b.count + ps.list()[next]->numel()) * 4 > static_cast<int64_t>(cap))
          << at << " could have taken " << ps.list()[next]->name << " (a bucket may hold "
          << "exactly its cap)";
    }
  }
  EXPECT_EQ(concatenated, order) << what << ", cap " << cap << ": every parameter once, in order";
}

}  // namespace

TEST(Step1_Buckets, PartitionOfAdjacentGradientsWithinTheCap) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  const std::vector<int> order = lab04::ready_order(model);
  for (std::size_t cap : {std::size_t{1}, std::size_t{512}, std::size_t{4096},
                          std::size_t{64 << 10}, std::size_t{1} << 30})
    expect_partition(model.params(), order, cap, "ready order");
}

// The ready order of a GPT is the reverse of the flat buffer, where every next parameter is
// adjacent. assign_buckets takes any order (another model's backward may skip around): walked
// forward, each next parameter lies right AFTER the bucket; shuffled, most are not adjacent.
TEST(Step1_Buckets, AnyOrderKeepsEachBucketOneRange) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  std::vector<int> forward(model.parameters().size());
  std::iota(forward.begin(), forward.end(), 0);
  std::vector<int> shuffled = forward;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(404));  // fixed: same on every rank
  for (std::size_t cap : {std::size_t{512}, std::size_t{4096}, std::size_t{64 << 10},
                          std::size_t{1} << 30}) {
    expect_partition(model.params(), shuffled, cap, "shuffled order");
    expect_partition(model.params(), forward, cap, "flat-buffer order");
  }
  // A parameter that touches the far end of the bucket, not the one walked last: 5, then 4
  // (before 5), then 6 (after 5, not after 4): greedy, all three share one bucket.
  std::vector<int> far_end = {5, 4, 6};
  for (int i = 7; i < static_cast<int>(forward.size()); ++i) far_end.push_back(i);
  for (int i = 0; i < 4; ++i) far_end.push_back(i);
  for (std::size_t cap : {std::size_t{64 << 10}, std::size_t{1} << 30})
    expect_partition(model.params(), far_end, cap, "order 5, 4, 6, 7, ...");
}

// A cap of exactly ln_f's two parameters: a bucket may be filled to its cap, so they share one.
TEST(Step1_Buckets, ABucketMayHoldExactlyItsCap) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  const nn::ParameterSet& ps = model.params();
  const std::vector<int> order = lab04::ready_order(model);
  const int64_t two = ps.list()[order[0]]->numel() + ps.list()[order[1]]->numel();
  const std::size_t cap = static_cast<std::size_t>(two) * 4;
  const std::vector<Bucket> buckets = lab04::assign_buckets(ps, order, cap);
  ASSERT_FALSE(buckets.empty());
  EXPECT_EQ(buckets[0].params, (std::vector<int>{order[0], order[1]}))
      << "cap " << cap << " bytes = " << ps.list()[order[0]]->name << " + "
      << ps.list()[order[1]]->name << " exactly: both fit in the first bucket (a bucket stays "
      << "within the cap when it holds no more than the cap)";
  EXPECT_EQ(buckets[0].count, two);
  expect_partition(ps, order, cap, "ready order");
}

TEST(Step1_Buckets, SizesAndTheTiedEmbedding) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  const std::size_t n = model.parameters().size();
  EXPECT_EQ(buckets_for(model, 1).size(), n) << "a cap below every parameter: one each";
  const auto one = buckets_for(model, std::size_t{1} << 30);
  ASSERT_EQ(one.size(), 1u) << "a cap above the model: one bucket";
  EXPECT_EQ(one[0].offset, 0);
  EXPECT_EQ(one[0].count, model.num_parameters());
  const auto some = buckets_for(model, 4096);
  EXPECT_EQ(model.parameters()[some.back().params.back()]->name, "wte.weight")
      << "the tied embedding is in the last bucket";
}

TEST(Step1_Buckets, ZeroSizeIsAUsageError) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  EXPECT_THROW(lab04::assign_buckets(model.params(), lab04::ready_order(model), 0), UsageError);
}

// ---- Step 2: launch from the hook --------------------------------------------------------------

TEST(Step2_Launch, EachBucketStartsOnceWhenItsLastGradientIsReady) {
  // 3 per bucket first: a count that launches one gradient early shows there as a launch before
  // a gradient was ready; at 1 per bucket the same mistake launches nothing at all.
  for (std::size_t per : {std::size_t{3}, std::size_t{1}, std::size_t{1000}}) {
    const std::string at = fmt::format("{} parameter(s) per bucket", per);
    nn::GPT model(kLab.config(), {.seed = kSeed});
    Watch watch{&model, test_buckets(model, per)};
    lab04::OverlappedDDP ddp(model, world(), watch.buckets, watch.launch());
    watch.backward(my_rows(global_batch()), [&](const auto& done) { ddp.on_ready(done); });
    comm::wait_all(watch.works);
    EXPECT_TRUE(watch.violations.empty()) << at << ": " << watch.violations.front();
    if (watch.launched.size() != watch.buckets.size()) {  // go on to the next bucket size
      ADD_FAILURE() << at << ": " << watch.launched.size() << " of " << watch.buckets.size()
                    << " buckets went through the Launch given to the reducer (launch_) during "
                    << "backward: each bucket's all-reduce starts through launch_, once, when "
                    << "its last gradient is ready";
      continue;
    }
    std::vector<int> sorted = watch.launched;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t k = 0; k < sorted.size(); ++k)
      EXPECT_EQ(sorted[k], static_cast<int>(k)) << at << ": each bucket once";
    // Collectives match by order: every rank must start the buckets in the same order.
    std::vector<double> order(watch.launched.begin(), watch.launched.end());
    EXPECT_EQ(train::max_divergence_from_rank0(
                  Tensor::from_vector(order, {static_cast<int64_t>(order.size())}), world()),
              0.0)
        << at << ": the same launch order on every rank";
  }
}

TEST(Step2_Launch, BucketsStartDuringBackwardNotAfter) {
  // With one bucket per parameter, the first bucket must start while backward still has every
  // block to go: overlap, not a flat all-reduce at the end.
  nn::GPT model(kLab.config(), {.seed = kSeed});
  Watch watch{&model, test_buckets(model, 1)};
  lab04::OverlappedDDP ddp(model, world(), watch.buckets, watch.launch());
  std::size_t launched_at_first_block_hook = SIZE_MAX;
  watch.backward(my_rows(global_batch()), [&](const auto& done) {
    ddp.on_ready(done);
    if (launched_at_first_block_hook == SIZE_MAX && done.front()->name.rfind("blocks.", 0) == 0)
      launched_at_first_block_hook = watch.launched.size();
  });
  comm::wait_all(watch.works);
  EXPECT_GE(launched_at_first_block_hook, 2u) << "ln_f's buckets start before the blocks' backward";
  EXPECT_TRUE(watch.violations.empty()) << watch.violations.front();
}

// Nothing waits for an all-reduce during the backward (the execution log's waits): a hook that
// waits for the bucket it launched gives the right gradients with no overlap at all, and
// step 4's table then counts the waits as backward time (a better "hidden" figure than real
// overlap).
TEST(Step2_Launch, NothingWaitsForABucketDuringTheBackward) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  Watch watch{&model, test_buckets(model, 3)};
  lab04::OverlappedDDP ddp(model, world(), watch.buckets, watch.launch());
  const std::vector<exec_log::Event> log = labtest::log_of([&] {
    watch.backward(my_rows(global_batch()), [&](const auto& done) { ddp.on_ready(done); });
  });
  comm::wait_all(watch.works);
  const auto waited = std::count_if(log.begin(), log.end(), [](const exec_log::Event& e) {
    return e.what == "wait" && e.op == "all_reduce";
  });
  if (waited > 0)
    LABTEST_FAIL() << "the backward waited for " << waited << " all-reduce(s) of the "
                   << watch.launched.size() << " buckets it launched: a hook that waits stops "
                   << "the backward until its bucket is summed, so nothing overlaps; keep the "
                   << "Work and wait in finish()";
}

TEST(Step2_PlantedFault, BucketLaunchedBeforeItsLastGradientIsCaught) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  Watch watch{&model, test_buckets(model, 3)};
  watch.synchronous = true;
  EagerFault fault(model, watch.buckets);
  const lab04::Launch launch = watch.launch();
  const data::Batch global = global_batch();
  watch.backward(my_rows(global), [&](const auto& done) { fault.on_ready(model, launch, done); });
  comm::wait_all(watch.works);
  EXPECT_FALSE(watch.violations.empty()) << "the launch check of Step2_Launch must see it";
  if (world().size() > 1) {
    ops::scale(model.params().grads(), 1.0 / world().size());
    EXPECT_FALSE(close_on_every_rank(model.params().grads(),
                                     kLab.reference(global).grads))
        << "the equivalence check of Step3 must fail for gradients all-reduced too early";
  }
}

// ---- Step 3: finish -----------------------------------------------------------------------------

TEST(Step3_Finish, ABucketNeverLaunchedIsAnError) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3));
  try {  // (not EXPECT_THROW: a NotImplemented must escape, so the grader says which step)
    ddp.finish();
    ADD_FAILURE() << "finish() without a backward must fail: nothing was launched";
  } catch (const CheckFailed&) {
  }
}

// finish() waits for every bucket's all-reduce (the execution log: each launched all-reduce has a
// wait before finish returns): waiting for the last one only is right on an in-order backend,
// but the others' errors are lost and their times are not their own.
TEST(Step3_Finish, WaitsForEveryBucket) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3));
  const data::Batch mine = my_rows(global_batch());
  ddp.attach();
  const std::vector<exec_log::Event> log = labtest::log_of([&] {
    model.zero_grad();
    model.forward(mine.x, mine.y);
    model.backward();
    ddp.finish();
  });
  const labtest::Waits waits = labtest::waits_in(log, "all_reduce");
  if (!waits.unwaited.empty())
    LABTEST_FAIL() << "finish() returned with " << waits.unwaited.size() << " of the "
                   << waits.started
                   << " buckets' all-reduces never waited for: wait for every bucket's Work, in "
                   << "launch order (its time is when its wait returns)";
}

TEST(Step3_Finish, GradientsEqualSingleDeviceForEveryBucketSize) {
  const data::Batch global = global_batch();
  const train::Reference ref = kLab.reference(global);
  for (std::size_t per : kPer) {
    const std::string at = fmt::format("{} parameter(s) per bucket", per);
    nn::GPT model(kLab.config(), {.seed = kSeed});
    // The buckets first: test_buckets runs a forward + backward of its own (ready_order), which
    // the explainer would record as the step's and then blame the forward for any mistake.
    lab04::OverlappedDDP ddp(model, world(), test_buckets(model, per));
    labtest::Explain why(model, {.seed = kSeed}, my_layout());  // a failure names where
    ddp.attach();
    model.zero_grad();
    model.forward(my_rows(global).x, my_rows(global).y);
    model.backward();
    const std::vector<double> done = ddp.finish();
    why.step_done(global);
    EXPECT_EQ(done.size(), ddp.buckets().size()) << at << ": one time per bucket";
    EXPECT_TRUE(close_on_every_rank(model.params().grads(), ref.grads, why)) << at;
  }
}

TEST(Step3_Finish, EqualsLab03AndKeepsWorkingStepAfterStep) {
  constexpr int kSteps = 3;
  constexpr double kLr = 0.5;
  nn::GPT model(kLab.config(), {.seed = kSeed}), flat(kLab.config(), {.seed = kSeed});
  lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3));
  ddp.attach();
  optim::SGD sgd(optim::groups(model.parameters())), sgd_flat(optim::groups(flat.parameters()));
  for (int step = 0; step < kSteps; ++step) {
    const data::Batch global = global_batch(step);
    model.zero_grad();
    model.forward(my_rows(global).x, my_rows(global).y);
    model.backward();
    ddp.finish();
    lab03::forward_backward(flat, global, world());  // lab 03: one flat all-reduce
    EXPECT_TRUE(close_on_every_rank(model.params().grads(), flat.params().grads())) << "step " << step;
    sgd.step(kLr);
    sgd_flat.step(kLr);
  }
  EXPECT_TRUE(close_on_every_rank(model.params().values(), flat.params().values()));
  EXPECT_EQ(train::max_divergence_from_rank0(model.params().values(), world()), 0.0)
      << "replicas stay identical";
}

// Step 3 on the simulated GPU (tests/support/on_sim.hpp): the same buckets, backward and finish()
// with the model there give the host's averaged gradients bit for bit; a loop through a bucket's
// elements stops with the tensor's own line, as it would on a GPU; and the buckets' launches and
// finish() copy nothing between the host and the device (an average made on a host copy of a
// bucket is right, and crosses PCIe twice a step on a GPU: host_device_copies()).
TEST(Step3_Finish, RunsOnTheSimulatedGpuAsOnTheHost) {
  const data::Batch mine = my_rows(global_batch());
  const auto step = [&](nn::GPT& model) {
    lab04::OverlappedDDP ddp(model, world(), test_buckets(model, 3));
    ddp.attach();
    const data::Batch on = mine.to(model.device());
    model.zero_grad();
    model.forward(on.x, on.y);
    return labtest::copies_of([&] {
      model.backward();
      ddp.finish();
    });
  };
  nn::GPT host(kLab.config(), {.seed = kSeed}), sim(kLab.config(), {.device = Device::sim(), .seed = kSeed});
  step(host);
  std::string same;
  HostDeviceCopies moved;
  labtest::collective_run_on_sim([&] {
    moved = step(sim);
    same = labtest::same_on_sim("the averaged gradients", host.params().grads(), sim.params().grads());
  });
  if (!same.empty()) LABTEST_FAIL() << same;
  const std::string copied = labtest::copies_problem(
      "the backward's bucket launches and finish()", moved, sim.params().grads().nbytes());
  if (!copied.empty()) LABTEST_FAIL() << copied;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

// ---- Step 4: measuring -------------------------------------------------------------------------

TEST(Step4_Measure, ExposedTime) {
  EXPECT_DOUBLE_EQ(lab04::exposed_time(10, {5, 8, 9}), 0) << "all done under backward";
  EXPECT_DOUBLE_EQ(lab04::exposed_time(10, {12, 15, 11}), 5)
      << "the bucket that finishes latest (the largest time) counts, not the last entry: "
      << "the times are in launch order, not sorted";
  EXPECT_DOUBLE_EQ(lab04::exposed_time(10, {3, 10.5}), 0.5);
  EXPECT_DOUBLE_EQ(lab04::exposed_time(10, {}), 0);
}

TEST(Step4_Measure, HiddenFraction) {
  EXPECT_DOUBLE_EQ(lab04::hidden_fraction(0, 5), 1) << "nothing exposed: all hidden";
  EXPECT_DOUBLE_EQ(lab04::hidden_fraction(5, 5), 0) << "all exposed: nothing hidden";
  EXPECT_DOUBLE_EQ(lab04::hidden_fraction(1.25, 5), 0.75);
  EXPECT_DOUBLE_EQ(lab04::hidden_fraction(7, 5), 0) << "clamped: waiting longer than the comm";
  EXPECT_DOUBLE_EQ(lab04::hidden_fraction(1, 0), 0) << "no communication: nothing to hide";
  EXPECT_DOUBLE_EQ(lab04::hidden_fraction(0, 0), 0)
      << "no communication: nothing to hide (0 / 0 is not a number)";
  EXPECT_DOUBLE_EQ(lab04::hidden_fraction(1, -1), 0)
      << "a total that is not positive: nothing to hide";
}
