// The process grid (common/comm/process_grid.hpp).
// - Layout: golden tables for 8 ranks (the printed table) and 16 ranks (coordinates and members
//   of every group) in both orders, checked through the pure functions on one process. The golden
//   rows were written from picotron's definition (torch.arange(world).view(dp, pp, tp)) and
//   Megatron's (view(pp, dp, tp)), independently of this code.
// - Bad grids: a size < 1, dp*tp*pp != world, an unknown order are UsageErrors whose message
//   names the numbers (tests/common/comm.cmake also checks that a program exits 2 on them).
// - A real grid at the job's rank count (1, 2, 4): every factorisation of the world in both
//   orders; the communicators' sizes, ranks, world ranks and names match the pure functions, an
//   all-reduce over each group sums its members' world ranks, and activations go down the
//   pipeline over pp() with next_stage_rank / prev_stage_rank.
#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/comm/communicator.hpp"
#include "common/comm/process_grid.hpp"
#include "common/errors.hpp"
#include "common/runtime.hpp"

using namespace scalelab;
using comm::Communicator;
using comm::GridCoord;
using comm::GridOrder;
using comm::GridShape;
using comm::ProcessGrid;

namespace {

// ---- golden tables -------------------------------------------------------------------------------

const char* kTable8Megatron =
    "process grid: dp 2 x tp 2 x pp 2 = 8 ranks, order megatron (rank = pp*4 + dp*2 + tp)\n"
    "rank  dp  tp  pp  tp group   dp group   pp group   tp x dp group\n"
    "   0   0   0   0  tp0 [0 1]  dp0 [0 2]  pp0 [0 4]  tpdp0 [0 1 2 3]\n"
    "   1   0   1   0  tp0 [0 1]  dp1 [1 3]  pp1 [1 5]  tpdp0 [0 1 2 3]\n"
    "   2   1   0   0  tp1 [2 3]  dp0 [0 2]  pp2 [2 6]  tpdp0 [0 1 2 3]\n"
    "   3   1   1   0  tp1 [2 3]  dp1 [1 3]  pp3 [3 7]  tpdp0 [0 1 2 3]\n"
    "   4   0   0   1  tp2 [4 5]  dp2 [4 6]  pp0 [0 4]  tpdp1 [4 5 6 7]\n"
    "   5   0   1   1  tp2 [4 5]  dp3 [5 7]  pp1 [1 5]  tpdp1 [4 5 6 7]\n"
    "   6   1   0   1  tp3 [6 7]  dp2 [4 6]  pp2 [2 6]  tpdp1 [4 5 6 7]\n"
    "   7   1   1   1  tp3 [6 7]  dp3 [5 7]  pp3 [3 7]  tpdp1 [4 5 6 7]\n";

const char* kTable8Picotron =
    "process grid: dp 2 x tp 2 x pp 2 = 8 ranks, order picotron (rank = dp*4 + pp*2 + tp)\n"
    "rank  dp  tp  pp  tp group   dp group   pp group   tp x dp group\n"
    "   0   0   0   0  tp0 [0 1]  dp0 [0 4]  pp0 [0 2]  tpdp0 [0 1 4 5]\n"
    "   1   0   1   0  tp0 [0 1]  dp1 [1 5]  pp1 [1 3]  tpdp0 [0 1 4 5]\n"
    "   2   0   0   1  tp1 [2 3]  dp2 [2 6]  pp0 [0 2]  tpdp1 [2 3 6 7]\n"
    "   3   0   1   1  tp1 [2 3]  dp3 [3 7]  pp1 [1 3]  tpdp1 [2 3 6 7]\n"
    "   4   1   0   0  tp2 [4 5]  dp0 [0 4]  pp2 [4 6]  tpdp0 [0 1 4 5]\n"
    "   5   1   1   0  tp2 [4 5]  dp1 [1 5]  pp3 [5 7]  tpdp0 [0 1 4 5]\n"
    "   6   1   0   1  tp3 [6 7]  dp2 [2 6]  pp2 [4 6]  tpdp1 [2 3 6 7]\n"
    "   7   1   1   1  tp3 [6 7]  dp3 [3 7]  pp3 [5 7]  tpdp1 [2 3 6 7]\n";

struct Row {
  int rank, dp, tp, pp;
  std::vector<int> tp_group, dp_group, pp_group, tp_dp_group;
};

// dp 2 x tp 2 x pp 4 (pp differs from dp and tp, so a swapped axis shows).
const std::vector<Row> kRows16Megatron = {
    {0, 0, 0, 0, {0, 1}, {0, 2}, {0, 4, 8, 12}, {0, 1, 2, 3}},
    {1, 0, 1, 0, {0, 1}, {1, 3}, {1, 5, 9, 13}, {0, 1, 2, 3}},
    {2, 1, 0, 0, {2, 3}, {0, 2}, {2, 6, 10, 14}, {0, 1, 2, 3}},
    {3, 1, 1, 0, {2, 3}, {1, 3}, {3, 7, 11, 15}, {0, 1, 2, 3}},
    {4, 0, 0, 1, {4, 5}, {4, 6}, {0, 4, 8, 12}, {4, 5, 6, 7}},
    {5, 0, 1, 1, {4, 5}, {5, 7}, {1, 5, 9, 13}, {4, 5, 6, 7}},
    {6, 1, 0, 1, {6, 7}, {4, 6}, {2, 6, 10, 14}, {4, 5, 6, 7}},
    {7, 1, 1, 1, {6, 7}, {5, 7}, {3, 7, 11, 15}, {4, 5, 6, 7}},
    {8, 0, 0, 2, {8, 9}, {8, 10}, {0, 4, 8, 12}, {8, 9, 10, 11}},
    {9, 0, 1, 2, {8, 9}, {9, 11}, {1, 5, 9, 13}, {8, 9, 10, 11}},
    {10, 1, 0, 2, {10, 11}, {8, 10}, {2, 6, 10, 14}, {8, 9, 10, 11}},
    {11, 1, 1, 2, {10, 11}, {9, 11}, {3, 7, 11, 15}, {8, 9, 10, 11}},
    {12, 0, 0, 3, {12, 13}, {12, 14}, {0, 4, 8, 12}, {12, 13, 14, 15}},
    {13, 0, 1, 3, {12, 13}, {13, 15}, {1, 5, 9, 13}, {12, 13, 14, 15}},
    {14, 1, 0, 3, {14, 15}, {12, 14}, {2, 6, 10, 14}, {12, 13, 14, 15}},
    {15, 1, 1, 3, {14, 15}, {13, 15}, {3, 7, 11, 15}, {12, 13, 14, 15}},
};

const std::vector<Row> kRows16Picotron = {
    {0, 0, 0, 0, {0, 1}, {0, 8}, {0, 2, 4, 6}, {0, 1, 8, 9}},
    {1, 0, 1, 0, {0, 1}, {1, 9}, {1, 3, 5, 7}, {0, 1, 8, 9}},
    {2, 0, 0, 1, {2, 3}, {2, 10}, {0, 2, 4, 6}, {2, 3, 10, 11}},
    {3, 0, 1, 1, {2, 3}, {3, 11}, {1, 3, 5, 7}, {2, 3, 10, 11}},
    {4, 0, 0, 2, {4, 5}, {4, 12}, {0, 2, 4, 6}, {4, 5, 12, 13}},
    {5, 0, 1, 2, {4, 5}, {5, 13}, {1, 3, 5, 7}, {4, 5, 12, 13}},
    {6, 0, 0, 3, {6, 7}, {6, 14}, {0, 2, 4, 6}, {6, 7, 14, 15}},
    {7, 0, 1, 3, {6, 7}, {7, 15}, {1, 3, 5, 7}, {6, 7, 14, 15}},
    {8, 1, 0, 0, {8, 9}, {0, 8}, {8, 10, 12, 14}, {0, 1, 8, 9}},
    {9, 1, 1, 0, {8, 9}, {1, 9}, {9, 11, 13, 15}, {0, 1, 8, 9}},
    {10, 1, 0, 1, {10, 11}, {2, 10}, {8, 10, 12, 14}, {2, 3, 10, 11}},
    {11, 1, 1, 1, {10, 11}, {3, 11}, {9, 11, 13, 15}, {2, 3, 10, 11}},
    {12, 1, 0, 2, {12, 13}, {4, 12}, {8, 10, 12, 14}, {4, 5, 12, 13}},
    {13, 1, 1, 2, {12, 13}, {5, 13}, {9, 11, 13, 15}, {4, 5, 12, 13}},
    {14, 1, 0, 3, {14, 15}, {6, 14}, {8, 10, 12, 14}, {6, 7, 14, 15}},
    {15, 1, 1, 3, {14, 15}, {7, 15}, {9, 11, 13, 15}, {6, 7, 14, 15}},
};

void expect_rows(const GridShape& shape, const std::vector<Row>& rows) {
  ASSERT_EQ(static_cast<int>(rows.size()), shape.world_size());
  for (const Row& row : rows) {
    SCOPED_TRACE(testing::Message() << comm::grid_order_name(shape.order) << " rank " << row.rank);
    const GridCoord c = comm::grid_coord(shape, row.rank);
    EXPECT_EQ(c, (GridCoord{row.dp, row.tp, row.pp}));
    EXPECT_EQ(comm::grid_rank(shape, {row.dp, row.tp, row.pp}), row.rank);
    EXPECT_EQ(comm::tp_group_ranks(shape, row.rank), row.tp_group);
    EXPECT_EQ(comm::dp_group_ranks(shape, row.rank), row.dp_group);
    EXPECT_EQ(comm::pp_group_ranks(shape, row.rank), row.pp_group);
    EXPECT_EQ(comm::tp_dp_group_ranks(shape, row.rank), row.tp_dp_group);
  }
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

}  // namespace

// ---- the layout, on one process ------------------------------------------------------------------

TEST(GridLayout, EightRanksMegatronTable) {
  EXPECT_EQ(comm::grid_table({2, 2, 2, GridOrder::megatron}), kTable8Megatron);
}

TEST(GridLayout, EightRanksPicotronTable) {
  EXPECT_EQ(comm::grid_table({2, 2, 2, GridOrder::picotron}), kTable8Picotron);
}

TEST(GridLayout, SixteenRanksMegatron) { expect_rows({2, 2, 4, GridOrder::megatron}, kRows16Megatron); }

TEST(GridLayout, SixteenRanksPicotron) { expect_rows({2, 2, 4, GridOrder::picotron}, kRows16Picotron); }

TEST(GridLayout, SixteenRanksGroupNumbers) {
  // Groups are numbered in the order of their lowest rank.
  const GridShape pico{2, 2, 4, GridOrder::picotron};
  EXPECT_EQ(comm::tp_group_index(pico, 15), 7);
  EXPECT_EQ(comm::dp_group_index(pico, 8), 0);   // dp0 = [0 8]
  EXPECT_EQ(comm::dp_group_index(pico, 15), 7);  // dp7 = [7 15]
  EXPECT_EQ(comm::pp_group_index(pico, 9), 3);   // pp0 [0 2 4 6], pp1 [1 3 5 7], pp2 [8 ..], pp3
  EXPECT_EQ(comm::tp_dp_group_index(pico, 13), 2);  // [0 1 8 9] [2 3 10 11] [4 5 12 13]
  const GridShape mega{2, 2, 4, GridOrder::megatron};
  EXPECT_EQ(comm::dp_group_index(mega, 13), 7);  // [0 2] [1 3] [4 6] [5 7] [8 10] [9 11] [12 14] [13 15]
  EXPECT_EQ(comm::pp_group_index(mega, 14), 2);  // [0 4 8 12] [1 ..] [2 6 10 14]
  EXPECT_EQ(comm::tp_dp_group_index(mega, 9), 2);
}

TEST(GridLayout, EveryShapeRoundTripsAndGroupsPartitionTheWorld) {
  // Not golden, but over many shapes: coordinates are a bijection, each group is a partition of
  // the world into groups of the axis's size, and a rank's group rank is its index on the axis.
  for (GridOrder order : {GridOrder::megatron, GridOrder::picotron})
    for (int dp : {1, 2, 3})
      for (int tp : {1, 2, 4})
        for (int pp : {1, 3}) {
          const GridShape s{dp, tp, pp, order};
          SCOPED_TRACE(testing::Message() << comm::grid_order_name(order) << " dp " << dp
                                          << " tp " << tp << " pp " << pp);
          for (int r = 0; r < s.world_size(); ++r) {
            const GridCoord c = comm::grid_coord(s, r);
            ASSERT_EQ(comm::grid_rank(s, c), r);
            EXPECT_EQ(comm::tp_group_ranks(s, r).at(c.tp), r);
            EXPECT_EQ(comm::dp_group_ranks(s, r).at(c.dp), r);
            EXPECT_EQ(comm::pp_group_ranks(s, r).at(c.pp), r);
            EXPECT_EQ(comm::tp_dp_group_ranks(s, r).at(c.dp * tp + c.tp), r);
            EXPECT_EQ(comm::tp_group_ranks(s, r).size(), static_cast<std::size_t>(tp));
            EXPECT_EQ(comm::tp_dp_group_ranks(s, r).size(), static_cast<std::size_t>(dp * tp));
            // tp innermost in both orders: a tp group is a run of consecutive ranks.
            EXPECT_EQ(comm::tp_group_ranks(s, r).front(), r - c.tp);
          }
          // Group numbers: 0 .. (world / group size) - 1, each used by exactly one group.
          std::vector<int> seen(s.world_size(), 0);
          for (int r = 0; r < s.world_size(); ++r) ++seen.at(comm::dp_group_index(s, r));
          for (int g = 0; g < s.world_size() / dp; ++g) EXPECT_EQ(seen[g], dp) << "dp group " << g;
        }
}

// ---- four axes (context parallel, lab 11) ------------------------------------------------------------

namespace {

// The reference layout of a 4D grid, written from the frameworks' definitions rather than from
// the mixed-radix code: torch.arange(world).view(pp, dp, cp, tp) (Megatron, tp-cp-dp-pp) or
// .view(dp, pp, cp, tp) (picotron): walk the view in row-major order, numbering the cells.
std::vector<GridCoord> view_layout(const GridShape& s) {
  std::vector<GridCoord> at_rank;
  const bool mega = s.order == GridOrder::megatron;
  const int outer = mega ? s.pp : s.dp, second = mega ? s.dp : s.pp;
  for (int o = 0; o < outer; ++o)
    for (int m = 0; m < second; ++m)
      for (int c = 0; c < s.cp; ++c)
        for (int t = 0; t < s.tp; ++t)
          at_rank.push_back(mega ? GridCoord{m, t, o, c} : GridCoord{o, t, m, c});
  return at_rank;
}

}  // namespace

TEST(GridLayout, FourAxesFollowTheFrameworksViews) {
  for (GridOrder order : {GridOrder::megatron, GridOrder::picotron})
    for (const GridShape s : {GridShape{2, 2, 2, order, 2}, GridShape{3, 1, 2, order, 2},
                              GridShape{1, 2, 1, order, 4}}) {
      SCOPED_TRACE(testing::Message() << comm::grid_order_name(order) << " dp " << s.dp << " tp "
                                      << s.tp << " pp " << s.pp << " cp " << s.cp);
      const std::vector<GridCoord> want = view_layout(s);
      ASSERT_EQ(static_cast<int>(want.size()), s.world_size());
      for (int r = 0; r < s.world_size(); ++r) {
        EXPECT_EQ(comm::grid_coord(s, r), want[r]) << "rank " << r;
        EXPECT_EQ(comm::grid_rank(s, want[r]), r);
        // A group: the ranks that agree with r on every axis but the group's.
        auto members = [&](auto same) {
          std::vector<int> m;
          for (int q = 0; q < s.world_size(); ++q)
            if (same(want[q], want[r])) m.push_back(q);
          return m;
        };
        const auto cp_group = members([](GridCoord a, GridCoord b) {
          return a.dp == b.dp && a.tp == b.tp && a.pp == b.pp;
        });
        const auto dp_cp_group = members([](GridCoord a, GridCoord b) {
          return a.tp == b.tp && a.pp == b.pp;
        });
        const auto tp_dp_group = members([](GridCoord a, GridCoord b) {
          return a.cp == b.cp && a.pp == b.pp;
        });
        auto sorted = [](std::vector<int> v) { std::sort(v.begin(), v.end()); return v; };
        EXPECT_EQ(sorted(comm::cp_group_ranks(s, r)), cp_group);
        EXPECT_EQ(sorted(comm::dp_cp_group_ranks(s, r)), dp_cp_group);
        EXPECT_EQ(sorted(comm::tp_dp_group_ranks(s, r)), tp_dp_group);
        // group rank = the index on the axis (cp), dp*cp + cp (dp x cp)
        EXPECT_EQ(comm::cp_group_ranks(s, r).at(want[r].cp), r);
        EXPECT_EQ(comm::dp_cp_group_ranks(s, r).at(want[r].dp * s.cp + want[r].cp), r);
      }
    }
  EXPECT_EQ(comm::grid_axes_string(GridOrder::megatron), "tp-cp-dp-pp");
  EXPECT_EQ(comm::grid_axes_string(GridOrder::picotron), "tp-cp-pp-dp");
  EXPECT_EQ(comm::parse_grid_order("tp-cp-pp-dp"), GridOrder::picotron);
  const std::string table = comm::grid_table({2, 1, 1, GridOrder::megatron, 2});
  EXPECT_EQ(table,
            "process grid: dp 2 x tp 1 x pp 1 x cp 2 = 4 ranks, order megatron (rank = pp*4 + "
            "dp*2 + cp*1 + tp)\n"
            "rank  dp  tp  pp  cp  tp group  dp group   pp group  tp x dp group  cp group   "
            "dp x cp group\n"
            "   0   0   0   0   0  tp0 [0]   dp0 [0 2]  pp0 [0]   tpdp0 [0 2]    cp0 [0 1]  "
            "dpcp0 [0 1 2 3]\n"
            "   1   0   0   0   1  tp1 [1]   dp1 [1 3]  pp1 [1]   tpdp1 [1 3]    cp0 [0 1]  "
            "dpcp0 [0 1 2 3]\n"
            "   2   1   0   0   0  tp2 [2]   dp0 [0 2]  pp2 [2]   tpdp0 [0 2]    cp1 [2 3]  "
            "dpcp0 [0 1 2 3]\n"
            "   3   1   0   0   1  tp3 [3]   dp1 [1 3]  pp3 [3]   tpdp1 [1 3]    cp1 [2 3]  "
            "dpcp0 [0 1 2 3]\n");
}

// ---- bad grids -----------------------------------------------------------------------------------

TEST(GridErrors, SizesThatDoNotFitTheWorldAreUsageErrors) {
  EXPECT_EQ(message_of([] { comm::check_grid({2, 2, 2}, 4); }),
            "process grid: dp 2 x tp 2 x pp 2 = 8 ranks, but the world has 4 ranks (dp*tp*pp "
            "must equal the world size)");
  EXPECT_EQ(message_of([] { comm::check_grid({0, 2, 1}, 4); }),
            "process grid: dp, tp and pp must be at least 1, got dp 0 x tp 2 x pp 1 (world of 4 "
            "ranks)");
  EXPECT_THROW(comm::check_grid({1, 1, -1}, 1), UsageError);
  EXPECT_THROW(comm::check_grid({1, 1, 1}, 2), UsageError);
  EXPECT_NO_THROW(comm::check_grid({1, 3, 2}, 6));
  EXPECT_EQ(message_of([] { comm::check_grid({2, 1, 1, GridOrder::megatron, 2}, 2); }),
            "process grid: dp 2 x tp 1 x pp 1 x cp 2 = 4 ranks, but the world has 2 ranks "
            "(dp*tp*pp*cp must equal the world size)");
  EXPECT_THROW(comm::check_grid({1, 1, 1, GridOrder::megatron, 0}, 1), UsageError);
}

TEST(GridErrors, UnknownOrderIsAUsageError) {
  EXPECT_EQ(comm::parse_grid_order("megatron"), GridOrder::megatron);
  EXPECT_EQ(comm::parse_grid_order("picotron"), GridOrder::picotron);
  EXPECT_EQ(message_of([] { comm::parse_grid_order("zigzag"); }),
            "unknown process grid order 'zigzag': use megatron or picotron");
}

TEST(GridErrors, ProcessGridOnTheWrongWorldThrowsOnEveryRankBeforeAnySplit) {
  auto world = Communicator::world("mpi");
  const int n = world.size();
  // Every rank throws the same error before any collective, so no rank is left in a split.
  const std::string m = message_of([&] { ProcessGrid(world, n, 2, 1); });
  EXPECT_NE(m.find(fmt::format("dp {} x tp 2 x pp 1 = {} ranks, but the world has {} ranks", n,
                               2 * n, n)),
            std::string::npos)
      << m;
  EXPECT_THROW(ProcessGrid(world, n, 1, 0), UsageError);
  world.barrier();  // still in step
}

// ---- a real grid ---------------------------------------------------------------------------------

namespace {

double sum_of(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// All-reduces this rank's world rank over `c` and checks the sum and the group's layout.
void check_group(Communicator c, const std::vector<int>& members, int group_rank,
                 const std::string& name) {
  SCOPED_TRACE(name);
  EXPECT_EQ(c.name(), name);
  EXPECT_EQ(c.size(), static_cast<int>(members.size()));
  EXPECT_EQ(c.rank(), group_rank);
  EXPECT_EQ(c.world_ranks(), members);
  Tensor t = Tensor::from_vector({static_cast<double>(world_rank())}, {1});
  c.all_reduce(t);
  EXPECT_EQ(t.item(0), sum_of(members));
}

std::vector<GridShape> shapes_of(int world) {
  std::vector<GridShape> shapes;
  for (GridOrder order : {GridOrder::megatron, GridOrder::picotron})
    for (int dp = 1; dp <= world; ++dp)
      for (int tp = 1; tp <= world; ++tp)
        for (int pp = 1; pp <= world; ++pp)
          for (int cp = 1; cp <= world; ++cp)
            if (dp * tp * pp * cp == world) shapes.push_back({dp, tp, pp, order, cp});
  return shapes;
}

}  // namespace

TEST(ProcessGridRun, EveryFactorisationOfTheWorldInBothOrders) {
  auto world = Communicator::world("mpi");
  const int r = world.rank();
  for (const GridShape& s : shapes_of(world.size())) {
    SCOPED_TRACE(testing::Message() << comm::grid_order_name(s.order) << " dp " << s.dp << " tp "
                                    << s.tp << " pp " << s.pp << " cp " << s.cp);
    ProcessGrid grid(world, s);
    const GridCoord c = comm::grid_coord(s, r);
    EXPECT_EQ(grid.rank(), r);
    EXPECT_EQ(grid.coord(), c);
    EXPECT_EQ(grid.dp_size() * grid.tp_size() * grid.pp_size() * grid.cp_size(), world.size());
    EXPECT_EQ(grid.world_rank_of(c.dp, c.tp, c.pp, c.cp), r);
    check_group(grid.tp(), comm::tp_group_ranks(s, r), c.tp,
                fmt::format("tp{}", comm::tp_group_index(s, r)));
    check_group(grid.dp(), comm::dp_group_ranks(s, r), c.dp,
                fmt::format("dp{}", comm::dp_group_index(s, r)));
    check_group(grid.pp(), comm::pp_group_ranks(s, r), c.pp,
                fmt::format("pp{}", comm::pp_group_index(s, r)));
    check_group(grid.tp_dp(), comm::tp_dp_group_ranks(s, r), c.dp * s.tp + c.tp,
                fmt::format("tpdp{}", comm::tp_dp_group_index(s, r)));
    if (s.cp > 1) {
      check_group(grid.cp(), comm::cp_group_ranks(s, r), c.cp,
                  fmt::format("cp{}", comm::cp_group_index(s, r)));
      check_group(grid.dp_cp(), comm::dp_cp_group_ranks(s, r), c.dp * s.cp + c.cp,
                  fmt::format("dpcp{}", comm::dp_cp_group_index(s, r)));
    } else {
      EXPECT_EQ(grid.cp().size(), 1);
      EXPECT_EQ(grid.dp_cp().world_ranks(), grid.dp().world_ranks());
    }

    // The pipeline: stage k sends its world rank to stage k+1 over pp().
    EXPECT_EQ(grid.is_first_stage(), c.pp == 0);
    EXPECT_EQ(grid.is_last_stage(), c.pp == s.pp - 1);
    EXPECT_EQ(grid.prev_stage_rank(), c.pp == 0 ? -1 : c.pp - 1);
    EXPECT_EQ(grid.next_stage_rank(), c.pp == s.pp - 1 ? -1 : c.pp + 1);
    Tensor from_prev = Tensor::zeros({1});
    comm::Work w;
    if (!grid.is_first_stage()) w = grid.pp().recv_async(from_prev, grid.prev_stage_rank());
    if (!grid.is_last_stage())
      grid.pp().send(Tensor::from_vector({static_cast<double>(r)}, {1}), grid.next_stage_rank());
    w.wait();
    if (!grid.is_first_stage())
      EXPECT_EQ(from_prev.item(0), grid.world_rank_of(c.dp, c.tp, c.pp - 1, c.cp));

    EXPECT_EQ(grid.table(), comm::grid_table(s));
  }
}

TEST(ProcessGridRun, SelfBackendIsAGridOfOne) {
  auto self = Communicator::world("self");
  ProcessGrid grid(self, 1, 1, 1, comm::parse_grid_order("picotron"));
  EXPECT_EQ(grid.tp().size(), 1);
  EXPECT_EQ(grid.tp_dp().size(), 1);
  EXPECT_TRUE(grid.is_first_stage());
  EXPECT_TRUE(grid.is_last_stage());
  EXPECT_EQ(grid.next_stage_rank(), -1);
  EXPECT_THROW(ProcessGrid(self, 2, 1, 1), UsageError);
}
