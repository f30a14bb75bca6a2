#pragma once
// Shapes drawn at grading time (issue 34): a grader that checks a formula, a planner or index
// math only at fixed shapes passes a table of the values its failures once printed. These checks
// draw their shapes from a seed taken from std::random_device when the grader runs, the same on
// every rank, and print the seed with any failure (SCOPED_TRACE(draw.trace())), so a failing run
// can be repeated by hand with that seed.
//
//   labtest::Drawn draw;                      // collective: every rank gets rank 0's seed
//   SCOPED_TRACE(draw.trace());
//   const int p = draw.in(1, 9), m = draw.in(1, 16);
#include <cstdint>
#include <random>
#include <string>

#include <fmt/format.h>

#include "tests/support/lab_fixture.hpp"

namespace scalelab::labtest {

/// A generator seeded at grading time, the same on every rank of world().
class Drawn {
 public:
  /// Takes a seed from std::random_device on rank 0 and broadcasts it over world()
  /// (collective: every rank constructs one, in the same order).
  Drawn() : Drawn(broadcast_seed()) {}
  /// A given seed (to repeat a run, or for a sequence of its own).
  explicit Drawn(uint32_t seed) : seed_(seed), rng_(seed) {}
  /// The seed.
  uint32_t seed() const { return seed_; }
  /// A whole number in [lo, hi], uniformly.
  int in(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  /// "drawn with seed 123 (std::mt19937)": what a failure prints.
  std::string trace() const { return fmt::format("drawn with seed {} (std::mt19937)", seed_); }

 private:
  static uint32_t broadcast_seed() {
    Tensor s = Tensor::from_vector({static_cast<double>(std::random_device{}())}, {1}, DType::f64);
    world().broadcast(s, 0);
    return static_cast<uint32_t>(s.item());
  }
  uint32_t seed_;
  std::mt19937 rng_;
};

}  // namespace scalelab::labtest
