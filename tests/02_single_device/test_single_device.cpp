// Lab 02 graders: one suite per step (Step<K>_...). Hermetic: the corpus is generated
// (labtest::sentence_corpus, tests/support/lab_fixture.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/allocator.hpp"
#include "common/ops/ops.hpp"
#include "common/scalar.hpp"
#include "library_training_loop.hpp"
#include "single_device.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/lab_fixture.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"
#include "tests/support/what_it_did.hpp"

using namespace scalelab;
using namespace scalelab::lab02;

namespace {
// Four sentences in a seeded random order: structure a tiny model learns in a few hundred steps.
const std::vector<uint16_t>& corpus() {
  return labtest::sentence_corpus(/*seed=*/99, /*sentences=*/600);
}

nn::GPTOptions f64() {
  nn::GPTOptions o;
  o.dtype = DType::f64;
  return o;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "_" + std::to_string(::getpid()) + ".ckpt")).string();
}
}  // namespace

// ---- Step 1 -----------------------------------------------------------------------------------

TEST(Step1_TrainStep, ReturnsTheForwardLossAndUpdates) {
  nn::GPT model(model_config("tiny"));
  nn::GPT reference(model_config("tiny"));
  optim::AdamW opt(optim::groups(model.parameters()));
  data::Sampler s(corpus(), 4, 16, 1);
  const data::Batch b = s.batch(0);
  const double expected = reference.loss(b.x, b.y);
  const double loss = train_step(model, opt, b, 1e-3, 0.0);
  EXPECT_NEAR(loss, expected, 1e-6) << "train_step returns the loss of the forward pass";
  EXPECT_EQ(opt.steps(), 1) << "one optimizer step per train_step";
  EXPECT_LT(model.loss(b.x, b.y), loss) << "the update lowers the loss on the same batch";
}

TEST(Step1_TrainStep, ZeroesGradientsEveryStep) {
  // with zeroed gradients the second step's gradient is that of the second batch alone
  nn::GPT model(model_config("tiny"), f64());
  optim::AdamW opt(optim::groups(model.parameters()));
  data::Sampler s(corpus(), 2, 8, 2);
  train_step(model, opt, s.batch(0), 0.0, 0.0);  // lr 0: parameters unchanged
  train_step(model, opt, s.batch(1), 0.0, 0.0);
  Tensor after_two = model.params().grads().clone();
  nn::GPT fresh(model_config("tiny"), f64());
  fresh.zero_grad();
  fresh.forward(s.batch(1).x, s.batch(1).y);
  fresh.backward();
  for (int64_t i = 0; i < after_two.numel(); i += 97) {
    const double got = after_two.item(i), alone = fresh.params().grads().item(i);
    if (!(std::abs(got - alone) <= 1e-12)) {
      // the words first: the values only say where
      ADD_FAILURE() << "gradients must be zeroed before backward: after two train_steps the "
                    << "gradient is not the second batch's alone (element " << i << ": " << got
                    << ", the second batch's gradient " << alone << ")";
      return;
    }
  }
}

// One forward and one backward a step (the work counters): a second forward for the loss
// (model.loss beside model.forward) gives the right numbers at twice the forward's cost.
TEST(Step1_TrainStep, DoesOneForwardAndOneBackward) {
  nn::GPT model(model_config("tiny")), twin(model_config("tiny"));
  optim::AdamW opt(optim::groups(model.parameters()));
  data::Sampler s(corpus(), 4, 16, 4);
  const data::Batch b = s.batch(0);
  const ops::WorkCount did = labtest::work_of([&] { train_step(model, opt, b, 1e-3, 0.0); });
  const ops::WorkCount want = labtest::work_of([&] {
    twin.zero_grad();
    twin.forward(b.x, b.y);
    twin.backward();
  });
  if (!(did == want))
    LABTEST_FAIL() << "train_step did " << did.matmul_flops << " matmul FLOPs and "
                   << did.layernorm_rows << " LayerNorm rows; one forward and one backward of "
                   << "the batch do " << want.matmul_flops << " and " << want.layernorm_rows
                   << ": the loss is the forward's own (a second forward, model.loss, doubles "
                   << "the forward's cost)";
}

