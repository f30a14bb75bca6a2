#pragma once
// The shapes lab 07's drawn checks run at (tests/support/drawn.hpp): step 6 checks the
// attendee's formulas against the allocator and the byte counters at a shape drawn at grading
// time, so a table of the values a failure once printed does not pass; steps 2-4 cut sizes drawn
// alike. No byte count is written here: the tests measure them (step 5 with mappings of its
// own, step 6 the model itself), since the formulas are step 6's answer.
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/model_config.hpp"
#include "common/nn/parameter.hpp"
#include "tests/support/drawn.hpp"
#include "tp_test_support.hpp"

namespace lab07test {

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
