// Lab 09 step 1: shards of a padded flat layout. Graded against the library's nn::shard_range
// (a reference, not the attendee's code, which must not call it: Step1_OwnWork) and through a
// layout check that the planted faults
// (floor-divided shards that lose the remainder; a last shard that takes the remainder and so is
// bigger than the others) must fail. Pure index math: exact.
#include <functional>

#include <gtest/gtest.h>

#include "common/errors.hpp"
#include "tests/09_zero/zero_checks.hpp"
#include "tests/support/drawn.hpp"
#include "tests/support/own_work.hpp"

using namespace scalelab;

namespace {

using ShardFn = std::function<nn::ShardRange(int64_t numel, int rank, int n)>;

// Everything a ZeRO layout needs, as a list of what is wrong ("" when nothing): n shards of ONE
// size (all_gather / reduce_scatter move equal chunks), back to back from 0, padding under n
// elements, and real parts that cover [0, numel) exactly once.
std::string layout_problems(const ShardFn& shard, int64_t numel, int n) {
  std::string problems;
  int64_t next_lo = 0, next_real = 0;
  const int64_t size = shard(numel, 0, n).size;
  for (int r = 0; r < n; ++r) {
    const nn::ShardRange s = shard(numel, r, n);
    if (s.size != size) problems += fmt::format(" shard {} has size {}, shard 0 {};", r, s.size, size);
    if (s.lo != std::min(next_lo, numel))
      problems += fmt::format(" shard {} starts at {}, not where shard {}'s padded piece ends (or "
                              "at numel, if that is beyond it);", r, s.lo, r - 1);
    if (s.hi < s.lo || s.hi > s.lo + s.size)
      problems += fmt::format(" shard {}: real part [{}, {}) outside [{}, {});", r, s.lo, s.hi,
                              s.lo, s.lo + s.size);
    if (s.real() > 0 && s.lo != next_real)
      problems += fmt::format(" shard {}: real part starts at {}, not where the real parts before "
                              "it end;", r, s.lo);
    next_lo += s.size;
    next_real = std::max(next_real, s.hi);
  }
  if (next_real != numel) problems += fmt::format(" real parts end at {}, not {};", next_real, numel);
  if (next_lo < numel || next_lo - numel >= std::max(n, 1) )
    problems += fmt::format(" {} shards of {} cover {} elements for {} (padding must be < n);", n,
                            size, next_lo, numel);
  return problems.empty() ? "" : fmt::format("numel {}, n {}:{}", numel, n, problems);
}

const std::vector<int64_t> kNumels = {0, 1, 2, 3, 5, 7, 10, 12, 13, 100, 1001, 65537};
const std::vector<int> kShards = {1, 2, 3, 4, 8};

}  // namespace

// What differs from the library's layout at (numel, r, n), named without the library's answer
// ("" when nothing).
std::string differs_from_the_library(int64_t numel, int r, int n) {
  const nn::ShardRange got = lab09::shard_range(numel, r, n), want = nn::shard_range(numel, r, n);
  if (got.lo == want.lo && got.hi == want.hi && got.size == want.size) return "";
  const char* what = got.size != want.size ? "size (one size for every shard, the padding under n)"
                     : got.lo != want.lo   ? "lo (where the shard's real part starts)"
                                           : "hi (where its real part ends)";
  return fmt::format("shard_range(numel {}, rank {}, n {}) gave lo {}, hi {}, size {}: its {} is "
                     "not the library's layout (EqualShardsCoverTheLayoutWithPaddingUnderN names "
                     "the rule)", numel, r, n, got.lo, got.hi, got.size, what);
}

TEST(Step1_Shards, SameAsTheLibraryReference) {
  for (int64_t numel : kNumels)
    for (int n : kShards)
      for (int r = 0; r < n; ++r) {
        const std::string p = differs_from_the_library(numel, r, n);
        if (!p.empty()) ADD_FAILURE() << p;
      }
  // and sizes drawn at grading time (tests/support/drawn.hpp: the seed printed with a failure):
  // a table of the sizes above passes none of them
  labtest::Drawn draw;
  SCOPED_TRACE("sizes " + draw.trace());
  for (int i = 0; i < 64; ++i) {
    const int64_t numel = draw.in(0, 1 << 20);
    const int n = draw.in(1, 96);
    for (int r : {0, draw.in(0, n - 1), n - 1}) {
      const std::string p = differs_from_the_library(numel, r, n);
      if (!p.empty()) ADD_FAILURE() << p;
    }
    const std::string layout = layout_problems(lab09::shard_range, numel, n);
    if (!layout.empty()) ADD_FAILURE() << layout;
  }
}