TEST(Step1_TrainStep, LossGoesDown) {
  nn::GPT model(model_config("tiny"));
  optim::AdamW opt(optim::groups(model.parameters()), {0.9, 0.95, 1e-8, 0.0});
  data::Sampler s(corpus(), 8, 16, 3);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    const double loss = train_step(model, opt, s.batch(step), 3e-3, 0.0);
    if (step == 0) first = loss;
    last = loss;
  }
  EXPECT_LT(last, first - 1.5) << "60 steps should take tiny well below its initial loss";
}

TEST(Step1_Checkpoint, ResumeReproducesTheUninterruptedRun) {
  // bitwise: same data (seed, step), same state, deterministic kernels (no clipping: step 2 is
  // graded on its own)
  data::Sampler s(corpus(), 4, 16, 4);
  TrainConfig tc;
  tc.steps = 8;
  tc.warmup = 2;
  std::vector<double> straight, resumed;
  {
    nn::GPT model(model_config("tiny"));
    optim::AdamW opt(optim::groups(model.parameters()));
    for (int step = 0; step < 8; ++step)
      straight.push_back(train_step(model, opt, s.batch(step), 1e-3, 0.0));
  }
  const std::string path = temp_path("lab02_resume");
  {
    nn::GPT model(model_config("tiny"));
    optim::AdamW opt(optim::groups(model.parameters()));
    for (int step = 0; step < 4; ++step)
      resumed.push_back(train_step(model, opt, s.batch(step), 1e-3, 0.0));
    save_checkpoint(path, model, opt, 4);
  }
  {
    nn::GPT model(model_config("tiny"), {.seed = 999});  // other init: the checkpoint wins
    optim::AdamW opt(optim::groups(model.parameters()));
    const int64_t start = load_checkpoint(path, model, opt);
    EXPECT_EQ(start, 4);
    for (int64_t step = start; step < 8; ++step)
      resumed.push_back(train_step(model, opt, s.batch(step), 1e-3, 0.0));
    nn::GPT small(model_config("small"));
    optim::AdamW small_opt(optim::groups(small.parameters()));
    EXPECT_THROW(load_checkpoint(path, small, small_opt), UsageError);
  }
  EXPECT_EQ(straight, resumed);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::filesystem::remove(path);
}

// ---- Step 2 -----------------------------------------------------------------------------------

TEST(Step2_Schedule, WarmupCosineFloor) {
  TrainConfig c;
  c.max_lr = 1e-3;
  c.min_lr = 1e-4;
  c.warmup = 10;
  c.steps = 110;
  // each value with what it means first (the expected number alone says nothing)
  auto rate_is = [&](int64_t step, double expected, const char* meaning) {
    const double got = learning_rate(step, c);
    if (!(std::abs(got - expected) <= 1e-15))
      ADD_FAILURE() << meaning << ": learning_rate(" << step << ") is " << got << ", expected "
                    << expected << " (max_lr 1e-3, min_lr 1e-4, warmup 10, steps 110)";
  };
  rate_is(0, 1e-3 / 11, "warmup: the first step's rate is not 0 (step 0 already trains)");
  rate_is(9, 1e-3 * 10 / 11, "warmup: the rate rises linearly, the last warmup step just "
                             "below max_lr");
  rate_is(10, 1e-3, "the end of warmup: step `warmup` is at max_lr");
  rate_is(60, 5.5e-4, "cosine: half way through the decay the rate is the mean of max_lr and "
                      "min_lr");
  rate_is(110, 1e-4, "the decay ends at min_lr at step `steps`");
  rate_is(1000, 1e-4, "after `steps` the rate stays at min_lr");
  for (int64_t s = 10; s < 110; ++s)
    EXPECT_LE(learning_rate(s + 1, c), learning_rate(s, c))
        << "the cosine decay never rises: step " << s + 1 << " is above step " << s;
}

TEST(Step2_Clip, GlobalNormOverAllParameters) {
  nn::GPT model(model_config("tiny"), f64());
  Tensor& g = model.params().grads();
  ops::fill(g, 0.0);
  // 3 in the first parameter, 4 in the last: the global norm is 5, not either alone
  g.data<double>()[0] = 3.0;
  g.data<double>()[g.numel() - 1] = 4.0;
  EXPECT_NEAR(clip_gradients(model, 10.0), 5.0, 1e-12);
  EXPECT_EQ(g.item(0), 3.0) << "below max_norm nothing changes";
  EXPECT_NEAR(clip_gradients(model, 1.0), 5.0, 1e-12) << "returns the norm before clipping";
  EXPECT_NEAR(g.item(0), 0.6, 1e-6);
  EXPECT_NEAR(g.item(g.numel() - 1), 0.8, 1e-6);
}

