#pragma once
// Lab 07's counts written in the test (never the attendee's step 6), and the shapes they are
// checked at: step 5 grades the sequence-parallel model's bytes with these, so it does not need
// step 6; step 6 checks the attendee's formulas against the allocator and the byte counters at a
// shape drawn at grading time (tests/support/drawn.hpp), so a table of the values a failure once
// printed does not pass.
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/dtype.hpp"
#include "common/model_config.hpp"
#include "common/nn/parameter.hpp"
#include "common/ops/ops.hpp"
#include "tests/support/drawn.hpp"
#include "tp_test_support.hpp"

namespace lab07test {

/// Bytes of an activation and of a statistic (or a gradient): 4 and 4 in fp32, 2 and 4 in bf16.
inline int64_t elem_bytes(DType d) { return static_cast<int64_t>(dtype_size(d)); }
inline int64_t stat_bytes(DType d) { return static_cast<int64_t>(dtype_size(ops::stats_dtype(d))); }

/// What the tensor-parallel GPT's GPTActivations hold on one rank (B rows of T tokens, tp ranks,
/// activations in d; with sp, sequence parallel): per block the LayerNorms' inputs and outputs on
/// this rank's rows, q/k/v, the attention's output and the MLP's 4C on 1/tp of the features, the
/// attention matrix of this rank's heads; ln_f and the logits' 1/tp; the statistics in fp32.
inline std::size_t own_activation_bytes(const ModelConfig& c, int64_t B, int64_t T, int tp,
                                        DType d, bool sp) {
  const int64_t C = c.n_embd, N = B * T, rows = sp ? N / tp : N;
  const int64_t block = 4 * rows * C + 4 * N * C / tp + B * (c.n_head / tp) * T * T +
                        8 * N * C / tp;
  return static_cast<std::size_t>((c.n_layer * block + 2 * rows * C + N * c.vocab_size / tp) *
                                      elem_bytes(d) + (4 * c.n_layer + 2) * rows * stat_bytes(d));
}

/// The payload of every collective of one step (forward and backward), on every communicator:
/// tensor parallel 4 all-reduces of (N, C) per block, the embedding's and the head's, and the
/// cross-entropy's 3 of N; sequence parallel its all-gathers and reduce-scatters instead, and
/// the LayerNorm gradients' all-reduces.
inline std::size_t own_comm_bytes(const ModelConfig& c, int64_t B, int64_t T, DType d, bool sp) {
  const int64_t NC = B * T * c.n_embd, N = B * T, C = c.n_embd, L = c.n_layer;
  return static_cast<std::size_t>(
      sp ? (10 * L + 5) * NC * elem_bytes(d) + (4 * L * C + 2 * C + 3 * N) * stat_bytes(d)
         : (4 * L + 2) * NC * elem_bytes(d) + 3 * N * stat_bytes(d));
}

/// A model and batch drawn for this run: tp divides the heads, the vocabulary and the tokens.
struct DrawnShape {
  ModelConfig c;
  int64_t B = 0, T = 0;
  std::string trace;  ///< the seed, to repeat the run (labtest::Drawn::trace)
  /// "L 2, NH 4, C 32, V 260, B 3, T 8 (drawn from grading seed 123 ...; rerun: ...)": what a
  /// failure prints.
  std::string str() const {
    return fmt::format("L {}, NH {}, C {}, V {}, B {}, T {} ({})", c.n_layer, c.n_head, c.n_embd,
                       c.vocab_size, B, T, trace);
  }
};

/// A shape from `draw` for tp ranks: 1-3 layers, tp or 2tp heads of width 4 or 8, a vocabulary
/// of 256-300 that tp divides (the test's tokens are below 256), B of 1, 3, 4 or 5 (never the 2
/// the fixed checks use), T a multiple of tp from 2tp to 12 + 2tp (sequence parallel cuts B*T
/// rows by tp).
inline DrawnShape draw_shape(labtest::Drawn& draw, int tp) {
  DrawnShape s;
  s.trace = draw.trace();
  s.c.name = "tp-drawn";
  s.c.n_layer = draw.in(1, 3);
  s.c.n_head = tp * draw.in(1, 2);
  s.c.n_embd = s.c.n_head * (draw.in(0, 1) ? 8 : 4);
  s.c.vocab_size = static_cast<int64_t>(tp) * draw.in((256 + tp - 1) / tp, 300 / tp);
  const int b[] = {1, 3, 4, 5};
  s.B = b[draw.in(0, 3)];
  s.T = static_cast<int64_t>(tp) * draw.in(2, 12 / tp + 2);
  s.c.block_size = s.T;
  return s;
}

/// What is wrong with `got`, rank r's share of n (a range [lo, hi), kept along `dim` where a
/// shard has one), said as the rule it breaks and what it was, never as the right answer: ranks
/// keep equal contiguous pieces in rank order, rank 0 the first ("" when nothing).
inline std::string even_piece_problem(const std::string& got, int64_t lo, int64_t hi, int64_t n,
                                      int r, int tp) {
  if (hi - lo != n / tp)
    return got + fmt::format(": {} of {}, not 1/{} of them", hi - lo, n, tp);
  if (lo != r * (n / tp))
    return got + ": the ranks' pieces are contiguous and in rank order, rank 0's first";
  return "";
}

/// even_piece_problem of a Shard with one range along `dim`.
inline std::string shard_problem(const std::string& what, const nn::Shard& s, int want_dim,
                                 int64_t n, int r, int tp) {
  std::string got = fmt::format("{} gave dim {}:", what, s.dim);
  for (const auto& [b, e] : s.ranges) got += fmt::format(" [{}, {})", b, e);
  if (s.dim != want_dim || s.ranges.size() != 1)
    return got + fmt::format(": one range along dim {} ({})", want_dim,
                             want_dim == 0 ? "rows: output features" : "columns: input features");
  return even_piece_problem(got, s.ranges[0].first, s.ranges[0].second, n, r, tp);
}

/// Sizes tp divides for a drawn-shape check: the fixed `first`, then `count` more multiples of
/// tp up to 64 tp from `draw`.
inline std::vector<int64_t> drawn_sizes(labtest::Drawn& draw, int tp, int64_t first, int count) {
  std::vector<int64_t> out{first};
  for (int i = 0; i < count; ++i) out.push_back(static_cast<int64_t>(tp) * draw.in(1, 64));
  return out;
}

}  // namespace lab07test
