// The process grid: the index math (rank <-> coordinate, group members) and the communicators.
// See process_grid.hpp for the layouts and why tp goes innermost.
#include "common/comm/process_grid.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/errors.hpp"

namespace scalelab::comm {

GridOrder parse_grid_order(const std::string& name) {
  if (name == "megatron") return GridOrder::megatron;
  if (name == "picotron") return GridOrder::picotron;
  throw UsageError(fmt::format("unknown process grid order '{}': use megatron or picotron", name));
}

const char* grid_order_name(GridOrder order) {
  switch (order) {
    case GridOrder::megatron: return "megatron";
    case GridOrder::picotron: return "picotron";
  }
  return "?";
}

void check_grid(const GridShape& s, int world_size) {
  SCALELAB_REQUIRE(s.dp >= 1 && s.tp >= 1 && s.pp >= 1,
                   "process grid: dp, tp and pp must be at least 1, got dp {} x tp {} x pp {} "
                   "(world of {} ranks)",
                   s.dp, s.tp, s.pp, world_size);
  SCALELAB_REQUIRE(s.dp * s.tp * s.pp == world_size,
                   "process grid: dp {} x tp {} x pp {} = {} ranks, but the world has {} ranks "
                   "(dp*tp*pp must equal the world size)",
                   s.dp, s.tp, s.pp, s.dp * s.tp * s.pp, world_size);
}

// ---- rank <-> coordinate -------------------------------------------------------------------------

int grid_rank(const GridShape& s, const GridCoord& c) {
  SCALELAB_CHECK(c.dp >= 0 && c.dp < s.dp && c.tp >= 0 && c.tp < s.tp && c.pp >= 0 && c.pp < s.pp,
                 "grid_rank: coordinate (dp {}, tp {}, pp {}) is outside the grid dp {} x tp {} x "
                 "pp {}",
                 c.dp, c.tp, c.pp, s.dp, s.tp, s.pp);
  switch (s.order) {
    case GridOrder::megatron:  // pp outermost, then dp, tp innermost
      return c.pp * (s.dp * s.tp) + c.dp * s.tp + c.tp;
    case GridOrder::picotron:  // dp outermost, then pp, tp innermost
      return c.dp * (s.pp * s.tp) + c.pp * s.tp + c.tp;
  }
  return -1;
}

GridCoord grid_coord(const GridShape& s, int rank) {
  SCALELAB_CHECK(rank >= 0 && rank < s.world_size(), "grid_coord: rank {} is outside a grid of {} ranks",
                 rank, s.world_size());
  GridCoord c;
  c.tp = rank % s.tp;  // innermost in both orders
  switch (s.order) {
    case GridOrder::megatron:
      c.dp = (rank / s.tp) % s.dp;
      c.pp = rank / (s.tp * s.dp);
      break;
    case GridOrder::picotron:
      c.pp = (rank / s.tp) % s.pp;
      c.dp = rank / (s.tp * s.pp);
      break;
  }
  return c;
}

// ---- group members -------------------------------------------------------------------------------

// Each group: fix `rank`'s coordinate on every axis but one and walk that axis.
std::vector<int> tp_group_ranks(const GridShape& s, int rank) {
  GridCoord c = grid_coord(s, rank);
  std::vector<int> members;
  for (int t = 0; t < s.tp; ++t) members.push_back(grid_rank(s, {c.dp, t, c.pp}));
  return members;
}

std::vector<int> dp_group_ranks(const GridShape& s, int rank) {
  GridCoord c = grid_coord(s, rank);
  std::vector<int> members;
  for (int d = 0; d < s.dp; ++d) members.push_back(grid_rank(s, {d, c.tp, c.pp}));
  return members;
}

std::vector<int> pp_group_ranks(const GridShape& s, int rank) {
  GridCoord c = grid_coord(s, rank);
  std::vector<int> members;
  for (int p = 0; p < s.pp; ++p) members.push_back(grid_rank(s, {c.dp, c.tp, p}));
  return members;
}

// Fix pp; walk dp (outer) and tp (inner): group rank = dp*tp_size + tp.
std::vector<int> tp_dp_group_ranks(const GridShape& s, int rank) {
  GridCoord c = grid_coord(s, rank);
  std::vector<int> members;
  for (int d = 0; d < s.dp; ++d)
    for (int t = 0; t < s.tp; ++t) members.push_back(grid_rank(s, {d, t, c.pp}));
  return members;
}

namespace {

using MembersFn = std::vector<int> (*)(const GridShape&, int);

int lowest(const std::vector<int>& members) {
  return *std::min_element(members.begin(), members.end());
}

// How many groups of this kind have a lower lowest member than `rank`'s group. A group is
// counted at its lowest member q (the rank q for which q == lowest(members(q))).
int group_index(const GridShape& s, int rank, MembersFn members) {
  const int mine = lowest(members(s, rank));
  int index = 0;
  for (int q = 0; q < mine; ++q)
    if (lowest(members(s, q)) == q) ++index;
  return index;
}

}  // namespace

int tp_group_index(const GridShape& s, int rank) { return group_index(s, rank, tp_group_ranks); }
int dp_group_index(const GridShape& s, int rank) { return group_index(s, rank, dp_group_ranks); }
int pp_group_index(const GridShape& s, int rank) { return group_index(s, rank, pp_group_ranks); }
int tp_dp_group_index(const GridShape& s, int rank) {
  return group_index(s, rank, tp_dp_group_ranks);
}

// ---- the table -----------------------------------------------------------------------------------

namespace {

// "tp1 [2 3]"
std::string group_cell(const std::string& prefix, int index, const std::vector<int>& members) {
  return fmt::format("{}{} [{}]", prefix, index, fmt::join(members, " "));
}

}  // namespace

std::string grid_table(const GridShape& s) {
  check_grid(s, s.world_size());
  const std::string formula =
      s.order == GridOrder::megatron
          ? fmt::format("rank = pp*{} + dp*{} + tp", s.dp * s.tp, s.tp)
          : fmt::format("rank = dp*{} + pp*{} + tp", s.pp * s.tp, s.tp);
  std::string out = fmt::format("process grid: dp {} x tp {} x pp {} = {} ranks, order {} ({})\n",
                                s.dp, s.tp, s.pp, s.world_size(), grid_order_name(s.order),
                                formula);

  // Cells first, then pad each group column to its widest cell.
  std::vector<std::vector<std::string>> groups(s.world_size());
  std::vector<std::size_t> width = {std::string("tp group").size(), std::string("dp group").size(),
                                    std::string("pp group").size(),
                                    std::string("tp x dp group").size()};
  for (int r = 0; r < s.world_size(); ++r) {
    groups[r] = {group_cell("tp", tp_group_index(s, r), tp_group_ranks(s, r)),
                 group_cell("dp", dp_group_index(s, r), dp_group_ranks(s, r)),
                 group_cell("pp", pp_group_index(s, r), pp_group_ranks(s, r)),
                 group_cell("tpdp", tp_dp_group_index(s, r), tp_dp_group_ranks(s, r))};
    for (int k = 0; k < 4; ++k) width[k] = std::max(width[k], groups[r][k].size());
  }
  out += fmt::format("rank  dp  tp  pp  {:<{}}  {:<{}}  {:<{}}  {}\n", "tp group", width[0],
                     "dp group", width[1], "pp group", width[2], "tp x dp group");
  for (int r = 0; r < s.world_size(); ++r) {
    GridCoord c = grid_coord(s, r);
    out += fmt::format("{:>4}  {:>2}  {:>2}  {:>2}  {:<{}}  {:<{}}  {:<{}}  {}\n", r, c.dp, c.tp,
                       c.pp, groups[r][0], width[0], groups[r][1], width[1], groups[r][2],
                       width[2], groups[r][3]);
  }
  return out;
}

// ---- the communicators ---------------------------------------------------------------------------

ProcessGrid::ProcessGrid(const Communicator& world, int dp, int tp, int pp, GridOrder order)
    : shape_{dp, tp, pp, order}, world_(world) {
  SCALELAB_CHECK(world.valid(), "ProcessGrid: the world communicator is empty");
  check_grid(shape_, world.size());
  rank_ = world.rank();
  coord_ = grid_coord(shape_, rank_);

  // Every rank splits the world four times, in the same order (split is collective). The color
  // picks the group, the key orders its members so that the group rank is the index on the
  // group's axis.
  const int i_tp = tp_group_index(shape_, rank_), i_dp = dp_group_index(shape_, rank_);
  const int i_pp = pp_group_index(shape_, rank_), i_tpdp = tp_dp_group_index(shape_, rank_);
  tp_ = world.split(i_tp, coord_.tp, fmt::format("tp{}", i_tp));
  dp_ = world.split(i_dp, coord_.dp, fmt::format("dp{}", i_dp));
  pp_ = world.split(i_pp, coord_.pp, fmt::format("pp{}", i_pp));
  tp_dp_ = world.split(i_tpdp, coord_.dp * tp + coord_.tp, fmt::format("tpdp{}", i_tpdp));
}

}  // namespace scalelab::comm