TEST(Step2_Clip, TrainStepClipsBeforeTheUpdate) {
  // Three steps with a small clip (every step's norm above it: asserted) against the library's
  // step (library_training_loop.hpp), float64, parameters within 1e-12. AdamW divides by the
  // gradient's running RMS, so one step moves almost as far clipped as not: three steps, clipped
  // by different factors, tell a step that clips before the update from one that does not.
  nn::GPT model(model_config("tiny"), f64()), lib(model_config("tiny"), f64());
  optim::AdamW opt(optim::groups(model.parameters())), lib_opt(optim::groups(lib.parameters()));
  data::Sampler s(corpus(), 4, 16, 9);
  const double clip = 0.05, lr = 1e-2;
  for (int step = 0; step < 3; ++step) {
    // the parameters after each step (not the losses: a step off shows first there)
    const data::Batch b = s.batch(step);
    train_step(model, opt, b, lr, clip);
    double norm = 0;
    lab02test::library_train_step(lib, lib_opt, b, lr, clip, &norm);
    ASSERT_GT(norm, clip) << "the test's premise: the gradient norm is above the clip";
    const Tensor& got = model.params().values();
    const Tensor& want = lib.params().values();
    for (int64_t i = 0; i < got.numel(); ++i) {
      if (!(std::abs(got.item(i) - want.item(i)) <= 1e-12)) {
        ADD_FAILURE() << "with clip > 0 the update must use the clipped gradients: after "
                      << step + 1 << " train_step(s) at clip 0.05 (every gradient "
                      << "norm above it) parameter " << i << " is " << got.item(i)
                      << ", with the gradients clipped before each AdamW step " << want.item(i)
                      << " (README.md#step-1)";
        return;
      }
    }
  }
}

namespace {
// How many numbers one train_step copies back to the host (common/scalar.hpp's host_reads()).
int64_t reads_of_a_step(nn::GPT& model, optim::AdamW& opt, const data::Batch& b, double clip) {
  const int64_t before = host_reads();
  train_step(model, opt, b, 1e-3, clip);
  return host_reads() - before;
}
}  // namespace

TEST(Step2_Clip, ClippingReadsNothingBackToTheHost) {
  // On a GPU each number read back waits for every kernel queued before it: a norm read back
  // waits for the whole backward. Clipping (the clip of 1e-3 always clips) may add no read.
  nn::GPT model(model_config("tiny"));
  optim::AdamW opt(optim::groups(model.parameters()));
  data::Sampler s(corpus(), 4, 16, 10);
  const int64_t without = reads_of_a_step(model, opt, s.batch(0), 0.0);
  const int64_t with = reads_of_a_step(model, opt, s.batch(1), 1e-3);
  if (with > without)
    ADD_FAILURE() << "clipping read numbers back to the host: a train_step read " << with
                  << " number(s) with clip > 0, " << without << " without; keep the norm, its "
                  << "test and the scaling on the gradients' device (README.md#step-2)";
  else if (with > 1)  // clipping done (and read) at clip 0 too
    LABTEST_FAIL() << "a train_step read " << with << " numbers back to the host with clip > 0 ("
                  << without << " at clip 0); its one read is the loss it returns: keep the "
                  << "norm, its test and the scaling on the gradients' device (README.md#step-2)";
}

TEST(Step2_OwnWork, TheScheduleAndClippingAreYourOwn) {
  // the library's versions are for the later labs (README.md#step-2)
  EXPECT_TRUE(labtest::calls_none_of({"scalelab::optim::cosine_lr(",
                                      "scalelab::optim::clip_grad_norm("},
                                     "step 2 asks for your own schedule and clipping"));
}

// ---- Step 3 -----------------------------------------------------------------------------------

