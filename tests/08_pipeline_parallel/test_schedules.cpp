// Lab 08 step 3 (and step 6's schedule) graders: schedules are data, so they are graded without
// a single message: against golden tables of actions, and through the given simulator
// (schedule.hpp), which runs every stage's list together and says whether they finish, how many
// micro-batches each stage holds at once, and the bubble. Exact: the simulator counts ticks
// (forward 1, backward 2), so the bubble is compared with the formula to 1e-12.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <utility>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "pipeline_parallel.hpp"
#include "pp_test.hpp"
#include "tests/support/drawn.hpp"
#include "tests/support/expect.hpp"

using namespace scalelab;
using namespace scalelab::lab08;

namespace {

std::vector<Schedule> all_stages(Kind kind, int p, int m, int v = 1) {
  std::vector<Schedule> out;
  for (int s = 0; s < p; ++s) out.push_back(make_schedule(kind, p, m, v, s));
  return out;
}

// NCCL pairs the messages between two ranks in the order they were posted (it has no tags; MPI
// pairs them by tag): for every two stages, the messages one sends to the other must come in the
// order the other receives them, or over NCCL two same-shaped tensors trade places without an
// error. A message names its kind, micro-batch and receiving chunk ("A3.1": micro-batch 3's
// activation for chunk 1). A stage's messages to itself (one stage, several chunks) are copies.
testing::AssertionResult messages_pair_in_order(const std::vector<Schedule>& all, int v) {
  const int p = static_cast<int>(all.size());
  std::map<std::pair<int, int>, std::vector<std::string>> sent, received;  // (from, to)
  for (int s = 0; s < p; ++s)
    for (const Action& a : all[s]) {
      const bool act = a.op == Op::send_activation || a.op == Op::recv_activation;
      if (a.op == Op::send_activation || a.op == Op::send_gradient) {
        const Piece to = act ? next_piece(p, v, s, a.chunk) : prev_piece(p, v, s, a.chunk);
        if (to.stage != s)
          sent[{s, to.stage}].push_back(fmt::format("{}{}.{}", act ? 'A' : 'G', a.mb, to.chunk));
      } else if (a.op == Op::recv_activation || a.op == Op::recv_gradient) {
        const Piece from = act ? prev_piece(p, v, s, a.chunk) : next_piece(p, v, s, a.chunk);
        if (from.stage != s)
          received[{from.stage, s}].push_back(
              fmt::format("{}{}.{}", act ? 'A' : 'G', a.mb, a.chunk));
      }
    }
  for (const auto& [pair, out] : sent) {
    const std::vector<std::string>& in = received[pair];
    std::size_t i = 0;
    while (i < out.size() && i < in.size() && out[i] == in[i]) ++i;
    if (i < out.size() || i < in.size())
      return testing::AssertionFailure()
             << "stage " << pair.first << " sends its message " << i << " to stage "
             << pair.second << " as " << (i < out.size() ? out[i] : "nothing") << ", which "
             << "receives " << (i < in.size() ? in[i] : "nothing") << " there: over NCCL "
             << "(no tags) they would pair up";
  }
  return testing::AssertionSuccess();
}

// The simulation ran to its end: no malformed schedule (validate) and no deadlock. Only then
// does it fill the per-stage figures (spans, max_in_flight, bubble).
testing::AssertionResult finished(const SimResult& r) {
  if (!r.errors.empty()) return testing::AssertionFailure() << r.errors.front();
  if (r.deadlock) return testing::AssertionFailure() << "deadlock:\n" << r.report;
  return testing::AssertionSuccess();
}

// The check 1F1B must pass: the simulation finishes and stage s never holds more than
// min(p - s, m) micro-batches.
testing::AssertionResult one_f_one_b_memory_ok(const SimResult& r, int p, int m) {
  if (auto ok = finished(r); !ok) return ok;
  for (int s = 0; s < p; ++s)
    if (r.max_in_flight[s] > std::min(p - s, m))
      return testing::AssertionFailure()
             << "p " << p << " m " << m << ": stage " << s << " holds " << r.max_in_flight[s]
             << " micro-batches at once; 1F1B holds at most p - stage = " << p - s;
  return testing::AssertionSuccess();
}

// `got` (what `call` gave, as to_string or compute_order prints it) against a golden table's
// `want`: a failure shows what came back and the first action that differs, by position, with
// the rules to check there, never the golden list (a table of printed answers must not pass).
testing::AssertionResult golden(const std::string& call, const std::string& got,
                                const std::string& want) {
  if (got == want) return testing::AssertionSuccess();
  const auto words = [](const std::string& text) {
    std::vector<std::string> out;
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t end = std::min(text.find(' ', at), text.size());
      out.push_back(text.substr(at, end - at));
      at = end + 1;
    }
    return out;
  };
  const std::vector<std::string> g = words(got), w = words(want);
  std::size_t i = 0;
  while (i < g.size() && i < w.size() && g[i] == w[i]) ++i;
  const std::string where = i < g.size() ? fmt::format("action {} ('{}')", i + 1, g[i])
                                         : fmt::format("after action {}: it stops early", i);
  return testing::AssertionFailure() << fmt::format(
             "{} gave \"{}\": {} is not the schedule's ({} actions in all). Check there: a "
             "forward before a backward of the same micro-batch, micro-batches in order, the "
             "warm-up's length for this stage, and each message beside its compute (a receive "
             "just before, a send just after)", call, got, where, w.size());
}

}  // namespace

