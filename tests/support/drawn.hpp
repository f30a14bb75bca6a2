#pragma once
// Shapes drawn at grading time (issue 34): a grader that checks a formula, a planner or index
// math only at fixed shapes passes a table of the values its failures once printed. These checks
// draw their shapes from the grading seed: SCALELAB_GRADE_SEED when set, else taken from
// std::random_device on rank 0 when the grader runs, the same on every rank. A failure prints the
// seed and the command that repeats the run (SCOPED_TRACE(draw.trace())):
//   "drawn from grading seed 2961 (draw 3 of this run; rerun: SCALELAB_GRADE_SEED=2961
//    ./scalelab grade 08)"
//
//   labtest::Drawn draw;                      // collective: every rank gets the same seed
//   SCOPED_TRACE(draw.trace());
//   const int p = draw.in(1, 9), m = draw.in(1, 16);
#include <cstdint>
#include <cstdlib>
#include <random>
#include <regex>
#include <string>

#include <unistd.h>

#include <fmt/format.h>

#include "tests/support/lab_fixture.hpp"

namespace scalelab::labtest {

/// The seed of this grading run, the same on every rank: SCALELAB_GRADE_SEED when set, else
/// rank 0's std::random_device, broadcast over world(); once per process (collective on its
/// first call: every rank makes it in the same test). Every shape a run draws derives from it,
/// so that seed given back (grade_rerun_line) draws the same shapes again.
inline uint32_t grading_seed() {
  static const uint32_t seed = [] {
    if (const char* s = std::getenv("SCALELAB_GRADE_SEED"))
      return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
    Tensor t = Tensor::from_vector({static_cast<double>(std::random_device{}())}, {1}, DType::f64);
    world().broadcast(t, 0);
    return static_cast<uint32_t>(t.item());
  }();
  return seed;
}

/// "SCALELAB_GRADE_SEED=123 ./scalelab grade 08": the run that draws this run's shapes again
/// (the lab from this test binary's name, test_lab08 or test_lab08_solution).
inline std::string grade_rerun_line() {
  char exe[4096] = {0};
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::smatch m;
  const std::string path(exe, n > 0 ? static_cast<std::size_t>(n) : 0);
  const std::string lab = std::regex_search(path, m, std::regex("test_lab([0-9][0-9])")) ? m[1].str()
                                                                                          : "NN";
  return fmt::format("SCALELAB_GRADE_SEED={} ./scalelab grade {}", grading_seed(), lab);
}

/// A generator seeded from the grading seed, the same on every rank of world(): the n-th Drawn
/// of a process is seeded grading_seed() + n, so each draws its own numbers and a rerun with the
/// same seed (the grader runs the same tests in the same order) draws them all again.
class Drawn {
 public:
  /// Collective on the process's first one (grading_seed): every rank constructs one, in the
  /// same order.
  Drawn() : index_(counter()++), seed_(grading_seed() + static_cast<uint32_t>(index_)),
            rng_(seed_) {}
  /// A given seed (a sequence of its own).
  explicit Drawn(uint32_t seed) : seed_(seed), rng_(seed) {}
  /// The seed.
  uint32_t seed() const { return seed_; }
  /// A whole number in [lo, hi], uniformly.
  int in(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  /// What a failure prints: where the numbers came from and the command that draws them again.
  std::string trace() const {
    if (index_ < 0) return fmt::format("drawn with seed {} (std::mt19937)", seed_);
    return fmt::format("drawn from grading seed {} (draw {} of this run; rerun: {})",
                       grading_seed(), index_, grade_rerun_line());
  }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  int index_ = -1;  ///< the n-th Drawn of this process; -1: a given seed (declared first: the
                    ///< seed is made from it)
  uint32_t seed_;
  std::mt19937 rng_;
};

}  // namespace scalelab::labtest
