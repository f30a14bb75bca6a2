// Lab 07 step 6: the formulas of the program's table, against what the tensor-parallel GPT
// (make_tp_gpt; fp32, and bf16 mixed precision: bf16 activations, fp32 statistics and gradients;
// 2 layers, 4 heads, C = 64, V = 256, T = 16) actually holds and sends at this run's tp, with and
// without sequence parallelism: activation bytes equal GPTActivations::nbytes (every tensor its own
// allocation, so this is the allocator's count) and payload bytes equal the byte counters, both
// EXACTLY (integers; no tolerance). Planted: a count that forgets the LayerNorm statistics and one
// that counts a ring's wire bytes instead of the payload must both fail. Unlike the other steps'
// planted faults, these measure that model, so they need steps 1-5 working (on the untouched starter
// they stop at the first step not implemented).
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/ops/ops.hpp"
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

Measured measure(DType precision, bool sp) {
  auto owner = lab07::make_tp_gpt(config(), group(), {.dtype = DType::f32,
                                                     .compute_dtype = precision, .seed = 3,
                                                     .sequence_parallel = sp});
  nn::GPT& model = *owner;
  const Tensor x = random_tokens(kB, kT, 256, 81), y = random_tokens(kB, kT, 256, 82);
  Measured m;
  const Traffic t = traffic_of([&] {
    nn::GPTActivations acts;
    model.forward(x, y, acts);
    m.act = acts.nbytes();
    model.backward(acts);
  });
  m.bytes = 0;
  for (const auto& [key, count] : t.moved) m.bytes += count.bytes;  // every communicator
  return m;
}

using ActFormula =
    std::function<std::size_t(const ModelConfig&, int64_t, int64_t, int, DType, bool)>;
using CommFormula = std::function<std::size_t(const ModelConfig&, int64_t, int64_t, DType, bool)>;

::testing::AssertionResult formulas_match(const ActFormula& act, const CommFormula& comm) {
  Verdict v;
  for (DType precision : {DType::f32, DType::bf16})
    for (bool sp : {false, true}) {
      const std::size_t a = act(config(), kB, kT, size(), precision, sp);
      const std::size_t c = comm(config(), kB, kT, precision, sp);
      const Measured m = measure(precision, sp);
      const std::string which =
          std::string(dtype_name(precision)) + (sp ? ", sequence parallel: " : ": ");
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
    EXPECT_LT(lab07::activation_bytes_formula(c, kB, kT, tp, DType::f32, true),
              lab07::activation_bytes_formula(c, kB, kT, tp, DType::f32, false));
    EXPECT_LT(lab07::activation_bytes_formula(c, kB, kT, tp, DType::f32, false),
              lab07::activation_bytes_formula(c, kB, kT, 1, DType::f32, false));
  }
  // the payload of tensor parallelism does not depend on tp: B*T*C per all-reduce
  EXPECT_EQ(lab07::comm_bytes_formula(c, kB, kT, DType::f32, false),
            static_cast<std::size_t>((4 * c.n_layer + 2) * kB * kT * c.n_embd + 3 * kB * kT) * 4);
}

// ---- planted faults: the step-6 counts written here (never the attendee's code), then with
// one mistake each --------------------------------------------------------------------------

namespace {

// Bytes of an activation and of a statistic (or a gradient): 4 and 4 in fp32, 2 and 4 in bf16.
int64_t elem(DType d) { return static_cast<int64_t>(dtype_size(d)); }
int64_t stat(DType d) { return static_cast<int64_t>(dtype_size(ops::stats_dtype(d))); }

std::size_t right_act(const ModelConfig& c, int64_t B, int64_t T, int tp, DType d, bool sp) {
  const int64_t C = c.n_embd, N = B * T, rows = sp ? N / tp : N;
  const int64_t block = 4 * rows * C + 4 * N * C / tp + B * (c.n_head / tp) * T * T +
                        8 * N * C / tp;
  return static_cast<std::size_t>((c.n_layer * block + 2 * rows * C + N * c.vocab_size / tp) *
                                      elem(d) + (4 * c.n_layer + 2) * rows * stat(d));
}

std::size_t right_comm(const ModelConfig& c, int64_t B, int64_t T, DType d, bool sp) {
  const int64_t NC = B * T * c.n_embd, N = B * T, C = c.n_embd, L = c.n_layer;
  return static_cast<std::size_t>(sp ? (10 * L + 5) * NC * elem(d) + (4 * L * C + 2 * C + 3 * N) * stat(d)
                                     : (4 * L + 2) * NC * elem(d) + 3 * N * stat(d));
}

}  // namespace

TEST(Step6_PlantedFault, TheFaultsBaseItselfPasses) { EXPECT_TRUE(formulas_match(right_act, right_comm)); }

TEST(Step6_PlantedFault, ForgettingTheLayerNormStatisticsIsCaught) {
  const ActFormula no_stats = [](const ModelConfig& c, int64_t B, int64_t T, int tp, DType d,
                                 bool sp) {
    const int64_t N = B * T, rows = sp ? N / tp : N;
    // the 4 statistics per block and ln_f's 2, of `rows` numbers each, left out
    return right_act(c, B, T, tp, d, sp) -
           static_cast<std::size_t>((4 * c.n_layer + 2) * rows * stat(d));
  };
  EXPECT_FALSE(formulas_match(no_stats, right_comm)) << "the check above must fail";
}

// Mixed precision keeps the statistics, the cross-entropy's per-row numbers and the gradients
// in fp32: counting everything at the activations' 2 bytes is wrong in bf16 (right in fp32).
TEST(Step6_PlantedFault, CountingEverythingAtTwoBytesInBf16IsCaught) {
  const ActFormula all_act = [](const ModelConfig& c, int64_t B, int64_t T, int tp, DType d,
                                bool sp) {
    const int64_t N = B * T, rows = sp ? N / tp : N;
    return right_act(c, B, T, tp, d, sp) -
           static_cast<std::size_t>((4 * c.n_layer + 2) * rows * (stat(d) - elem(d)));
  };
  const CommFormula all_comm = [](const ModelConfig& c, int64_t B, int64_t T, DType d, bool sp) {
    const int64_t N = B * T, C = c.n_embd;
    return right_comm(c, B, T, d, sp) -
           static_cast<std::size_t>((sp ? 4 * c.n_layer * C + 2 * C + 3 * N : 3 * N) *
                                    (stat(d) - elem(d)));
  };
  EXPECT_FALSE(formulas_match(all_act, right_comm)) << "activations: the check above must fail";
  EXPECT_FALSE(formulas_match(right_act, all_comm)) << "payload: the check above must fail";
}

// Wire bytes of a ring (lab 01's bus bandwidth factors): 2(n-1)/n of the payload for an
// all-reduce, (n-1)/n for an all-gather or a reduce-scatter. At tp = 2 the all-reduce's factor
// is 1, so only the sequence-parallel count (mostly all-gathers and reduce-scatters) differs.
TEST(Step6_PlantedFault, CountingWireBytesInsteadOfPayloadIsCaught) {
  if (size() == 1) GTEST_SKIP() << "one rank: nothing crosses a wire, the payload is all there is";
  const CommFormula wire = [](const ModelConfig& c, int64_t B, int64_t T, DType d, bool sp) {
    const double n = size();
    return static_cast<std::size_t>((sp ? (n - 1) / n : 2 * (n - 1) / n) *
                                    static_cast<double>(right_comm(c, B, T, d, sp)));
  };
  EXPECT_FALSE(formulas_match(right_act, wire)) << "the check above must fail";
}