// The README asks for your own shard_range: the object compiled from zero.cpp must not call the
// library's nn::shard_range (its undefined symbols, tests/support/own_work.hpp). A file that
// forwards to it passes every table above; lab09.planted.step1_calls_the_library (lab.cmake)
// grades one.
TEST(Step1_OwnWork, ShardRangeIsYourOwnNotTheLibrarys) {
  EXPECT_TRUE(labtest::calls_none_of({"scalelab::nn::shard_range("},
                                     "step 1 asks for your own shard_range"));
}

TEST(Step1_Shards, EqualShardsCoverTheLayoutWithPaddingUnderN) {
  for (int64_t numel : kNumels)
    for (int n : kShards) EXPECT_EQ(layout_problems(lab09::shard_range, numel, n), "");
  // 10 elements over 4: size 3, padded to 12; shard 3 holds one real element
  const nn::ShardRange last = lab09::shard_range(10, 3, 4);
  EXPECT_EQ(last.lo, 9);
  EXPECT_EQ(last.hi, 10);
  EXPECT_EQ(last.size, 3);
  // more shards than elements: the last shards are all padding
  EXPECT_EQ(lab09::shard_range(2, 3, 4).real(), 0);
  EXPECT_EQ(lab09::shard_range(2, 3, 4).lo, 2) << "all padding: lo = hi = numel";
}

TEST(Step1_Shards, TheModelsShardsOnThisWorldCoverItsParameters) {
  // Every rank's real part, all-gathered: together exactly the model's elements, once.
  nn::GPTOptions o = lab09test::f32();
  o.storage.pad_to = labtest::world().size();
  nn::GPT model(lab09test::kLab.config(), o);
  const int n = labtest::world().size();
  const nn::ShardRange mine = lab09::shard_range(model.num_parameters(), labtest::world().rank(), n);
  Tensor real = Tensor::from_vector({static_cast<double>(mine.lo), static_cast<double>(mine.hi)}, {2},
                                    DType::f64);
  Tensor all = Tensor::empty({2 * n}, DType::f64);
  labtest::world().all_gather(real, all);
  int64_t covered = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(static_cast<int64_t>(all.item(2 * r)), covered) << "shard " << r;
    covered = std::max(covered, static_cast<int64_t>(all.item(2 * r + 1)));
  }
  EXPECT_EQ(covered, model.num_parameters());
  EXPECT_EQ(mine.size * n, model.params().padded_numel()) << "pad_to = n: shards tile the padded layout";
}

TEST(Step1_Shards, BadArgumentsAreUsageErrors) {
  EXPECT_THROW(lab09::shard_range(10, 0, 0), UsageError);
  EXPECT_THROW(lab09::shard_range(10, 4, 4), UsageError);
  EXPECT_THROW(lab09::shard_range(10, -1, 4), UsageError);
  EXPECT_THROW(lab09::shard_range(-1, 0, 4), UsageError);
}

TEST(Step1_PlantedFault, FloorDividedShardsAreCaught) {
  // size = numel / n: fine when n divides numel, loses the remainder otherwise
  const ShardFn floor = [](int64_t numel, int r, int n) {
    const int64_t size = numel / n;
    return nn::ShardRange{r * size, r * size + size, size};
  };
  EXPECT_EQ(layout_problems(floor, 12, 4), "") << "divisible: the fault is invisible";
  EXPECT_NE(layout_problems(floor, 10, 4), "") << "10 over 4 must be caught";
  EXPECT_NE(layout_problems(floor, 65537, 8), "");
}

TEST(Step1_PlantedFault, LastShardTakingTheRemainderIsCaught) {
  // no padding, the last shard bigger: the chunks of an all_gather would differ in size
  const ShardFn remainder = [](int64_t numel, int r, int n) {
    const int64_t size = numel / n, lo = r * size, hi = r == n - 1 ? numel : lo + size;
    return nn::ShardRange{lo, hi, hi - lo};
  };
  EXPECT_EQ(layout_problems(remainder, 12, 4), "");
  EXPECT_NE(layout_problems(remainder, 10, 4), "");
}