// golden() of a call, named by its source text, reported as its message alone (LABTEST_EXPECT:
// not EXPECT_TRUE, whose report would print the check's source and the golden string in it).
#define EXPECT_GOLDEN(call, want) LABTEST_EXPECT(golden(#call, call, want), "")
// The same with the call named by `name`.
#define EXPECT_GOLDEN_AS(name, got, want) LABTEST_EXPECT(golden(name, got, want), "")

// ---- Step 3 -------------------------------------------------------------------------------------

TEST(Step3_Golden, AfabActions) {
  EXPECT_GOLDEN(to_string(schedule_afab(3, 2, 0)), "F0 sA0 F1 sA1 rG0 B0 rG1 B1");
  EXPECT_GOLDEN(to_string(schedule_afab(3, 2, 1)), "rA0 F0 sA0 rA1 F1 sA1 rG0 B0 sG0 rG1 B1 sG1");
  EXPECT_GOLDEN(to_string(schedule_afab(3, 2, 2)), "rA0 F0 rA1 F1 B0 sG0 B1 sG1");
  EXPECT_GOLDEN(to_string(schedule_afab(1, 2, 0)), "F0 F1 B0 B1");
}

TEST(Step3_Golden, OneFOneBActions) {
  EXPECT_GOLDEN(to_string(schedule_1f1b(2, 3, 0)), "F0 sA0 F1 sA1 rG0 B0 F2 sA2 rG1 B1 rG2 B2");
  EXPECT_GOLDEN(to_string(schedule_1f1b(2, 3, 1)), "rA0 F0 B0 sG0 rA1 F1 B1 sG1 rA2 F2 B2 sG2");
  EXPECT_GOLDEN(to_string(schedule_1f1b(1, 2, 0)), "F0 B0 F1 B1");
}

TEST(Step3_Golden, OneFOneBOrderP4M8) {
  const std::vector<std::string> want = {
      "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
      "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
      "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
      "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"};
  for (int s = 0; s < 4; ++s)
    EXPECT_GOLDEN_AS(fmt::format("compute_order(schedule_1f1b(4, 8, {}))", s),
                     compute_order(schedule_1f1b(4, 8, s)), want[s]);
}

TEST(Step3_Golden, FewerMicroBatchesThanStages) {
  // m < p: the warm-up is cut to m; m = 1 is forward then backward on every stage.
  EXPECT_GOLDEN(compute_order(schedule_1f1b(4, 2, 0)), "F0 F1 B0 B1");
  EXPECT_GOLDEN(compute_order(schedule_1f1b(4, 2, 2)), "F0 F1 B0 B1");
  EXPECT_GOLDEN(compute_order(schedule_1f1b(4, 2, 3)), "F0 B0 F1 B1");
  for (int s = 0; s < 4; ++s)
    EXPECT_GOLDEN_AS(fmt::format("compute_order(schedule_1f1b(4, 1, {}))", s),
                     compute_order(schedule_1f1b(4, 1, s)), "F0 B0");
}

