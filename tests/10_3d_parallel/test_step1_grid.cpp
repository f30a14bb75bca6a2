// Step 1: the grid. Pure index math on one rank: golden tables written out for 8 ranks in both
// orders, then every grid of 8 and 16 ranks against the library's functions
// (common/comm/process_grid.hpp, the reference: the attendee's code must not call them, which
// Step1_OwnWork checks in the attendee's object file).
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "3d_parallel.hpp"
#include "tests/support/drawn.hpp"
#include "tests/support/own_work.hpp"

namespace {

using namespace scalelab;
using lab10::Axis;
using lab10::GridCoord;
using lab10::GridOrder;
using lab10::GridShape;

// One layout: what a grid implementation answers.
struct Layout {
  std::function<int(const GridShape&, const GridCoord&)> rank;
  std::function<GridCoord(const GridShape&, int)> coord;
  std::function<std::vector<int>(const GridShape&, int, Axis)> group;
};

Layout attendee() { return {lab10::grid_rank, lab10::grid_coord, lab10::group_ranks}; }

Layout library() {
  return {comm::grid_rank, comm::grid_coord, [](const GridShape& s, int r, Axis a) {
            return a == Axis::tp   ? comm::tp_group_ranks(s, r)
                   : a == Axis::dp ? comm::dp_group_ranks(s, r)
                                   : comm::pp_group_ranks(s, r);
          }};
}

std::string str(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
  return "[" + s + "]";
}

// The layout rule of an order, as the contract (3d_parallel.hpp) states it: what a failure
// names instead of the right answer.
std::string rule(const GridShape& shape) {
  return fmt::format("dp {} x tp {} x pp {} ({}: tp innermost, {})", shape.dp, shape.tp, shape.pp,
                     comm::grid_order_name(shape.order),
                     shape.order == GridOrder::megatron ? "then dp, pp outermost"
                                                        : "then pp, dp outermost");
}

// Every rank of `shape`: its coordinate, the inverse, and its three groups, against `want`. A
// failure shows what `got` answered and which part breaks the layout rule, not `want`'s answer.
testing::AssertionResult same_layout(const Layout& got, const Layout& want, const GridShape& shape) {
  for (int r = 0; r < shape.world_size(); ++r) {
    const GridCoord c = got.coord(shape, r), w = want.coord(shape, r);
    if (!(c == w)) {
      const char* axis = c.tp != w.tp ? "tp" : c.dp != w.dp ? "dp" : "pp";
      return testing::AssertionFailure()
             << fmt::format("{}: grid_coord(rank {}) gave (dp {}, tp {}, pp {}): its {} "
                            "coordinate is not where the order puts rank {}", rule(shape), r,
                            c.dp, c.tp, c.pp, axis, r);
    }
    const int back = got.rank(shape, w);
    if (back != r)
      return testing::AssertionFailure() << fmt::format(
                 "{}: grid_rank(dp {}, tp {}, pp {}) gave {}, but that is rank {}'s coordinate "
                 "(grid_rank inverts grid_coord)", rule(shape), w.dp, w.tp, w.pp, back, r);
    for (Axis a : {Axis::tp, Axis::dp, Axis::pp}) {
      const auto g = got.group(shape, r, a), wg = want.group(shape, r, a);
      const char* axis = a == Axis::tp ? "tp" : a == Axis::dp ? "dp" : "pp";
      if (g != wg)
        return testing::AssertionFailure() << fmt::format(
                   "{}: group_ranks(rank {}, {}) gave {}: not the ranks that share every "
                   "coordinate of rank {} but {}, in {} order", rule(shape), r, axis, str(g), r,
                   axis, axis);
    }
  }
  return testing::AssertionSuccess();
}

// Every (dp, tp, pp) with dp*tp*pp = n, in both orders.
std::vector<GridShape> all_grids(int n) {
  std::vector<GridShape> out;
  for (GridOrder o : {GridOrder::megatron, GridOrder::picotron})
    for (int dp = 1; dp <= n; ++dp)
      for (int tp = 1; dp * tp <= n; ++tp)
        if (n % (dp * tp) == 0) out.push_back({dp, tp, n / (dp * tp), o});
  return out;
}

// The golden tables (written out by hand from the layout formulas, not computed): 8 ranks,
// dp 2 x tp 2 x pp 2. Row r: rank r's coordinate (dp, tp, pp), then its tp, dp, pp groups.
struct Row {
  GridCoord c;
  std::vector<int> tp, dp, pp;
};
// Megatron: rank = pp*4 + dp*2 + tp.
const std::vector<Row> kMegatron8 = {
    {{0, 0, 0}, {0, 1}, {0, 2}, {0, 4}}, {{0, 1, 0}, {0, 1}, {1, 3}, {1, 5}},
    {{1, 0, 0}, {2, 3}, {0, 2}, {2, 6}}, {{1, 1, 0}, {2, 3}, {1, 3}, {3, 7}},
    {{0, 0, 1}, {4, 5}, {4, 6}, {0, 4}}, {{0, 1, 1}, {4, 5}, {5, 7}, {1, 5}},
    {{1, 0, 1}, {6, 7}, {4, 6}, {2, 6}}, {{1, 1, 1}, {6, 7}, {5, 7}, {3, 7}}};
// picotron: rank = dp*4 + pp*2 + tp.
const std::vector<Row> kPicotron8 = {
    {{0, 0, 0}, {0, 1}, {0, 4}, {0, 2}}, {{0, 1, 0}, {0, 1}, {1, 5}, {1, 3}},
    {{0, 0, 1}, {2, 3}, {2, 6}, {0, 2}}, {{0, 1, 1}, {2, 3}, {3, 7}, {1, 3}},
    {{1, 0, 0}, {4, 5}, {0, 4}, {4, 6}}, {{1, 1, 0}, {4, 5}, {1, 5}, {5, 7}},
    {{1, 0, 1}, {6, 7}, {2, 6}, {4, 6}}, {{1, 1, 1}, {6, 7}, {3, 7}, {5, 7}}};

testing::AssertionResult matches_golden(const Layout& got, const GridShape& shape,
                                        const std::vector<Row>& rows) {
  for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
    const Row& w = rows[r];
    const GridCoord c = got.coord(shape, r);
    if (!(c == w.c) || got.rank(shape, w.c) != r || got.group(shape, r, Axis::tp) != w.tp ||
        got.group(shape, r, Axis::dp) != w.dp || got.group(shape, r, Axis::pp) != w.pp)
      return testing::AssertionFailure() << fmt::format(
                 "{}, rank {}: coordinate (dp {}, tp {}, pp {}), tp group {}, dp group {}, pp "
                 "group {}: not that rank's row of the layout (lay the 8 ranks out by hand to see "
                 "which part differs)", rule(shape), r, c.dp, c.tp, c.pp,
                 str(got.group(shape, r, Axis::tp)), str(got.group(shape, r, Axis::dp)),
                 str(got.group(shape, r, Axis::pp)));
  }
  return testing::AssertionSuccess();
}

