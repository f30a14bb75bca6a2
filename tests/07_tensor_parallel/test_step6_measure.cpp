// Lab 07 step 6: the formulas of the program's table, against what a TPGPT (float32; 2 layers,
// 4 heads, C = 64, V = 256, T = 16) actually holds and sends at this run's tp, with and without
// sequence parallelism: activation bytes equal TPActivations::nbytes (every tensor its own
// allocation, so this is the allocator's count) and payload bytes equal the byte counters, both
// EXACTLY (integers; no tolerance). Planted: a count that forgets the LayerNorm statistics and one
// that counts a ring's wire bytes instead of the payload must both fail. Unlike the other steps'
// planted faults, these measure a TPGPT, so they need steps 1-5 working (on the untouched starter
// they stop at the first step not implemented).
#include <gtest/gtest.h>

#include <functional>

#include "tensor_parallel.hpp"
#include "tp_test_support.hpp"

using namespace scalelab;
using namespace lab07test;

namespace {

constexpr int64_t kB = 2, kT = 16;

ModelConfig config() { return ModelConfig{"tp-measure", 256, 16, 2, 4, 64}; }

struct Measured {
  std::size_t act = 0;
  int64_t bytes = 0;
};

Measured measure(bool sp) {
  lab07::TPGPT model(config(), group(), {.dtype = DType::f32, .seed = 3, .sequence_parallel = sp});
  const Tensor x = random_tokens(kB, kT, 256, 81), y = random_tokens(kB, kT, 256, 82);
  Measured m;
  const Traffic t = traffic_of([&] {
    lab07::TPActivations acts;
    model.forward(x, y, acts);
    m.act = acts.nbytes();
    model.backward(acts);
  });
  m.bytes = t.all().bytes;
  return m;
}

using ActFormula = std::function<std::size_t(const ModelConfig&, int64_t, int64_t, int,
                                             std::size_t, bool)>;
using CommFormula =
    std::function<std::size_t(const ModelConfig&, int64_t, int64_t, std::size_t, bool)>;

::testing::AssertionResult formulas_match(const ActFormula& act, const CommFormula& comm) {
  Verdict v;
  for (bool sp : {false, true}) {
    const std::size_t a = act(config(), kB, kT, size(), 4, sp);
    const std::size_t c = comm(config(), kB, kT, 4, sp);
    const Measured m = measure(sp);
    const char* which = sp ? "sequence parallel: " : "";
    if (a != m.act)
      v(::testing::AssertionFailure() << which << "activations " << m.act
                                      << " bytes measured, formula " << a, "");
    if (c != static_cast<std::size_t>(m.bytes))
      v(::testing::AssertionFailure() << which << "payload " << m.bytes
                                      << " bytes counted, formula " << c, "");
  }
  return v.first;
}

}  // namespace

TEST(Step6_Measure, FormulasEqualTheAllocatorAndTheByteCounters) {
  EXPECT_TRUE(formulas_match(lab07::activation_bytes_formula, lab07::comm_bytes_formula));
}

TEST(Step6_Measure, SequenceParallelHoldsLessAndTensorParallelSendsTheSameAtAnyTp) {
  const ModelConfig c = config();
  for (int tp : {2, 4}) {
    EXPECT_LT(lab07::activation_bytes_formula(c, kB, kT, tp, 4, true),
              lab07::activation_bytes_formula(c, kB, kT, tp, 4, false));
    EXPECT_LT(lab07::activation_bytes_formula(c, kB, kT, tp, 4, false),
              lab07::activation_bytes_formula(c, kB, kT, 1, 4, false));
  }
  // the payload of tensor parallelism does not depend on tp: B*T*C per all-reduce
  EXPECT_EQ(lab07::comm_bytes_formula(c, kB, kT, 4, false),
            static_cast<std::size_t>((4 * c.n_layer + 2) * kB * kT * c.n_embd + 3 * kB * kT) * 4);
}

// ---- planted faults: the step-6 counts written here (never the attendee's code), then with
// one mistake each --------------------------------------------------------------------------

namespace {

std::size_t right_act(const ModelConfig& c, int64_t B, int64_t T, int tp, std::size_t e, bool sp) {
  const int64_t C = c.n_embd, N = B * T, rows = sp ? N / tp : N;
  const int64_t block = 4 * rows * C + 4 * rows + 4 * N * C / tp + B * (c.n_head / tp) * T * T +
                        8 * N * C / tp;
  return static_cast<std::size_t>(c.n_layer * block + 2 * rows * C + 2 * rows +
                                  N * c.vocab_size / tp) * e;
}

std::size_t right_comm(const ModelConfig& c, int64_t B, int64_t T, std::size_t e, bool sp) {
  const int64_t NC = B * T * c.n_embd, N = B * T, C = c.n_embd, L = c.n_layer;
  return static_cast<std::size_t>(sp ? 10 * L * NC + 4 * L * C + 5 * NC + 2 * C + 3 * N
                                     : (4 * L + 2) * NC + 3 * N) * e;
}

}  // namespace

TEST(Step6_PlantedFault, TheFaultsBaseItselfPasses) { EXPECT_TRUE(formulas_match(right_act, right_comm)); }

TEST(Step6_PlantedFault, ForgettingTheLayerNormStatisticsIsCaught) {
  const ActFormula no_stats = [](const ModelConfig& c, int64_t B, int64_t T, int tp,
                                 std::size_t e, bool sp) {
    const int64_t N = B * T, rows = sp ? N / tp : N;
    // the 4 statistics per block and ln_f's 2, of `rows` numbers each, left out
    return right_act(c, B, T, tp, e, sp) - static_cast<std::size_t>((4 * c.n_layer + 2) * rows) * e;
  };
  EXPECT_FALSE(formulas_match(no_stats, right_comm)) << "the check above must fail";
}

// Wire bytes of a ring (lab 01's bus bandwidth factors): 2(n-1)/n of the payload for an
// all-reduce, (n-1)/n for an all-gather or a reduce-scatter. At tp = 2 the all-reduce's factor
// is 1, so only the sequence-parallel count (mostly all-gathers and reduce-scatters) differs.
TEST(Step6_PlantedFault, CountingWireBytesInsteadOfPayloadIsCaught) {
  if (size() == 1) GTEST_SKIP() << "one rank: nothing crosses a wire, the payload is all there is";
  const CommFormula wire = [](const ModelConfig& c, int64_t B, int64_t T, std::size_t e, bool sp) {
    const double n = size();
    return static_cast<std::size_t>((sp ? (n - 1) / n : 2 * (n - 1) / n) *
                                    static_cast<double>(right_comm(c, B, T, e, sp)));
  };
  EXPECT_FALSE(formulas_match(right_act, wire)) << "the check above must fail";
}
