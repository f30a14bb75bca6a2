// The process grid: the index math (rank <-> coordinate, group members) and the communicators.
// See process_grid.hpp for the layouts and why tp goes innermost.
#include "common/comm/process_grid.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/errors.hpp"

namespace scalelab::comm {

GridOrder parse_grid_order(const std::string& name) {
  if (name == "megatron" || name == grid_axes_string(GridOrder::megatron)) return GridOrder::megatron;
  if (name == "picotron" || name == grid_axes_string(GridOrder::picotron)) return GridOrder::picotron;
  throw UsageError(fmt::format("unknown process grid order '{}': use megatron or picotron", name));
}

const char* grid_order_name(GridOrder order) {
  switch (order) {
    case GridOrder::megatron: return "megatron";
    case GridOrder::picotron: return "picotron";
  }
  return "?";
}

const char* grid_axis_name(GridAxis axis) {
  switch (axis) {
    case GridAxis::tp: return "tp";
    case GridAxis::cp: return "cp";
    case GridAxis::dp: return "dp";
    case GridAxis::pp: return "pp";
  }
  return "?";
}

// Inside out. tp innermost in both (its all-reduces are on the critical path: NVLink), cp next
// (a ring step per attention layer); they differ in whether dp or pp is outermost.
std::array<GridAxis, 4> grid_axes(GridOrder order) {
  switch (order) {
    case GridOrder::megatron: return {GridAxis::tp, GridAxis::cp, GridAxis::dp, GridAxis::pp};
    case GridOrder::picotron: return {GridAxis::tp, GridAxis::cp, GridAxis::pp, GridAxis::dp};
  }
  return {};
}

std::string grid_axes_string(GridOrder order) {
  std::string out;
  for (GridAxis a : grid_axes(order)) {
    if (!out.empty()) out += '-';
    out += grid_axis_name(a);
  }
  return out;
}

namespace {

// The field of a coordinate or of a shape on axis `a` (both hold dp, tp, pp and cp).
template <class Grid>
auto& on_axis(Grid& g, GridAxis a) {
  switch (a) {
    case GridAxis::tp: return g.tp;
    case GridAxis::cp: return g.cp;
    case GridAxis::dp: return g.dp;
    case GridAxis::pp: break;
  }
  return g.pp;
}

}  // namespace

int GridCoord::at(GridAxis a) const { return on_axis(*this, a); }
void GridCoord::set(GridAxis a, int index) { on_axis(*this, a) = index; }
int GridShape::size(GridAxis a) const { return on_axis(*this, a); }

namespace {

// "dp 2 x tp 2 x pp 2", and " x cp 2" only for a context-parallel grid, so the 3D grids of
// labs 07-10 read as they always did.
std::string sizes_text(const GridShape& s) {
  std::string t = fmt::format("dp {} x tp {} x pp {}", s.dp, s.tp, s.pp);
  if (s.cp != 1) t += fmt::format(" x cp {}", s.cp);
  return t;
}

}  // namespace

void check_grid(const GridShape& s, int world_size) {
  const bool cp = s.cp != 1;
  SCALELAB_REQUIRE(s.dp >= 1 && s.tp >= 1 && s.pp >= 1 && s.cp >= 1,
                   "process grid: dp, tp{} and pp must be at least 1, got {} (world of {} ranks)",
                   cp ? ", cp" : "", sizes_text(s), world_size);
  SCALELAB_REQUIRE(s.world_size() == world_size,
                   "process grid: {} = {} ranks, but the world has {} ranks ({} must equal the "
                   "world size)",
                   sizes_text(s), s.world_size(), world_size, cp ? "dp*tp*pp*cp" : "dp*tp*pp");
}

// ---- rank <-> coordinate: one mixed-radix number, the order's first axis its lowest digit ----

int grid_rank(const GridShape& s, const GridCoord& c) {
  int rank = 0, stride = 1;
  for (GridAxis a : grid_axes(s.order)) {
    SCALELAB_CHECK(c.at(a) >= 0 && c.at(a) < s.size(a),
                   "grid_rank: coordinate (dp {}, tp {}, pp {}, cp {}) is outside the grid {}",
                   c.dp, c.tp, c.pp, c.cp, sizes_text(s));
    rank += c.at(a) * stride;
    stride *= s.size(a);
  }
  return rank;
}

GridCoord grid_coord(const GridShape& s, int rank) {
  SCALELAB_CHECK(rank >= 0 && rank < s.world_size(), "grid_coord: rank {} is outside a grid of {} ranks",
                 rank, s.world_size());
  GridCoord c;
  for (GridAxis a : grid_axes(s.order)) {
    c.set(a, rank % s.size(a));
    rank /= s.size(a);
  }
  return c;
}

// ---- group members -------------------------------------------------------------------------------

// Fix `rank`'s coordinate on every axis not in `axes` and walk those, the first outermost, so a
// member's position in the list is its group rank.
std::vector<int> group_ranks(const GridShape& s, int rank, const std::vector<GridAxis>& axes) {
  const GridCoord mine = grid_coord(s, rank);
  std::vector<int> members = {grid_rank(s, mine)};
  for (GridAxis a : axes) {  // each axis multiplies the list by its size, as the inner digit
    std::vector<int> next;
    for (int m : members)
      for (int i = 0; i < s.size(a); ++i) {
        GridCoord c = grid_coord(s, m);
        c.set(a, i);
        next.push_back(grid_rank(s, c));
      }
    members = std::move(next);
  }
  return members;
}

std::vector<int> tp_group_ranks(const GridShape& s, int rank) {
  return group_ranks(s, rank, {GridAxis::tp});
}
std::vector<int> dp_group_ranks(const GridShape& s, int rank) {
  return group_ranks(s, rank, {GridAxis::dp});
}
std::vector<int> pp_group_ranks(const GridShape& s, int rank) {
  return group_ranks(s, rank, {GridAxis::pp});
}
std::vector<int> cp_group_ranks(const GridShape& s, int rank) {
  return group_ranks(s, rank, {GridAxis::cp});
}
// Group rank = dp*tp_size + tp.
std::vector<int> tp_dp_group_ranks(const GridShape& s, int rank) {
  return group_ranks(s, rank, {GridAxis::dp, GridAxis::tp});
}
// Group rank = dp*cp_size + cp.
std::vector<int> dp_cp_group_ranks(const GridShape& s, int rank) {
  return group_ranks(s, rank, {GridAxis::dp, GridAxis::cp});
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
int cp_group_index(const GridShape& s, int rank) { return group_index(s, rank, cp_group_ranks); }
int dp_cp_group_index(const GridShape& s, int rank) {
  return group_index(s, rank, dp_cp_group_ranks);
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
  const bool with_cp = s.cp != 1;
  // The mixed-radix formula, outermost axis first: "rank = pp*4 + dp*2 + tp".
  std::string formula;
  int stride = s.world_size();
  const auto axes = grid_axes(s.order);
  for (auto it = axes.rbegin(); it != axes.rend(); ++it) {
    stride /= s.size(*it);
    if (*it == GridAxis::cp && !with_cp) continue;
    formula += formula.empty() ? "rank = " : " + ";
    formula += stride == 1 && *it == axes.front() ? std::string(grid_axis_name(*it))
                                                  : fmt::format("{}*{}", grid_axis_name(*it), stride);
  }
  std::string out = fmt::format("process grid: {} = {} ranks, order {} ({})\n", sizes_text(s),
                                s.world_size(), grid_order_name(s.order), formula);

  // Cells first, then pad each group column to its widest cell.
  std::vector<std::string> titles = {"tp group", "dp group", "pp group", "tp x dp group"};
  if (with_cp) titles.insert(titles.end(), {"cp group", "dp x cp group"});
  std::vector<std::vector<std::string>> groups(s.world_size());
  std::vector<std::size_t> width;
  for (const std::string& t : titles) width.push_back(t.size());
  for (int r = 0; r < s.world_size(); ++r) {
    groups[r] = {group_cell("tp", tp_group_index(s, r), tp_group_ranks(s, r)),
                 group_cell("dp", dp_group_index(s, r), dp_group_ranks(s, r)),
                 group_cell("pp", pp_group_index(s, r), pp_group_ranks(s, r)),
                 group_cell("tpdp", tp_dp_group_index(s, r), tp_dp_group_ranks(s, r))};
    if (with_cp) {
      groups[r].push_back(group_cell("cp", cp_group_index(s, r), cp_group_ranks(s, r)));
      groups[r].push_back(group_cell("dpcp", dp_cp_group_index(s, r), dp_cp_group_ranks(s, r)));
    }
    for (std::size_t k = 0; k < titles.size(); ++k) width[k] = std::max(width[k], groups[r][k].size());
  }
  // The last column is not padded (no trailing blanks).
  auto row = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (std::size_t k = 0; k < cells.size(); ++k)
      line += k + 1 == cells.size() ? cells[k] : fmt::format("{:<{}}  ", cells[k], width[k]);
    return line;
  };
  out += fmt::format("rank  dp  tp  pp  {}{}\n", with_cp ? "cp  " : "", row(titles));
  for (int r = 0; r < s.world_size(); ++r) {
    GridCoord c = grid_coord(s, r);
    out += fmt::format("{:>4}  {:>2}  {:>2}  {:>2}  {}{}\n", r, c.dp, c.tp, c.pp,
                       with_cp ? fmt::format("{:>2}  ", c.cp) : "", row(groups[r]));
  }
  return out;
}

// ---- the communicators ---------------------------------------------------------------------------

ProcessGrid::ProcessGrid(const Communicator& world, int dp, int tp, int pp, GridOrder order,
                         int cp)
    : shape_{dp, tp, pp, order, cp}, world_(world) {
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
  if (cp == 1) {  // no context parallelism: each rank is its own cp group, dp x cp is dp
    cp_ = world.split(rank_, 0, fmt::format("cp{}", rank_));
    dp_cp_ = dp_;
    return;
  }
  const int i_cp = cp_group_index(shape_, rank_), i_dpcp = dp_cp_group_index(shape_, rank_);
  cp_ = world.split(i_cp, coord_.cp, fmt::format("cp{}", i_cp));
  dp_cp_ = world.split(i_dpcp, coord_.dp * cp + coord_.cp, fmt::format("dpcp{}", i_dpcp));
}

}  // namespace scalelab::comm
