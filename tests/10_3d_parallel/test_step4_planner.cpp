// Step 4: the planner, as pure functions on one rank. Its memory figures are checked exactly, in
// fp32 and in bf16 mixed precision (fp32 master, gradients and AdamW state; a bf16 copy and bf16
// activations with fp32 statistics), against what the library really holds: the parameters of a built 3D stage, the allocator's bytes
// of a model + AdamW, lab 09's ZeRO formulas, nn::GPTActivations::nbytes after a stage's forward,
// lab 08's simulator for the micro-batches in flight. Step time is a model (checked by measurement
// in step 5, not yet written): here only its structure (bubble, zero communication on an axis of
// size 1, compute divided by dp).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/allocator.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "grid3d_checks.hpp"
#include "zero.hpp"

namespace {

using namespace scalelab;
using namespace scalelab::lab10test;

std::vector<ModelConfig> configs() { return {config(), model_config("small")}; }

// The precisions the memory figures are checked in: f32, and bf16 (mixed: f32 master).
constexpr DType kPrecisions[] = {DType::f32, DType::bf16};

// Tp rank 0's stage of the 3D model as step 2 builds it (V/tp vocabulary rows, lab 07's
// mappings) on this 1-rank world: nothing summed (sizes only, the numbers are partial). In
// `precision`: f32, or bf16 mixed precision.
std::unique_ptr<nn::GPT> stage(const ModelConfig& c, int tp, int pp, int s, DType precision,
                               bool checkpoint = false) {
  const lab08::LayerRange r = lab08::stage_layers(static_cast<int>(c.n_layer), pp, s);
  const lab07::VocabRange v = lab07::vocab_range(c.vocab_size, 0, tp);
  return own_stage(c,
                   nn::GPTOptions{.dtype = lab10::master_dtype(precision), .seed = 1,
                                  .first_block = r.first, .last_block = r.last, .tp_rank = 0,
                                  .tp_size = tp, .vocab_lo = v.lo, .vocab_hi = v.hi,
                                  .compute_dtype = precision},
                   labtest::world(), checkpoint);
}

// One stage shape the memory tests measure: a config, tp, pp, the stage, checkpointing or not,
// the precision.
struct StageCase {
  ModelConfig c;
  int tp, pp, s;
  bool ckpt;
  DType precision;
  std::string str() const {
    return fmt::format("{} tp {} pp {} stage {}{} {}", c.name, tp, pp, s,
                       ckpt ? " checkpointed" : "", dtype_name(precision));
  }
};
// tiny and small, tp 1/2/4, pp 1/2, every stage, with and without checkpointing, f32 and bf16.
std::vector<StageCase> stage_cases() {
  std::vector<StageCase> all;
  for (const ModelConfig& c : configs())
    for (int tp : {1, 2, 4})
      for (int pp : {1, 2})
        for (int s = 0; s < pp; ++s)
          for (bool ckpt : {false, true})
            for (DType precision : kPrecisions) all.push_back({c, tp, pp, s, ckpt, precision});
  return all;
}

// A batch of `rows` rows of c's context length.
data::Batch batch_for(const ModelConfig& c, int64_t rows) {
  data::Sampler sampler(labtest::synthetic_corpus(10), rows, c.block_size, 1);
  return sampler.batch(0);
}

// One forward of stage case `k` on batch b (the caller keeps it, as a training step does; a stage
// without the embedding gets zeros of its input's shape), into acts; returns the blocks' output,
// after the head has run on it when the stage has the head.
Tensor stage_forward(nn::GPT& model, const StageCase& k, const data::Batch& b,
                     nn::GPTActivations& acts) {
  Tensor x = model.has_embedding() ? model.embed(b.x, acts)
                                   : Tensor::zeros({b.x.size(0), k.c.block_size, k.c.n_embd}, k.precision);
  Tensor y = model.forward_blocks(x, acts);
  if (model.has_head()) model.head_forward(y, b.y, acts);
  return y;
}

using ParamFn = std::function<int64_t(const ModelConfig&, int, int, int)>;

testing::AssertionResult parameters_match(const ParamFn& count) {
  for (const ModelConfig& c : configs())
    for (int tp : {1, 2, 4})
      for (int pp : {1, 2, 4})
        for (int s = 0; s < pp; ++s) {
          const int64_t want = stage(c, tp, pp, s, DType::f32)->num_parameters();
          const int64_t got = count(c, tp, pp, s);
          if (got != want)
            return testing::AssertionFailure() << fmt::format(
                       "{} tp {} pp {} stage {}: {} parameters predicted, the stage holds {}",
                       c.name, tp, pp, s, got, want);
        }
  return testing::AssertionSuccess();
}

TEST(Step4_Planner, StageParametersEqualTheBuiltStage) {
  EXPECT_TRUE(parameters_match(lab10::stage_parameters));
}

// ZeRO 0: the allocator's bytes for the stage's values and gradients and AdamW's m and v (and in
// bf16 the compute copy): 16 bytes per parameter in fp32, 18 in mixed precision.
TEST(Step4_Planner, ModelStateEqualsTheAllocator) {
  const ModelConfig c = config();
  for (DType precision : kPrecisions)
    for (int tp : {1, 2})
      for (int pp : {1, 2}) {
        const std::size_t before = memory_stats(Device::cpu()).current;
        std::size_t held = 0;
        int64_t params = 0;
        {
          auto model = stage(c, tp, pp, pp - 1, precision);
          optim::AdamW adamw(optim::groups(model->parameters()));
          adamw.step(1e-3);  // m and v exist after the first step at the latest
          params = model->num_parameters();
          held = memory_stats(Device::cpu()).current - before;
        }
        EXPECT_EQ(lab10::model_state_bytes(params, 0, 1, precision), held)
            << dtype_name(precision) << " tp " << tp << " pp " << pp
            << ": value, gradient, m and v (and the bf16 copy)";
      }
}

// ZeRO 1-3 divide what lab 09's formulas divide (no padding: psi divisible by dp): fp32 the
// paper's; bf16 this library's layout (lab 09's layout_memory: fp32 master whole at ZeRO 0-2
// beside the bf16 copy), not the paper's 2-byte gradients.
TEST(Step4_Planner, ZeroStagesAsLab09) {
  const int64_t psi = 3 * 4 * 5 * 1000;
  for (int zero = 0; zero <= 3; ++zero)
    for (int dp : {1, 2, 4}) {
      EXPECT_EQ(lab10::model_state_bytes(psi, zero, dp, DType::f32),
                lab09::paper_memory(zero, psi, dp).total())
          << "ZeRO " << zero << " dp " << dp;
      EXPECT_EQ(lab10::model_state_bytes(psi, zero, dp, DType::bf16),
                lab09::layout_memory(zero, psi, dp, DType::bf16).total())
          << "bf16 ZeRO " << zero << " dp " << dp;
    }
}

TEST(Step4_Planner, ActivationBytesEqualAStagesForward) {
  for (const StageCase& k : stage_cases()) {
    auto model = stage(k.c, k.tp, k.pp, k.s, k.precision, k.ckpt);
    const data::Batch b = batch_for(k.c, 2);
    nn::GPTActivations acts;
    stage_forward(*model, k, b, acts);
    EXPECT_EQ(lab10::stage_activation_bytes(k.c, 2, k.tp, k.pp, k.s, k.ckpt, k.precision),
              acts.nbytes())
        << k.str();
  }
}

// The allocator's peak above what is live when one micro-batch's backward starts (its
// activations, and the received gradient of a stage without the head) equals
// backward_transient_bytes: every temporary of the head's and the blocks' backward counted.
// The test's own count of the backward's transient (the contract's formula), with or without
// the attention scores' gradients, for the planted fault below.
std::size_t transient_reference(const ModelConfig& c, int64_t rows, int tp, int pp, int s,
                                bool ckpt, DType precision, bool scores) {
  // bytes of an activation (and of its gradient) and of a LayerNorm statistic
  const int64_t e = static_cast<int64_t>(dtype_size(precision));
  const int64_t st = static_cast<int64_t>(dtype_size(ops::stats_dtype(precision)));
  const int64_t C = c.n_embd, T = c.block_size, N = rows * T, k = C / tp;
  const int64_t A = scores ? c.n_head / tp * rows * T * T : 0;
  const int64_t blocks = lab08::stage_layers(static_cast<int>(c.n_layer), pp, s).size();
  int64_t block = blocks > 0 ? e * std::max({2 * N * C + 8 * N * k, 3 * N * C + 5 * N * k + 2 * A,
                                             3 * N * C + 8 * N * k}) : 0;
  if (ckpt && blocks > 0)  // ln1, res2, ln2, 4 statistics, q k v y, att, h g
    block += e * (3 * N * C + 4 * N * k + c.n_head / tp * rows * T * T + 8 * N * k) + st * 4 * N;
  int64_t n = block;
  if (s == pp - 1)
    n = std::max<int64_t>(e * 2 * N * C,
                          blocks > 0 ? e * N * C + block - (e * (2 * N * C + N * c.vocab_size / tp) +
                                                            st * 2 * N) : 0);
  return static_cast<std::size_t>(std::max<int64_t>(n, 0));
}

using TransientFn =
    std::function<std::size_t(const ModelConfig&, int64_t, int, int, int, bool, DType)>;

testing::AssertionResult transient_matches(const TransientFn& predicted) {
  for (const StageCase& k : stage_cases()) {
    auto model = stage(k.c, k.tp, k.pp, k.s, k.precision, k.ckpt);
    const data::Batch b = batch_for(k.c, 2);
    nn::GPTActivations acts;
    Tensor y = stage_forward(*model, k, b, acts);
    Tensor dy;
    if (!model->has_head()) dy = Tensor::zeros(y.shape(), y.dtype());  // received from the next stage
    y = Tensor();
    const std::size_t base = memory_stats(Device::cpu()).current;
    reset_peak_memory(Device::cpu());
    if (model->has_head()) dy = model->head_backward(acts);
    Tensor dx = model->backward_blocks(dy, acts);
    dy = Tensor();
    if (model->has_embedding()) model->embed_backward(dx, acts);
    const std::size_t peak = memory_stats(Device::cpu()).peak - base;
    const std::size_t want = predicted(k.c, 2, k.tp, k.pp, k.s, k.ckpt, k.precision);
    if (want != peak)
      return testing::AssertionFailure() << fmt::format(
                 "{}: {} bytes predicted, the allocator's peak above the backward's start is {}",
                 k.str(), want, peak);
  }
  return testing::AssertionSuccess();
}

TEST(Step4_Planner, BackwardTransientEqualsTheAllocator) {
  EXPECT_TRUE(transient_matches([](const ModelConfig& c, int64_t rows, int tp, int pp, int s,
                                   bool ckpt, DType precision) {
    return lab10::backward_transient_bytes(c, rows, tp, pp, s, ckpt, precision);
  }));
}

// The harness passes its own count (so the planted variant below differs only by its fault).
TEST(Step4_PlantedFault, ReferenceTransientPasses) {
  EXPECT_TRUE(transient_matches([](const ModelConfig& c, int64_t rows, int tp, int pp, int s,
                                   bool ckpt, DType precision) {
    return transient_reference(c, rows, tp, pp, s, ckpt, precision, /*scores=*/true);
  }));
}

// The whole prediction against a real step on this 1-rank world: the allocator's peak over two
// training steps (lab 08's 1F1B step of the test's own stage, AdamW) above what was live before
// the model was built, vs predict's total, for m = 1, 2, 4 micro-batches with and without
// checkpointing (tiny, float32). The stated tolerance: the prediction is at most 1% under the
// peak and never over it (measured: ~1.5 KB, 0.1%, under: the loss scalars and the like; without
// the backward's transient, 48 KB at m = 1, it would be 2% under). On 8 ranks step 5 measures 0
// to -6%: the pipeline's message buffers are not counted.
TEST(Step4_Planner, PredictedMemoryIsTheAllocatorsPeakOfAStep) {
  const ModelConfig c = config();
  const comm::ProcessGrid grid(labtest::world(), 1, 1, 1, lab10::GridOrder::megatron);
  lab10::Groups g = lab10::groups_of(grid);
  const lab10::Machine mach{.flops = 1e10, .bus_bytes_per_s = 1e9, .latency_s = 1e-5};
  for (DType precision : kPrecisions)
  for (int m : {1, 2, 4})
    for (bool ckpt : {false, true}) {
      const std::size_t base = memory_stats(Device::cpu()).current;
      reset_peak_memory(Device::cpu());
      {
        nn::GPTOptions o = own_options(g);
        o.dtype = lab10::master_dtype(precision);
        o.compute_dtype = precision;
        const auto owner = own_stage(c, o, g.tp, ckpt);
        nn::GPT& model = *owner;
        optim::AdamW adamw(optim::groups(model.parameters()));
        for (int step = 0; step < 2; ++step) {
          lab08::pipeline_step({&model}, lab08::schedule_1f1b(1, m, 0), kLab.batch(step), m, g.pp);
          adamw.step(1e-3);
        }
      }
      const double peak = static_cast<double>(memory_stats(Device::cpu()).peak - base);
      const double want = static_cast<double>(
          lab10::predict(c, kLab.global_batch, {{1, 1, 1}, m, 0, ckpt}, mach, precision)
              .total_bytes);
      const std::string what = fmt::format("{} m {}{}", dtype_name(precision), m,
                                           ckpt ? " checkpointed" : "");
      EXPECT_LE(want, peak) << what;
      EXPECT_GE(want, 0.99 * peak) << what << ": predicted " << want
                                   << " B, the allocator's peak " << peak;
    }
}

using InFlightFn = std::function<std::size_t(int, int, int, lab08::Kind, int)>;

// Calls f(kind, v, p, m, sim) for every schedule of lab 08 on p 1-4 stages and m micro-batches
// (interleaved: v = 2 and 3 chunks, m a multiple of p) with lab 08's simulation of it; stops at
// the first failure f returns, or at a schedule that does not run.
testing::AssertionResult for_each_simulated_schedule(
    const std::function<testing::AssertionResult(lab08::Kind, int, int, int,
                                                 const lab08::SimResult&)>& f) {
  struct Case { lab08::Kind kind; int v; };
  const Case cases[] = {{lab08::Kind::afab, 1}, {lab08::Kind::one_f_one_b, 1},
                        {lab08::Kind::interleaved, 2}, {lab08::Kind::interleaved, 3}};
  for (const Case& k : cases)
    for (int p : {1, 2, 3, 4})
      for (int m : {1, 2, 3, 4, 6, 8, 12}) {
        if (k.kind == lab08::Kind::interleaved && m % p != 0) continue;
        std::vector<lab08::Schedule> all;
        for (int s = 0; s < p; ++s) all.push_back(lab08::make_schedule(k.kind, p, m, k.v, s));
        const lab08::SimResult sim = lab08::simulate(all, m, k.v);
        if (sim.deadlock || !sim.errors.empty())
          return testing::AssertionFailure() << "lab 08's schedule does not run: " << sim.report;
        if (auto r = f(k.kind, k.v, p, m, sim); !r) return r;
      }
  return testing::AssertionSuccess();
}

// The in-flight count of every schedule against the simulator's most (micro-batch, chunk) pieces
// held.
testing::AssertionResult in_flight_matches(const InFlightFn& f) {
  return for_each_simulated_schedule([&](lab08::Kind kind, int v, int p, int m,
                                         const lab08::SimResult& sim) {
    for (int s = 0; s < p; ++s)
      if (f(p, s, m, kind, v) != static_cast<std::size_t>(sim.max_in_flight[s]))
        return testing::AssertionFailure() << fmt::format(
                   "{} p {} m {} v {} stage {}: {} in flight predicted, the schedule holds {}",
                   lab08::kind_name(kind), p, m, v, s, f(p, s, m, kind, v), sim.max_in_flight[s]);
    return testing::AssertionSuccess();
  });
}

TEST(Step4_Planner, InFlightAsLab08sSimulator) {
  EXPECT_TRUE(in_flight_matches([](int p, int s, int m, lab08::Kind kind, int v) {
    return lab10::max_in_flight(p, s, m, kind, v);
  }));
}

// predict's bubble of every schedule is what lab 08's simulator measures on its timeline (every
// stage equally fast, a backward twice a forward, messages free): AFAB and 1F1B (pp - 1) /
// (m + pp - 1), interleaved (pp - 1) / (v m + pp - 1), the most idle stage's.
TEST(Step4_Planner, BubbleOfEveryScheduleAsLab08sSimulator) {
  ModelConfig c = model_config("small");
  c.n_layer = 12;  // pp x v pieces for pp 1-4, v 2, 3
  const lab10::Machine mach{.flops = 1e10, .bus_bytes_per_s = 1e9, .latency_s = 1e-5};
  EXPECT_TRUE(for_each_simulated_schedule([&](lab08::Kind kind, int v, int p, int m,
                                              const lab08::SimResult& sim) {
    const double simulated = *std::max_element(sim.bubble.begin(), sim.bubble.end());
    const lab10::Plan plan{{1, 1, p}, m, 0, false, kind, v};
    const double predicted = lab10::predict(c, 12, plan, mach, DType::f32).bubble;
    if (std::abs(predicted - simulated) <= 1e-12) return testing::AssertionSuccess();
    return testing::AssertionFailure() << fmt::format(
               "{} p {} m {} v {}: bubble {} predicted, the simulator's {}",
               lab08::kind_name(kind), p, m, v, predicted, simulated);
  }));
}

TEST(Step4_Planner, TimeModelStructure) {
  const ModelConfig c = model_config("small");
  const lab10::Machine mach{.flops = 1e10, .bus_bytes_per_s = 1e9, .latency_s = 1e-5};
  const auto at = [&](int dp, int tp, int pp, int m) {
    return lab10::predict(c, 16, {{dp, tp, pp}, m, 0, false}, mach, DType::f32);
  };
  const lab10::Prediction one = at(1, 1, 1, 1);
  EXPECT_EQ(one.tp_s, 0);
  EXPECT_EQ(one.pp_s, 0);
  EXPECT_EQ(one.dp_s, 0);
  EXPECT_EQ(one.bubble, 0);
  EXPECT_DOUBLE_EQ(at(2, 1, 1, 1).compute_s, one.compute_s / 2);  // each replica half the rows
  EXPECT_GT(at(1, 2, 1, 1).tp_s, 0);
  EXPECT_GT(at(2, 1, 1, 1).dp_s, 0);
  const lab10::Prediction piped = at(1, 1, 4, 4);
  EXPECT_DOUBLE_EQ(piped.bubble, lab08::bubble_formula(lab08::Kind::one_f_one_b, 4, 4));
  EXPECT_GT(piped.pp_s, 0);
  EXPECT_NEAR(piped.step_s, piped.compute_s / (1 - piped.bubble) + piped.pp_s, 1e-12);
  // Ranks taking turns on shared cores: the bubble is another rank's turn, not idle time.
  lab10::Machine shared = mach;
  shared.shared_cores = true;
  const lab10::Prediction turns =
      lab10::predict(c, 16, {{1, 1, 4}, 4, 0, false}, shared, DType::f32);
  EXPECT_NEAR(turns.step_s, turns.compute_s + turns.pp_s, 1e-12);
  // Memory: the largest stage's model state plus what it holds in flight and its backward's
  // transient.
  EXPECT_EQ(piped.total_bytes,
            piped.state_bytes + piped.activation_bytes + piped.transient_bytes);
  EXPECT_LT(lab10::predict(c, 16, {{4, 1, 1}, 1, 1, false}, mach, DType::f32).state_bytes,
            at(4, 1, 1, 1).state_bytes);  // ZeRO-1 shards the optimizer state
}

// Issue 21: ZeRO-2 and 3 run with micro-batches and a pipeline, reducing (2) or gathering and
// reduce-scattering (3) every unit once per micro-batch: their dp time is m times one batch's
// (the formula changed: before, these plans were refused and their dp time counted once).
// ZeRO-0/1 average the gradient once per step, whatever m. plan_all lists them now.
TEST(Step4_Planner, ZeroTwoAndThreeDpTrafficIsPerMicroBatch) {
  const ModelConfig c = model_config("small");
  const lab10::Machine mach{.flops = 1e10, .bus_bytes_per_s = 1e9, .latency_s = 1e-5};
  const auto dp_s = [&](int zero, int m) {
    return lab10::predict(c, 16, {{2, 1, 2}, m, zero, false}, mach, DType::f32).dp_s;
  };
  for (int zero : {0, 1}) EXPECT_DOUBLE_EQ(dp_s(zero, 4), dp_s(zero, 1)) << "ZeRO-" << zero;
  for (int zero : {2, 3}) {
    EXPECT_GT(dp_s(zero, 1), 0) << "ZeRO-" << zero;
    EXPECT_NEAR(dp_s(zero, 4), 4 * dp_s(zero, 1), 1e-12) << "ZeRO-" << zero;
  }
  const auto plans = lab10::plan_all(c, 4, 16, mach, std::numeric_limits<std::size_t>::max(),
                                     DType::f32);
  const bool listed = std::any_of(plans.begin(), plans.end(), [](const auto& x) {
    return x.first.zero_stage == 3 && x.first.grid.pp > 1 && x.first.micro_batches > 1 &&
           x.first.checkpoint;
  });
  EXPECT_TRUE(listed) << "ZeRO-3 with a pipeline, micro-batches and checkpointing is a plan";
}

// ---- planted faults -----------------------------------------------------------------------------

// The embedding and the head's copy counted whole on every tp rank (as before vocabulary
// parallelism): off by (V*C)(1 - 1/tp) on the first and on the last stage. (Counted from the
// built stage, so the planted variant does not call your code.)
TEST(Step4_PlantedFault, EmbeddingWholeOnEveryTpRankFails) {
  EXPECT_FALSE(parameters_match([](const ModelConfig& c, int tp, int pp, int s) {
    int64_t n = stage(c, tp, pp, s, DType::f32)->num_parameters();
    const int64_t missing = c.vocab_size * c.n_embd - c.vocab_size * c.n_embd / tp;
    if (s == 0) n += missing;
    if (s == pp - 1 && s != 0) n += missing;
    return n;
  }));
}

// The backward's transient without the attention scores' two gradients (datt, dpreatt: the
// (NH/tp, rows, T, T) temporaries that dominate at long context): caught where they are the peak.
// (Built on the reference count, so the planted variant does not call your code.)
TEST(Step4_PlantedFault, TransientWithoutScoreGradientsFails) {
  EXPECT_FALSE(transient_matches([](const ModelConfig& c, int64_t rows, int tp, int pp, int s,
                                    bool ckpt, DType precision) {
    return transient_reference(c, rows, tp, pp, s, ckpt, precision, /*scores=*/false);
  }));
}

// Every micro-batch in flight whatever the schedule (AFAB's count, not 1F1B's).
TEST(Step4_PlantedFault, AllMicroBatchesInFlightFails) {
  EXPECT_FALSE(in_flight_matches([](int, int, int m, lab08::Kind kind, int v) {
    return static_cast<std::size_t>(kind == lab08::Kind::interleaved ? m * v : m);
  }));
}

// Interleaved counted as 1F1B over its p x v pieces (min(p - s, m) per chunk): its warm-up runs
// (v - 1) p more forwards than that before the first backward.
TEST(Step4_PlantedFault, InterleavedAsOneFOneBPerChunkFails) {
  EXPECT_FALSE(in_flight_matches([](int p, int s, int m, lab08::Kind kind, int v) {
    if (kind == lab08::Kind::afab) return static_cast<std::size_t>(m);
    return static_cast<std::size_t>(std::min(p - s, m) * v);
  }));
}

}  // namespace
