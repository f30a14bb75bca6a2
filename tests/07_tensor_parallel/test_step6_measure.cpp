// Lab 07 step 6: the formulas of the program's table, against what the tensor-parallel GPT
// (make_tp_gpt; fp32, and bf16 mixed precision: bf16 activations, fp32 statistics and gradients)
// actually holds and sends at this run's tp, with and without sequence parallelism: activation
// bytes equal GPTActivations::nbytes (every tensor its own allocation, so this is the allocator's
// count) and payload bytes equal the byte counters, both EXACTLY (integers; no tolerance). The
// model and batch are drawn at grading time (tests/support/drawn.hpp: a seed from
// std::random_device, printed with every failure so a run can be repeated): a formula right only at the shapes some
// earlier failure printed (a lookup table) fails. The oracle is the measurement itself: no
// formula is written in the tests (it is the step's answer). Planted, each made from the
// measurement at the shape asked: a count that forgets the LayerNorm statistics, one at two bytes
// for everything in bf16, one that counts a ring's wire bytes instead of the payload, and a table
// of the values at the shape the fixed check used to print must all fail. Like the check, these
// measure that model, so they need steps 1-5 working (on the untouched starter they stop at the
// first step not implemented).
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "common/ops/ops.hpp"
#include "tensor_parallel.hpp"
#include "tp_formulas.hpp"
#include "tp_test_support.hpp"

using namespace scalelab;
using namespace lab07test;

namespace {

struct Measured {
  std::size_t act = 0;    // GPTActivations::nbytes after the forward
  std::size_t stats = 0;  // the LayerNorm statistics among them (the planted faults use it)
  int64_t bytes = 0;      // the payload of the forward and backward, every communicator
};

// make_tp_gpt's model at this run's tp, one forward and backward on (B, T): what it holds and
// sends. Kept per shape: the check and the planted faults ask for the same ones again.
Measured measure(const ModelConfig& c, int64_t B, int64_t T, DType precision, bool sp) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, DType, bool>;
  static std::map<Key, Measured> seen;
  const Key key{c.n_layer, c.n_head, c.n_embd, c.vocab_size, B, T, precision, sp};
  if (const auto hit = seen.find(key); hit != seen.end()) return hit->second;
  auto owner = lab07::make_tp_gpt(c, group(), {.dtype = DType::f32, .compute_dtype = precision,
                                               .seed = 3, .sequence_parallel = sp});
  nn::GPT& model = *owner;
  const Tensor x = random_tokens(B, T, 256, 81), y = random_tokens(B, T, 256, 82);
  Measured m;
  const Traffic t = traffic_of([&] {
    nn::GPTActivations acts;
    model.forward(x, y, acts);
    m.act = acts.nbytes();
    for (const nn::BlockActivations& b : acts.blocks)
      for (const Tensor* s : {&b.ln1_mean, &b.ln1_rstd, &b.ln2_mean, &b.ln2_rstd})
        m.stats += s->nbytes();
    m.stats += acts.head.lnf_mean.nbytes() + acts.head.lnf_rstd.nbytes();
    model.backward(acts);
  });
  m.bytes = 0;
  for (const auto& [k, count] : t.moved) m.bytes += count.bytes;  // every communicator
  seen[key] = m;
  return m;
}
Measured measure(const DrawnShape& s, DType precision, bool sp) {
  return measure(s.c, s.B, s.T, precision, sp);
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
  // the payload of tensor parallelism does not depend on tp (the formula has no tp): at a
  // shape drawn for 4 ranks, it equals what this run's tp ranks send
  const std::size_t formula = lab07::comm_bytes_formula(s.c, s.B, s.T, DType::f32, false);
  const int64_t sent = measure(s, DType::f32, false).bytes;
  EXPECT_TRUE(formula == static_cast<std::size_t>(sent))
      << "the payload formula without sequence parallelism gives " << formula << " bytes, the "
      << "byte counters saw " << sent << " at tp " << size() << " (every communicator, one "
      << "forward and backward)";
}

// ---- planted faults: "formulas" that read the measurement (never the attendee's code, and no
// formula written here), then with one mistake each ------------------------------------------

namespace {

std::size_t right_act(const ModelConfig& c, int64_t B, int64_t T, int tp, DType d, bool sp) {
  EXPECT_EQ(tp, size()) << "the planted counts measure at this run's tp";
  return measure(c, B, T, d, sp).act;
}
std::size_t right_comm(const ModelConfig& c, int64_t B, int64_t T, DType d, bool sp) {
  return static_cast<std::size_t>(measure(c, B, T, d, sp).bytes);
}
std::size_t no_stats_act(const ModelConfig& c, int64_t B, int64_t T, int tp, DType d, bool sp) {
  return right_act(c, B, T, tp, d, sp) - measure(c, B, T, d, sp).stats;
}

}  // namespace

TEST(Step6_PlantedFault, TheFaultsBaseItselfPasses) { EXPECT_TRUE(formulas_match(right_act, right_comm)); }

TEST(Step6_PlantedFault, ForgettingTheLayerNormStatisticsIsCaught) {
  EXPECT_FALSE(formulas_match(no_stats_act, right_comm)) << "the check above must fail";
}

// Mixed precision keeps the statistics, the cross-entropy's per-row numbers and the gradients
// in fp32: counting everything at the activations' 2 bytes is wrong in bf16 (right in fp32).
// Everything at 2 bytes is half of the fp32 count, where everything is 4.
TEST(Step6_PlantedFault, CountingEverythingAtTwoBytesInBf16IsCaught) {
  const ActFormula all_act = [](const ModelConfig& c, int64_t B, int64_t T, int tp, DType d,
                                bool sp) {
    return d == DType::bf16 ? right_act(c, B, T, tp, DType::f32, sp) / 2
                            : right_act(c, B, T, tp, d, sp);
  };
  const CommFormula all_comm = [](const ModelConfig& c, int64_t B, int64_t T, DType d, bool sp) {
    return d == DType::bf16 ? right_comm(c, B, T, DType::f32, sp) / 2 : right_comm(c, B, T, d, sp);
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
    return no_stats_act(c, B, T, tp, d, sp);
  };
  EXPECT_EQ(table(fixed, 2, 16, size(), DType::f32, false),
            right_act(fixed, 2, 16, size(), DType::f32, false)) << "right where it was printed";
  EXPECT_FALSE(formulas_match(table, right_comm)) << "the check above must fail";
}