TEST(Step1_Grid, MegatronGoldenTable8) {
  EXPECT_TRUE(matches_golden(attendee(), {2, 2, 2, GridOrder::megatron}, kMegatron8));
}

TEST(Step1_Grid, PicotronGoldenTable8) {
  EXPECT_TRUE(matches_golden(attendee(), {2, 2, 2, GridOrder::picotron}, kPicotron8));
}

// The golden tables are what the library computes too (so the next test's reference is right).
TEST(Step1_Grid, LibraryAgreesWithGoldenTables) {
  EXPECT_TRUE(matches_golden(library(), {2, 2, 2, GridOrder::megatron}, kMegatron8));
  EXPECT_TRUE(matches_golden(library(), {2, 2, 2, GridOrder::picotron}, kPicotron8));
}

// Grids drawn at grading time (each axis 1-7, a seed from std::random_device printed with a
// failure): a table of the grids above passes none of them.
TEST(Step1_Grid, GridsDrawnAtGradingTimeMatchTheLibrary) {
  labtest::Drawn draw;
  SCOPED_TRACE("grids " + draw.trace());
  for (int i = 0; i < 24; ++i) {
    const GridShape s{draw.in(1, 7), draw.in(1, 7), draw.in(1, 7),
                      draw.in(0, 1) ? GridOrder::megatron : GridOrder::picotron};
    EXPECT_TRUE(same_layout(attendee(), library(), s));
  }
}