TEST(Step3_Simulated, EveryGridFinishesWithTheFormulasBubble) {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 8}) {
      const double formula = static_cast<double>(p - 1) / (m + p - 1);
      for (Kind k : {Kind::afab, Kind::one_f_one_b}) {
        const SimResult r = simulate(all_stages(k, p, m), m);
        ASSERT_TRUE(r.errors.empty()) << kind_name(k) << " p " << p << " m " << m << ": "
                                      << r.errors.front();
        ASSERT_FALSE(r.deadlock) << kind_name(k) << " p " << p << " m " << m << ":\n" << r.report;
        EXPECT_TRUE(messages_pair_in_order(all_stages(k, p, m), 1))
            << kind_name(k) << " p " << p << " m " << m;
        EXPECT_EQ(r.makespan, 3.0 * (m + p - 1)) << kind_name(k) << " p " << p << " m " << m;
        for (int s = 0; s < p; ++s)
          EXPECT_NEAR(r.bubble[s], formula, 1e-12)
              << kind_name(k) << " p " << p << " m " << m << " stage " << s;
      }
    }
}

// Grids drawn at grading time (p 1-9, m 1-16; a seed from std::random_device, printed with any
// failure): every stage of AFAB and 1F1B finishes together in 3(m + p - 1) ticks with the
// formula's bubble, AFAB holds all m micro-batches, 1F1B min(p - stage, m). No table of the
// grids above passes these.
TEST(Step3_Simulated, GridsDrawnAtGradingTimeFollowTheRules) {
  labtest::Drawn draw;
  SCOPED_TRACE("grids " + draw.trace());
  for (int i = 0; i < 12; ++i) {
    const int p = draw.in(1, 9), m = draw.in(1, 16);
    const double formula = static_cast<double>(p - 1) / (m + p - 1);
    for (Kind k : {Kind::afab, Kind::one_f_one_b}) {
      const std::string what = fmt::format("{} p {} m {}", kind_name(k), p, m);
      const SimResult r = simulate(all_stages(k, p, m), m);
      ASSERT_TRUE(r.errors.empty()) << what << ": " << r.errors.front();
      ASSERT_FALSE(r.deadlock) << what << ":\n" << r.report;
      EXPECT_EQ(r.makespan, 3.0 * (m + p - 1)) << what << ": ticks (forward 1, backward 2)";
      EXPECT_TRUE(messages_pair_in_order(all_stages(k, p, m), 1)) << what;
      for (int s = 0; s < p; ++s) {
        EXPECT_NEAR(r.bubble[s], formula, 1e-12) << what << " stage " << s << ": the bubble";
        EXPECT_EQ(r.max_in_flight[s], k == Kind::afab ? m : std::min(p - s, m))
            << what << " stage " << s << ": micro-batches held at once";
      }
    }
  }
}

// A golden check's failure shows what came back and where it first differs, never the golden
// list itself (an attendee could copy it into a table). Through EXPECT_GOLDEN, as the golden
// tests report: what GoogleTest records for the failure (and prints, its source included).
TEST(Step3_PlantedFault, AWrongOrderIsShownWithoutTheGoldenList) {
  testing::TestPartResultArray failures;
  {
    const testing::ScopedFakeTestPartResultReporter intercept(
        testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    const std::string wrong = "F0 B0 F1 B1";
    EXPECT_GOLDEN(wrong, "F0 F1 B0 B1");
  }
  ASSERT_EQ(failures.size(), 1) << "a wrong order fails the golden check once";
  const std::string shown = failures.GetTestPartResult(0).summary();
  EXPECT_NE(shown.find("action 2 ('B0')"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("F0 F1 B0 B1"), std::string::npos) << "the golden list is shown: " << shown;
}

TEST(Step3_Simulated, AfabHoldsEveryMicroBatchOneFOneBAtMostPMinusStage) {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 8}) {
      // the per-stage figures exist only for schedules that finish: errors and deadlocks first
      const SimResult afab = simulate(all_stages(Kind::afab, p, m), m);
      ASSERT_TRUE(finished(afab)) << "AFAB p " << p << " m " << m;
      for (int s = 0; s < p; ++s) EXPECT_EQ(afab.max_in_flight[s], m) << "AFAB p " << p << " s " << s;
      const SimResult r = simulate(all_stages(Kind::one_f_one_b, p, m), m);
      ASSERT_TRUE(finished(r)) << "1F1B p " << p << " m " << m;
      EXPECT_TRUE(one_f_one_b_memory_ok(r, p, m));
      for (int s = 0; s < p; ++s)
        EXPECT_EQ(r.max_in_flight[s], std::min(p - s, m)) << "1F1B p " << p << " m " << m
                                                          << " stage " << s;
    }
}

