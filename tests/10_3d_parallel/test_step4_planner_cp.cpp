// Step 4 with the 4th axis: predict() with cp > 1 and plan_all's cp. Pure functions on one rank
// (no model built): a cp rank's activations are its T/cp tokens' through lab 11's fused core, its
// compute 1/cp of the tokens, the cp ring's time its K/V blocks ((3 cp - 2) per block and
// micro-batch, 2 x rows/m x T/cp x C/tp elements each), all-to-all's its 8 exchanges, ZeRO
// shards over dp x cp; plan_all lists every schedule and both attention cores; and
// plan_all's best plan for gpt-85m on 8 ranks uses cp > 1 for a long context (16384 tokens, where
// the (T, T) attention scores no longer fit without it) and cp = 1 for the model's own 1024.
#include <algorithm>

#include <gtest/gtest.h>

#include "3d_parallel.hpp"
#include "common/model_config.hpp"

namespace {

using namespace scalelab;

const lab10::Machine kMachine{.flops = 1e12, .bus_bytes_per_s = 1e10, .latency_s = 1e-5};
constexpr std::size_t kGiB = std::size_t{1} << 30;

lab10::Plan cp_plan(int dp, int cp, int tp, int pp, int m, int zero = 0) {
  return lab10::Plan{{dp, tp, pp, lab10::GridOrder::megatron, cp}, m, zero, false};
}

TEST(Step4_PlannerCp, PredictDividesTheTokensAndCountsTheRing) {
  ModelConfig c = model_config("tiny");
  c.n_layer = 4;
  c.n_head = 4;
  const int64_t B = 8, T = c.block_size, C = c.n_embd;
  const int dp = 2, cp = 2, tp = 2, m = 2;
  const lab10::Prediction with = lab10::predict(c, B, cp_plan(dp, cp, tp, 1, m, 1), kMachine,
                                                DType::f32);
  const lab10::Prediction without = lab10::predict(c, B, cp_plan(dp, 1, tp, 1, m, 1), kMachine,
                                                   DType::f32);
  // activations: those of T/cp tokens through lab 11's fused core (a log-sum-exp, no (T, T)
  // probabilities): fewer than the same rows' at cp 1 with their probabilities
  EXPECT_EQ(with.activation_bytes,
            lab10::max_in_flight(1, 0, m) *
                lab10::stage_activation_bytes(c, B / dp / m, tp, 1, 0, false, DType::f32, cp));
  ModelConfig local = c;
  local.block_size = T / cp;
  EXPECT_LT(with.activation_bytes,
            lab10::max_in_flight(1, 0, m) *
                lab10::stage_activation_bytes(local, B / dp / m, tp, 1, 0, false, DType::f32));
  EXPECT_LT(with.activation_bytes, without.activation_bytes);
  // ZeRO-1 shards the optimizer state over dp x cp = 4 ranks
  EXPECT_EQ(with.state_bytes, lab10::model_state_bytes(with.params, 1, dp * cp, DType::f32));
  // compute: half the tokens per rank, the same FLOPs per token
  EXPECT_NEAR(with.compute_s, without.compute_s / cp, 1e-12 * without.compute_s);
  // the ring: per block and micro-batch 3 cp - 2 messages of the K/V block
  const double kv = 2.0 * (B / dp / m) * (T / cp) * (C / tp) * 4;
  EXPECT_NEAR(with.cp_s, m * c.n_layer * (3 * cp - 2) * (kv / kMachine.bus_bytes_per_s +
                                                         kMachine.latency_s), 1e-15);
  EXPECT_EQ(without.cp_s, 0.0);
  // all-to-all: 8 exchanges per block and micro-batch of one (rows/m, T/cp, C/tp) activation,
  // (cp - 1)/cp of it leaving the rank; it keeps its head-split q, k, v, y as activations and
  // its backward holds less than the ring's travelling blocks
  lab10::Plan a2a = cp_plan(dp, cp, tp, 1, m, 1);
  a2a.attention = lab11::Attention::all_to_all;
  const lab10::Prediction all = lab10::predict(c, B, a2a, kMachine, DType::f32);
  const double act = (B / dp / m) * (T / cp) * (C / tp) * 4.0;
  EXPECT_NEAR(all.cp_s, m * c.n_layer * 8 * ((cp - 1.0) / cp * act / kMachine.bus_bytes_per_s +
                                             kMachine.latency_s), 1e-15);
  EXPECT_GT(all.activation_bytes, with.activation_bytes);
  EXPECT_LT(all.transient_bytes, with.transient_bytes);
}

TEST(Step4_PlannerCp, PlanAllChoosesCpForLongContextsOnly) {
  ModelConfig c = model_config("gpt-85m");
  const auto short_plans = lab10::plan_all(c, 8, 8, kMachine, 80 * kGiB, DType::f32);
  ASSERT_FALSE(short_plans.empty());
  EXPECT_EQ(short_plans.front().first.grid.cp, 1) << "context " << c.block_size;
  bool lists_cp = false;  // cp is enumerated even where it does not win
  for (const auto& [p, d] : short_plans) lists_cp = lists_cp || p.grid.cp > 1;
  EXPECT_TRUE(lists_cp);

  // every schedule and both attention cores are listed where they run
  const auto listed = [&](lab08::Kind kind, lab11::Attention attention) {
    return std::any_of(short_plans.begin(), short_plans.end(), [&](const auto& x) {
      return x.first.schedule == kind && (x.first.grid.cp == 1 || x.first.attention == attention) &&
             (attention == lab11::Attention::ring || x.first.grid.cp > 1);
    });
  };
  EXPECT_TRUE(listed(lab08::Kind::afab, lab11::Attention::ring));
  EXPECT_TRUE(listed(lab08::Kind::interleaved, lab11::Attention::ring));
  EXPECT_TRUE(listed(lab08::Kind::one_f_one_b, lab11::Attention::all_to_all));
  for (const auto& [p, d] : short_plans) {
    if (p.schedule != lab08::Kind::interleaved) continue;
    EXPECT_EQ(p.micro_batches % p.grid.pp, 0);
    EXPECT_EQ(c.n_layer % (p.grid.pp * p.chunks), 0);
  }

  c.block_size = 16384;
  const auto long_plans = lab10::plan_all(c, 8, 8, kMachine, 80 * kGiB, DType::f32);
  ASSERT_FALSE(long_plans.empty());
  EXPECT_GT(long_plans.front().first.grid.cp, 1) << "context " << c.block_size;
}

}  // namespace