// 6 and 12 ranks: grids with tp 3 and dp or pp 3, where a layout that assumes powers of two
// (shifts, masks, a square grid) breaks.
TEST(Step1_Grid, EveryGridOf6And8And12And16RanksMatchesTheLibrary) {
  for (int n : {6, 8, 12, 16})
    for (const GridShape& s : all_grids(n)) EXPECT_TRUE(same_layout(attendee(), library(), s));
}

// The README: "write your own; the library's are the reference the graders use". The object
// compiled from 3d_parallel.cpp must not call the library's grid index math (its undefined
// symbols, tests/support/own_work.hpp): forwarding to comm::grid_coord gives every table right
// and is caught here. lab10.planted.step1_calls_the_library (lab.cmake) grades such a file.
TEST(Step1_OwnWork, TheGridIsYourOwnNotTheLibrarys) {
  EXPECT_TRUE(labtest::calls_none_of(
      {"scalelab::comm::grid_rank(", "scalelab::comm::grid_coord(", "scalelab::comm::grid_table(",
       "scalelab::comm::tp_group_ranks(", "scalelab::comm::dp_group_ranks(",
       "scalelab::comm::pp_group_ranks(", "scalelab::comm::tp_dp_group_ranks(",
       "scalelab::comm::cp_group_ranks(", "scalelab::comm::dp_cp_group_ranks(",
       "scalelab::comm::ProcessGrid::"},
      "step 1 asks for your own grid_rank, grid_coord and group_ranks"));
}

// tp innermost in both orders: a tp group is tp consecutive world ranks (one node's GPUs).
TEST(Step1_Grid, TpGroupsAreConsecutiveRanks) {
  for (int n : {12, 16})
    for (const GridShape& s : all_grids(n))
      for (int r = 0; r < s.world_size(); ++r) {
        const auto g = lab10::group_ranks(s, r, Axis::tp);
        ASSERT_EQ(static_cast<int>(g.size()), s.tp);
        for (int i = 0; i < s.tp; ++i) EXPECT_EQ(g[i], r / s.tp * s.tp + i) << "rank " << r;
      }
}

// ---- planted fault: tp and dp swapped (dp innermost: the tp groups span the slow links) ----------

int swapped_rank(const GridShape& s, const GridCoord& c) {
  return s.order == GridOrder::megatron ? (c.pp * s.tp + c.tp) * s.dp + c.dp
                                        : (c.tp * s.pp + c.pp) * s.dp + c.dp;
}
GridCoord swapped_coord(const GridShape& s, int r) {
  GridCoord c;
  c.dp = r % s.dp;
  const int rest = r / s.dp;
  if (s.order == GridOrder::megatron) {
    c.tp = rest % s.tp;
    c.pp = rest / s.tp;
  } else {
    c.pp = rest % s.pp;
    c.tp = rest / s.pp;
  }
  return c;
}
std::vector<int> swapped_group(const GridShape& s, int r, Axis a) {
  std::vector<int> out;
  const GridCoord me = swapped_coord(s, r);
  const int n = a == Axis::tp ? s.tp : a == Axis::dp ? s.dp : s.pp;
  for (int i = 0; i < n; ++i) {
    GridCoord c = me;
    (a == Axis::tp ? c.tp : a == Axis::dp ? c.dp : c.pp) = i;
    out.push_back(swapped_rank(s, c));
  }
  return out;
}

TEST(Step1_PlantedFault, TpAndDpSwappedFailsTheChecks) {
  const Layout wrong{swapped_rank, swapped_coord, swapped_group};
  EXPECT_FALSE(matches_golden(wrong, {2, 2, 2, GridOrder::megatron}, kMegatron8));
  EXPECT_FALSE(matches_golden(wrong, {2, 2, 2, GridOrder::picotron}, kPicotron8));
  EXPECT_FALSE(same_layout(wrong, library(), {2, 2, 4, GridOrder::megatron}));
  EXPECT_FALSE(same_layout(wrong, library(), {4, 2, 2, GridOrder::picotron}));
}

}  // namespace