TEST(Step3_Schedules, BadArgumentsAreUsageErrors) {
  EXPECT_THROW(schedule_afab(4, 0, 0), UsageError) << "m < 1";
  EXPECT_THROW(schedule_1f1b(4, 0, 0), UsageError) << "m < 1";
  EXPECT_THROW(schedule_1f1b(0, 4, 0), UsageError) << "p < 1";
  EXPECT_THROW(schedule_1f1b(4, 4, 4), UsageError) << "stage out of range";
  EXPECT_THROW(schedule_afab(4, 4, -1), UsageError) << "stage out of range";
}

TEST(Step3_PlantedFault, WarmupOneTooLongIsCaught) {
  for (int p : {2, 4}) {
    std::vector<Schedule> planted;
    for (int s = 0; s < p; ++s) planted.push_back(pptest::test_schedule(false, p, 8, s, /*extra_warmup=*/1));
    const SimResult r = simulate(planted, 8);
    EXPECT_FALSE(r.deadlock) << "a longer warm-up still finishes: only memory shows it";
    EXPECT_FALSE(one_f_one_b_memory_ok(r, p, 8))
        << "the in-flight check must fail when the warm-up is one forward too long";
  }
}

TEST(Step3_PlantedFault, DeadlockIsFoundAndTheStagesNamed) {
  // Stage 0 waits for the gradient of micro-batch 0 before its second forward; stage 1 runs
  // both forwards before its first backward: each waits for the other.
  const std::vector<Schedule> planted = {
      {{Op::forward, 0}, {Op::send_activation, 0}, {Op::recv_gradient, 0}, {Op::backward, 0},
       {Op::forward, 1}, {Op::send_activation, 1}, {Op::recv_gradient, 1}, {Op::backward, 1}},
      {{Op::recv_activation, 0}, {Op::forward, 0}, {Op::recv_activation, 1}, {Op::forward, 1},
       {Op::backward, 0}, {Op::send_gradient, 0}, {Op::backward, 1}, {Op::send_gradient, 1}}};
  const SimResult r = simulate(planted, 2);
  ASSERT_TRUE(r.errors.empty()) << "each list is well formed on its own: " << r.errors.front();
  EXPECT_TRUE(r.deadlock);
  EXPECT_NE(r.report.find("stage 0 waits at its action 2"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("rG0"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("stage 1 waits at its action 2"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("rA1"), std::string::npos) << r.report;
}

// The last stage receives micro-batch 1's activation before micro-batch 0's: well formed, and it
// finishes under the simulator (which pairs messages by tag, as MPI does), but over NCCL (pairs
// in posted order) the two activations would trade places.
TEST(Step3_PlantedFault, ReceivesOutOfOrderWouldSwapOverNccl) {
  const std::vector<Schedule> planted = {
      {{Op::forward, 0}, {Op::send_activation, 0}, {Op::forward, 1}, {Op::send_activation, 1},
       {Op::recv_gradient, 0}, {Op::backward, 0}, {Op::recv_gradient, 1}, {Op::backward, 1}},
      {{Op::recv_activation, 1}, {Op::recv_activation, 0}, {Op::forward, 0}, {Op::backward, 0},
       {Op::send_gradient, 0}, {Op::forward, 1}, {Op::backward, 1}, {Op::send_gradient, 1}}};
  const SimResult r = simulate(planted, 2);
  ASSERT_TRUE(r.errors.empty()) << r.errors.front();
  ASSERT_FALSE(r.deadlock) << r.report;
  const testing::AssertionResult ok = messages_pair_in_order(planted, 1);
  EXPECT_FALSE(ok);
  EXPECT_NE(std::string(ok.message()).find("stage 0 sends its message 0 to stage 1 as A0.0, "
                                           "which receives A1.0 there"),
            std::string::npos)
      << ok.message();
}

// ---- Step 6 (the interleaved schedule as data) ---------------------------------------------------

TEST(Step6_Golden, InterleavedOrderP2V2M4) {
  EXPECT_GOLDEN(compute_order(schedule_interleaved(2, 4, 2, 0)),
                "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3");
  EXPECT_GOLDEN(compute_order(schedule_interleaved(2, 4, 2, 1)),
                "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3");
  // messages: stage 1's chunk 0 sends to stage 0's chunk 1 (the next piece), and back
  const Schedule s1 = schedule_interleaved(2, 4, 2, 1);
  EXPECT_GOLDEN(to_string(Schedule(s1.begin(), s1.begin() + 6)), "rA0 F0 sA0 rA1 F1 sA1");
}

TEST(Step6_Simulated, InterleavedFinishesWithTheSmallerBubble) {
  for (int p : {1, 2, 4})
    for (int v : {1, 2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        const SimResult r = simulate(all_stages(Kind::interleaved, p, m, v), m, v);
        ASSERT_TRUE(r.errors.empty()) << "p " << p << " v " << v << " m " << m << ": "
                                      << r.errors.front();
        ASSERT_FALSE(r.deadlock) << "p " << p << " v " << v << " m " << m << ":\n" << r.report;
        EXPECT_TRUE(messages_pair_in_order(all_stages(Kind::interleaved, p, m, v), v))
            << "p " << p << " v " << v << " m " << m;
        const double formula = static_cast<double>(p - 1) / (v * m + p - 1);
        for (int s = 0; s < p; ++s)
          EXPECT_NEAR(r.bubble[s], formula, 1e-12)
              << "p " << p << " v " << v << " m " << m << " stage " << s;
      }
}

TEST(Step6_Schedules, BadArgumentsAreUsageErrors) {
  EXPECT_THROW(schedule_interleaved(2, 3, 2, 0), UsageError) << "m not a multiple of p";
  EXPECT_THROW(schedule_interleaved(2, 0, 2, 0), UsageError) << "m < 1";
  EXPECT_THROW(schedule_interleaved(2, 2, 0, 0), UsageError) << "v < 1";
  EXPECT_THROW(chunk_layers(4, 2, 4, 0, 0), UsageError) << "4 layers over 2 x 4 pieces";
  EXPECT_THROW(chunk_layers(6, 2, 2, 0, 0), UsageError) << "6 layers over 2 x 2 pieces";
}

TEST(Step6_ChunkLayers, PieceVsHoldsItsBlocks) {
  // 8 layers, 2 stages x 2 chunks: stage 0 holds [0,2) and [4,6), stage 1 [2,4) and [6,8)
  EXPECT_EQ(chunk_layers(8, 2, 2, 0, 0), (LayerRange{0, 2}));
  EXPECT_EQ(chunk_layers(8, 2, 2, 1, 0), (LayerRange{2, 4}));
  EXPECT_EQ(chunk_layers(8, 2, 2, 0, 1), (LayerRange{4, 6}));
  EXPECT_EQ(chunk_layers(8, 2, 2, 1, 1), (LayerRange{6, 8}));
  EXPECT_EQ(chunk_layers(4, 1, 4, 0, 3), (LayerRange{3, 4}));
}

namespace {

// The planted fault of step 6: the interleaved order with the backward chunks NOT reversed
// (chunk 0's backward first, as in forward). Written here, from the README's rule.
Schedule interleaved_not_reversed(int p, int m, int v, int stage) {
  Schedule s;
  auto unit = [&](int k) {
    const int group = k / (p * v), within = k % (p * v);
    return std::pair<int, int>{group * p + within % p, within / p};  // the fault: no v-1-...
  };
  auto fwd = [&](int k) {
    const auto [mb, c] = unit(k);
    if (prev_piece(p, v, stage, c).exists) s.push_back({Op::recv_activation, mb, c});
    s.push_back({Op::forward, mb, c});
    if (next_piece(p, v, stage, c).exists) s.push_back({Op::send_activation, mb, c});
  };
  auto bwd = [&](int k) {
    const auto [mb, c] = unit(k);
    if (next_piece(p, v, stage, c).exists) s.push_back({Op::recv_gradient, mb, c});
    s.push_back({Op::backward, mb, c});
    if (prev_piece(p, v, stage, c).exists) s.push_back({Op::send_gradient, mb, c});
  };
  const int total = m * v, warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  int f = 0, b = 0;
  for (; f < warmup; ++f) fwd(f);
  while (f < total) {
    fwd(f++);
    bwd(b++);
  }
  while (b < total) bwd(b++);
  return s;
}

}  // namespace

TEST(Step6_PlantedFault, BackwardChunksNotReversedDeadlocks) {
  // Chunk 0's backward needs the gradient of chunk 1's input, which only exists after chunk 1's
  // backward: the simulator reports every stage waiting.
  std::vector<Schedule> planted;
  for (int s = 0; s < 2; ++s) planted.push_back(interleaved_not_reversed(2, 4, 2, s));
  const SimResult r = simulate(planted, 4, 2);
  ASSERT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_TRUE(r.deadlock) << "the same check Step6_Simulated relies on must fail";
  EXPECT_NE(r.report.find("stage 0 waits"), std::string::npos) << r.report;
}
