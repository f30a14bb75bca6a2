// Lab 07 step 6: the formulas of the program's table, against what the tensor-parallel GPT
// (make_tp_gpt; fp32, and bf16 mixed precision: bf16 activations, fp32 statistics and gradients)
// actually holds and sends at this run's tp, with and without sequence parallelism: activation
// bytes equal GPTActivations::nbytes (every tensor its own allocation, so this is the allocator's
// count) and payload bytes equal the byte counters, both EXACTLY (integers; no tolerance). The
// model and batch are drawn at grading time (tests/support/drawn.hpp: a seed from
// std::random_device, printed with every failure so a run can be repeated): a formula right only at the shapes some
// earlier failure printed (a lookup table) fails. Planted: a count that forgets the LayerNorm
// statistics, one at two bytes for everything in bf16, one that counts a ring's wire bytes
// instead of the payload, and a table of the values at the shape the fixed check used to print
// must all fail. Unlike the other steps' planted faults, these measure that model, so they need
// steps 1-5 working (on the untouched starter they stop at the first step not implemented).
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <tuple>

#include "common/ops/ops.hpp"
#include "tensor_parallel.hpp"
#include "tp_formulas.hpp"
#include "tp_test_support.hpp"

using namespace scalelab;
using namespace lab07test;

namespace {

struct Measured {
  std::size_t act = 0;
  int64_t bytes = 0;
};

Measured measure(const DrawnShape& s, DType precision, bool sp) {
  auto owner = lab07::make_tp_gpt(s.c, group(), {.dtype = DType::f32,
                                                 .compute_dtype = precision, .seed = 3,
                                                 .sequence_parallel = sp});
  nn::GPT& model = *owner;
  const Tensor x = random_tokens(s.B, s.T, 256, 81), y = random_tokens(s.B, s.T, 256, 82);
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

// This run's shape: drawn once per process (every rank the same), printed with every failure.
const DrawnShape& shape() {
  static labtest::Drawn draw;
  static const DrawnShape s = draw_shape(draw, size());
  return s;
}

using ActFormula =
    std::function<std::size_t(const ModelConfig&, int64_t, int64_t, int, DType, bool)>;
using CommFormula = std::function<std::size_t(const ModelConfig&, int64_t, int64_t, DType, bool)>;

::testing::AssertionResult formulas_match(const ActFormula& act, const CommFormula& comm) {
  const DrawnShape& s = shape();
  Verdict v;
  for (DType precision : {DType::f32, DType::bf16})
    for (bool sp : {false, true}) {
      const std::size_t a = act(s.c, s.B, s.T, size(), precision, sp);
      const std::size_t c = comm(s.c, s.B, s.T, precision, sp);
      const Measured m = measure(s, precision, sp);
      const std::string which = fmt::format("at the shape {}, {}{}: ", s.str(),
                                            dtype_name(precision),
                                            sp ? ", sequence parallel" : "");
      if (a != m.act)
        v(::testing::AssertionFailure()
              << which << "the activation formula gives " << a << " bytes, but the model's "
              << "GPTActivations hold " << m.act << " (nbytes() after one forward at that shape; "
              << "count its tensors one by one)", "");
      if (c != static_cast<std::size_t>(m.bytes))
        v(::testing::AssertionFailure()
              << which << "the payload formula gives " << c << " bytes, but the byte counters "
              << "saw " << m.bytes << " over one forward and backward on every communicator "
              << "(comm::comm_stats() around the step shows each collective)", "");
    }
  return v.first;
}

}  // namespace

TEST(Step6_Measure, FormulasEqualTheAllocatorAndTheByteCounters) {
  EXPECT_TRUE(formulas_match(lab07::activation_bytes_formula, lab07::comm_bytes_formula));
}

TEST(Step6_Measure, SequenceParallelHoldsLessAndTensorParallelSendsTheSameAtAnyTp) {
  labtest::Drawn draw;
  const DrawnShape s = draw_shape(draw, 4);  // heads, vocabulary and rows split by 1, 2 and 4
  SCOPED_TRACE("at the shape " + s.str());
  for (int tp : {2, 4}) {
    EXPECT_LT(lab07::activation_bytes_formula(s.c, s.B, s.T, tp, DType::f32, true),
              lab07::activation_bytes_formula(s.c, s.B, s.T, tp, DType::f32, false))
        << "tp " << tp << ": sequence parallelism keeps the LayerNorms' tensors on N/tp rows";
    EXPECT_LT(lab07::activation_bytes_formula(s.c, s.B, s.T, tp, DType::f32, false),
              lab07::activation_bytes_formula(s.c, s.B, s.T, 1, DType::f32, false))
        << "tp " << tp << ": a tensor-parallel rank holds 1/tp of the heads and the MLP";
  }
  // the payload of tensor parallelism does not depend on tp: B*T*C per all-reduce
  EXPECT_TRUE(lab07::comm_bytes_formula(s.c, s.B, s.T, DType::f32, false) ==
              own_comm_bytes(s.c, s.B, s.T, DType::f32, false))
      << "the payload formula without sequence parallelism: 4 all-reduces of (B*T, C) per "
         "block, one each for the embedding and the head, and the cross-entropy's 3 of B*T";
}

// ---- planted faults: the step-6 counts written here (tp_formulas.hpp, never the attendee's
// code), then with one mistake each --------------------------------------------------------

namespace {

std::size_t right_act(const ModelConfig& c, int64_t B, int64_t T, int tp, DType d, bool sp) {
  return own_activation_bytes(c, B, T, tp, d, sp);
}
std::size_t right_comm(const ModelConfig& c, int64_t B, int64_t T, DType d, bool sp) {
  return own_comm_bytes(c, B, T, d, sp);
}
int64_t elem(DType d) { return elem_bytes(d); }
int64_t stat(DType d) { return stat_bytes(d); }

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

// A lookup table: the right counts at the one shape the fixed check used to run and print (2
// layers, 4 heads, C = 64, V = 256, B = 2, T = 16), a count that forgets the statistics
// elsewhere. The drawn shape (B never 2) is elsewhere.
TEST(Step6_PlantedFault, ATableOfThePrintedShapeIsCaught) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, DType, bool>;
  const auto key = [](const ModelConfig& c, int64_t B, int64_t T, int tp, DType d, bool sp) {
    return Key{c.n_layer, c.n_head, c.n_embd, c.vocab_size, B, T, tp, d, sp};
  };
  std::map<Key, std::size_t> printed;
  const ModelConfig fixed{"tp-measure", 256, 16, 2, 4, 64};
  for (DType d : {DType::f32, DType::bf16})
    for (bool sp : {false, true})
      printed[key(fixed, 2, 16, size(), d, sp)] = right_act(fixed, 2, 16, size(), d, sp);
  const ActFormula table = [&](const ModelConfig& c, int64_t B, int64_t T, int tp, DType d,
                               bool sp) {
    const auto hit = printed.find(key(c, B, T, tp, d, sp));
    if (hit != printed.end()) return hit->second;
    const int64_t rows = sp ? B * T / tp : B * T;
    return right_act(c, B, T, tp, d, sp) -
           static_cast<std::size_t>((4 * c.n_layer + 2) * rows * stat(d));
  };
  EXPECT_EQ(table(fixed, 2, 16, size(), DType::f32, false),
            right_act(fixed, 2, 16, size(), DType::f32, false)) << "right where it was printed";
  EXPECT_FALSE(formulas_match(table, right_comm)) << "the check above must fail";
}