// Steps 1 and 2 with the model and the batches on the simulated GPU (tests/support/on_sim.hpp):
// three train_steps at clip 0.05 give the host's losses and parameters bit for bit. A loop over
// the gradients' elements, or a buffer made without their device, stops with the tensor's or the
// op's own line, as it would on a GPU.
TEST(Step2_Clip, RunsOnTheSimulatedGpuAsOnTheHost) {
  nn::GPT host(model_config("tiny")), sim(model_config("tiny"), {.device = Device::sim()});
  optim::AdamW host_opt(optim::groups(host.parameters())), sim_opt(optim::groups(sim.parameters()));
  data::Sampler s(corpus(), 4, 16, 11);
  std::vector<std::string> problems;
  problems.push_back(labtest::runs_on_sim([&] {
    for (int step = 0; step < 3; ++step) {
      const data::Batch b = s.batch(step);
      const double want = train_step(host, host_opt, b, 1e-2, 0.05);
      const data::Batch on = b.to(sim.device());
      double got = 0;
      const HostDeviceCopies moved =
          labtest::copies_of([&] { got = train_step(sim, sim_opt, on, 1e-2, 0.05); });
      if (got != want)
        problems.push_back(fmt::format("step {}: the loss on the simulated GPU is {} (the "
                                       "host's {})", step, got, want));
      // the loss comes back (one f64: 8 bytes), nothing else crosses
      if (moved.to_host > 8 || moved.to_device > 0)
        problems.push_back(labtest::copies_problem(
            fmt::format("train_step (step {}, clip 0.05; its loss is 8 of those bytes)", step),
            moved, sim.params().grads().nbytes()));
    }
    problems.push_back(labtest::same_on_sim("the parameters after three clipped steps",
                                            host.params().values(), sim.params().values()));
  }));
  const std::string all = labtest::joined(problems);
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

TEST(Step3_Evaluate, MeanOfBatchLossesWithoutSideEffects) {
  nn::GPT model(model_config("tiny"));
  data::Sampler val(corpus(), 4, 16, 5);
  double expected = 0;
  for (int i = 0; i < 3; ++i) expected += model.loss(val.batch(i).x, val.batch(i).y) / 3;
  ops::fill(model.params().grads(), 0.5);
  const std::size_t before = memory_stats(Device::cpu()).current;
  const double got = evaluate(model, val, 3);
  if (!(std::abs(got - expected) <= 1e-6))
    ADD_FAILURE() << "evaluate(model, val, 3) must be the mean loss over the first 3 validation "
                  << "batches (0, 1, 2), each weighted equally: got " << got << ", expected "
                  << expected;
  EXPECT_EQ(model.params().grads().item(0), 0.5) << "evaluation must not touch gradients";
  EXPECT_EQ(memory_stats(Device::cpu()).current, before) << "evaluation keeps no activations";
}

// Evaluation never holds a training forward's activations, not even for a moment: a forward
// that keeps them (then frees them) would also replace those of a step in progress. Its peak
// stays below what one training forward of a batch keeps (the allocator).
TEST(Step3_Evaluate, NeverHoldsATrainingForwardsActivations) {
  nn::GPT model(model_config("tiny"));
  data::Sampler val(corpus(), 4, 16, 5);
  const Device cpu = Device::cpu();
  std::size_t kept = 0;  // what a training forward of one batch keeps
  {
    nn::GPT twin(model_config("tiny"));
    const std::size_t at = memory_stats(cpu).current;
    twin.forward(val.batch(0).x, val.batch(0).y);
    kept = memory_stats(cpu).current - at;
  }
  reset_peak_memory(cpu);
  const std::size_t before = memory_stats(cpu).current;
  evaluate(model, val, 3);
  const std::size_t peak = memory_stats(cpu).peak - before;
  if (peak >= kept)
    LABTEST_FAIL() << "evaluate's peak was " << peak << " bytes above its start; a training "
                        << "forward keeps " << kept << " of activations: evaluate with the "
                        << "model's evaluation forward (no activations kept), not forward()";
}

namespace {
// How many numbers `eval` copies back to the host (common/scalar.hpp's host_reads()): the
// batches' losses are Scalars on the model's device, so their sum needs one copy, not one a
// batch (on a GPU each copy waits for every kernel queued before it).
::testing::AssertionResult reads_the_mean_once(const std::function<double()>& eval) {
  const int64_t before = host_reads();
  eval();
  const int64_t reads = host_reads() - before;
  if (reads == 1) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "evaluation read " << reads << " number(s) back to the host; add the batches' "
         << "losses where they are (Scalar) and read the mean once (README.md#step-3)";
}
}  // namespace

TEST(Step3_Evaluate, ReadsTheMeanBackOnce) {
  nn::GPT model(model_config("tiny"));
  data::Sampler val(corpus(), 4, 16, 5);
  EXPECT_TRUE(reads_the_mean_once([&] { return evaluate(model, val, 3); }));
}

// The fault planted: every batch's loss read back as a double and summed on the host (the right
// value, so only the read count shows it).
TEST(Step3_PlantedFault, ReadingEachBatchBackIsCaught) {
  nn::GPT model(model_config("tiny"));
  data::Sampler val(corpus(), 4, 16, 5);
  const ::testing::AssertionResult got = reads_the_mean_once([&] {
    double total = 0;
    for (int i = 0; i < 3; ++i) total += model.loss(val.batch(i).x, val.batch(i).y);
    return total / 3;
  });
  EXPECT_FALSE(got);
  EXPECT_NE(std::string(got.message()).find("read 3 number(s)"), std::string::npos)
      << got.message();
}

// evaluate with the model on the simulated GPU: the host's mean bit for bit (the validation
// batches are drawn on the host: each goes to the model's device first).
TEST(Step3_Evaluate, RunsOnTheSimulatedGpuAsOnTheHost) {
  nn::GPT host(model_config("tiny")), sim(model_config("tiny"), {.device = Device::sim()});
  data::Sampler val(corpus(), 4, 16, 5);
  const double want = evaluate(host, val, 3);
  double got = 0;
  const std::string stopped = labtest::runs_on_sim([&] { got = evaluate(sim, val, 3); });
  if (!stopped.empty())
    LABTEST_FAIL() << stopped;
  else if (got != want)
    LABTEST_FAIL() << "evaluate on the simulated GPU gave " << got << ", the host " << want;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

TEST(Step3_Evaluate, TrainingLowersValidationLoss) {
  // tiny on the synthetic corpus: val loss below 2.0 after 200 steps (measured 1.48 on this
  // build; a model that only learned byte frequencies sits near 2.8, an untrained one at 5.5)
  const auto& tokens = corpus();
  const std::size_t n = tokens.size() * 9 / 10;
  const std::vector<uint16_t> tr(tokens.begin(), tokens.begin() + n), va(tokens.begin() + n, tokens.end());
  data::Sampler train(tr, 8, 16, 6), val(va, 8, 16, 7);
  nn::GPT model(model_config("tiny"));
  optim::AdamW opt(optim::groups(model.parameters()), {0.9, 0.95, 1e-8, 0.0});
  TrainConfig tc;
  tc.max_lr = 3e-3;
  tc.min_lr = 3e-4;
  tc.steps = 200;
  tc.warmup = 10;
  const double before = evaluate(model, val, 4);
  // trained with the library's loop, so this step is graded on its own (not through steps 1-2)
  lab02test::library_train(model, opt, train, tc);
  const double after = evaluate(model, val, 4);
  EXPECT_NEAR(before, std::log(256.0), 0.2);
  EXPECT_LT(after, 2.0);
}

// ---- Step 4 -----------------------------------------------------------------------------------

TEST(Step4_Throughput, TokensPerSecond) {
  EXPECT_DOUBLE_EQ(tokens_per_second(1000, 0.5), 2000.0);
  EXPECT_EQ(tokens_per_second(1000, 0.0), 0.0);
}

TEST(Step4_Throughput, FlopsPerTokenAndMfu) {
  const ModelConfig c = model_config("gpt-85m");
  // N without wpe: 86039040 - 1024 * 768; attention: 12 * 12 layers * 12 heads * 64 * T
  EXPECT_DOUBLE_EQ(flops_per_token(c, 1024), 6.0 * (86039040 - 786432) + 12.0 * 12 * 12 * 64 * 1024);
  EXPECT_DOUBLE_EQ(flops_per_token(c, 256), 6.0 * (86039040 - 786432) + 12.0 * 12 * 12 * 64 * 256);
  EXPECT_DOUBLE_EQ(mfu(1e6, 1e9, 2000.0), 0.5);  // 1 PFLOP/s achieved of 2
  EXPECT_EQ(mfu(1e6, 1e9, 0.0), 0.0);
}

// A count from the config: no model built, no tensor allocated (the allocator's peak).
TEST(Step4_Throughput, TheFlopCountIsAFormula) {
  const Device cpu = Device::cpu();
  reset_peak_memory(cpu);
  const std::size_t before = memory_stats(cpu).current;
  flops_per_token(model_config("small"), 64);
  if (memory_stats(cpu).peak != before)
    LABTEST_FAIL() << "flops_per_token allocated " << memory_stats(cpu).peak - before
                   << " bytes: count from the config's sizes (step 5's parameter_count), do not "
                   << "build the model";
}

TEST(Step4_OwnWork, TheFlopCountAndMfuAreYourOwn) {
  // the library's versions are for the later labs (README.md#step-4)
  EXPECT_TRUE(labtest::calls_none_of({"scalelab::metrics::flops_per_token(",
                                      "scalelab::metrics::mfu("},
                                     "step 4 asks for your own flops_per_token and mfu"));
}

// ---- Step 5 -----------------------------------------------------------------------------------

TEST(Step5_Memory, FormulaForWeightsGradsAndAdam) {
  const ModelConfig c = model_config("small");
  const MemoryEstimate m = estimate_memory(c, 16, 64, 4);
  const int64_t N = parameter_count(c);
  EXPECT_EQ(m.weights, 4 * N);
  EXPECT_EQ(m.gradients, 4 * N);
  EXPECT_EQ(m.optimizer, 8 * N);
  EXPECT_EQ(m.total(), m.weights + m.gradients + m.optimizer + m.activations);
  // 2-byte elements (bf16): every kind is that wide, not only the weights
  const MemoryEstimate h = estimate_memory(c, 16, 64, 2);
  auto bytes_are = [](int64_t got, int64_t want, const char* what) {
    if (got != want)
      ADD_FAILURE() << "2 bytes per element: " << what << ": got " << got << " bytes, expected "
                    << want << " (small, B 16, T 64)";
  };
  bytes_are(h.weights, 2 * N, "the weights");
  bytes_are(h.gradients, 2 * N, "one gradient per parameter, as wide");
  bytes_are(h.optimizer, 4 * N, "AdamW's two moments, as wide");
  bytes_are(h.activations, 2 * activation_elements(c, 16, 64), "the activations, as wide");
}

TEST(Step5_Memory, ActivationFormulaMatchesWhatForwardKeeps) {
  // exact: the formula counts the tensors the GPT keeps, measured by the allocator
  for (auto [name, B, T] : {std::tuple{"tiny", 4, 16}, std::tuple{"tiny", 3, 7}, std::tuple{"small", 2, 64}}) {
    const ModelConfig c = model_config(name);
    nn::GPT model(c);
    data::Sampler s(corpus(), B, T, 8);
    const data::Batch b = s.batch(0);
    const std::size_t before = memory_stats(Device::cpu()).current;
    model.forward(b.x, b.y);
    const std::size_t kept = memory_stats(Device::cpu()).current - before;
    EXPECT_EQ(static_cast<std::size_t>(estimate_memory(c, B, T, 4).activations), kept)
        << name << " B=" << B << " T=" << T;
    EXPECT_EQ(activation_elements(c, B, T) * 4, static_cast<int64_t>(model.activation_bytes()));
  }
}

// The estimate is a formula: it allocates nothing (a model built and run to measure would hold
// tens of GB at gpt-85m's shape, and the step is the formula beside the allocator).
TEST(Step5_Memory, TheEstimateIsAFormula) {
  const Device cpu = Device::cpu();
  reset_peak_memory(cpu);
  const std::size_t before = memory_stats(cpu).current;
  estimate_memory(model_config("small"), 2, 64, 4);
  activation_elements(model_config("small"), 2, 64);
  if (memory_stats(cpu).peak != before)
    LABTEST_FAIL() << "estimate_memory / activation_elements allocated "
                   << memory_stats(cpu).peak - before
                   << " bytes: count the tensors from the config, do not build or run the model";
}
