#pragma once
/// @file process_grid.hpp
/// The process grid of labs 07-11: every rank of the world gets a coordinate (dp, tp, pp, cp) and
/// a communicator for each of its groups. It is one mixed-radix numbering over an order of named
/// axes, read from the inside out: "tp-cp-dp-pp" (Megatron) means tp varies fastest between
/// neighbouring ranks, then cp, dp, and pp slowest. A fourth axis (cp, context parallel: lab 11)
/// is one more letter of the order; with cp = 1 everything below is the 3D grid of labs 07-10.
///
///   auto world = comm::Communicator::world("auto");
///   comm::ProcessGrid grid(world, /*dp=*/2, /*tp=*/2, /*pp=*/2);   // 8 ranks, Megatron order
///   if (world.rank() == 0) fmt::print("{}", grid.table());
///   grid.tp().all_reduce(partial_sums);          // the 2 ranks that share one layer's shards
///   grid.dp().all_reduce(grads, ReduceOp::avg);  // the 2 replicas of this (tp, pp) shard
///   if (!grid.is_last_stage()) grid.pp().send(activations, grid.next_stage_rank());
///
/// A group is the set of ranks whose coordinates agree on every axis but one:
///   tp group   same dp and pp, tp = 0 .. tp-1   (one layer split over tp ranks)
///   dp group   same tp and pp, dp = 0 .. dp-1   (replicas of the same shard: gradient all-reduce)
///   pp group   same dp and tp, pp = 0 .. pp-1   (the stages of one pipeline: send/recv)
///   tp x dp    same pp: the dp*tp ranks that hold one pipeline stage (ZeRO shards over them; the
///              tied embedding's gradient is summed over them)
/// Inside a group, a rank's group rank is its index on the varying axis: tp().rank() == tp_rank(),
/// dp().rank() == dp_rank(), pp().rank() == pp_rank(), tp_dp().rank() == dp_rank()*tp + tp_rank().
///
/// Layout: which world rank gets which coordinate (the `order`, its axes from the inside out).
///   megatron  tp-cp-dp-pp   tp innermost (the ranks of a tp group are consecutive), pp outermost
///   picotron  tp-cp-pp-dp   tp innermost, dp outermost
/// Counting world ranks up, the innermost axis's index changes fastest; an axis's index moves on
/// once every axis inside it has gone round. grid_rank / grid_coord compute it, grid_table prints
/// it (lab 10's step 1 writes the same layout: its README shows a grid drawn out).
/// Why tp goes innermost: ranks r and r+1 are (almost always) on the same node, where GPUs talk
/// over NVLink (hundreds of GB/s) instead of the network (tens of GB/s). Tensor parallelism talks
/// the most: an all-reduce of B*T*C activations twice per block in forward and again in backward,
/// on the critical path. So its groups get the fastest links; a tp group must not span nodes.
/// Megatron-LM puts dp next (one gradient all-reduce per step, overlapped with backward) and pp
/// outermost (only point-to-point activations between neighbouring stages, the least traffic, so
/// it may cross the slowest links). picotron (huggingface/picotron, process_group_manager.py) views
/// torch.arange(world) as a (dp, pp, cp, tp) tensor (cp = context parallel): tp is still
/// innermost, cp next (its ring of K/V blocks talks every attention layer), but pp comes before
/// dp, so one pipeline's stages are close together and dp replicas are far apart. Both are correct; they differ only in which traffic crosses the slower links.
///
/// The index math is in free functions (grid_rank, grid_coord, *_group_ranks, grid_table) that
/// need no communicator, so tests can check the tables of 8 or 16 ranks on one process.
#include <array>
#include <string>
#include <vector>

#include "common/comm/communicator.hpp"

namespace scalelab::comm {

/// The layout: which world rank gets which coordinate (see the top of this file).
enum class GridOrder { megatron, picotron };

/// "megatron" or "picotron" (the --grid-order option), or their axis orders written out
/// ("tp-cp-dp-pp", "tp-cp-pp-dp"). Anything else throws UsageError.
GridOrder parse_grid_order(const std::string& name);
/// "megatron" or "picotron".
const char* grid_order_name(GridOrder order);

/// The named axes of the grid.
enum class GridAxis { tp, cp, dp, pp };
/// "tp", "cp", "dp" or "pp".
const char* grid_axis_name(GridAxis axis);
/// The axes of `order` from the innermost (neighbouring ranks) to the outermost.
std::array<GridAxis, 4> grid_axes(GridOrder order);
/// The same as a string: "tp-cp-dp-pp" (megatron), "tp-cp-pp-dp" (picotron).
std::string grid_axes_string(GridOrder order);

/// One rank's position in the grid: its index on each axis.
struct GridCoord {
  int dp = 0;  ///< which replica
  int tp = 0;  ///< which slice of every layer of its stage
  int pp = 0;  ///< which pipeline stage
  int cp = 0;  ///< which pair of zig-zag chunks of each sequence (context parallel)
  /// The index on axis `a`.
  int at(GridAxis a) const;
  /// Sets the index on axis `a`.
  void set(GridAxis a, int index);
  /// Equal on every axis.
  bool operator==(const GridCoord&) const = default;
};

/// The sizes of the axes and the layout (cp last, so {dp, tp, pp, order} is a 3D grid).
struct GridShape {
  int dp = 1;  ///< replicas (data parallel)
  int tp = 1;  ///< ranks sharing each layer (tensor parallel)
  int pp = 1;  ///< pipeline stages
  GridOrder order = GridOrder::megatron;  ///< the layout
  int cp = 1;  ///< ranks sharing each sequence (context parallel)
  /// The size of axis `a`.
  int size(GridAxis a) const;
  /// The ranks the grid needs: dp x tp x pp x cp.
  int world_size() const { return dp * tp * pp * cp; }
};

// ---- pure index math (no communicator) ---------------------------------------------------------

/// Throws UsageError (exit 2) when a size is < 1 or dp*tp*pp*cp != world_size, with one line
/// that names the sizes and the world size.
void check_grid(const GridShape& shape, int world_size);

/// The world rank at coordinate `c` (see the layout formulas above).
int grid_rank(const GridShape& shape, const GridCoord& c);
/// The coordinate of world rank `rank` (the inverse of grid_rank).
GridCoord grid_coord(const GridShape& shape, int rank);

/// The world ranks of `rank`'s groups, in group-rank order (see the top of this file).
std::vector<int> tp_group_ranks(const GridShape& shape, int rank);
/// The world ranks of `rank`'s dp group (the replicas of its shard), in dp order.
std::vector<int> dp_group_ranks(const GridShape& shape, int rank);
/// The world ranks of `rank`'s pp group (the stages of its pipeline), in stage order.
std::vector<int> pp_group_ranks(const GridShape& shape, int rank);
/// The world ranks holding `rank`'s pipeline stage (its tp x dp group), in group-rank order.
std::vector<int> tp_dp_group_ranks(const GridShape& shape, int rank);
/// Context parallel: the cp ranks that hold one sequence's zig-zag chunks (lab 11).
std::vector<int> cp_group_ranks(const GridShape& shape, int rank);
/// The dp x cp ranks whose replicated weights see different tokens (group rank dp*cp + cp): the
/// gradients of a context-parallel model are averaged over them, not over dp alone.
std::vector<int> dp_cp_group_ranks(const GridShape& shape, int rank);
/// The members of `rank`'s group along `axes` (the others fixed), the first axis outermost:
/// {dp, tp} is tp_dp_group_ranks. The functions above are this for one or two axes.
std::vector<int> group_ranks(const GridShape& shape, int rank, const std::vector<GridAxis>& axes);

/// The number of `rank`'s group among the groups of its kind, counted in the order of their
/// lowest world rank: tp group 0 holds rank 0, tp group 1 the lowest rank not in tp group 0, ...
/// It is the split color and the number in the group's name ("tp1", "dp0", "pp3", "tpdp0").
int tp_group_index(const GridShape& shape, int rank);
/// The number of `rank`'s dp group (as tp_group_index).
int dp_group_index(const GridShape& shape, int rank);
/// The number of `rank`'s pp group (as tp_group_index).
int pp_group_index(const GridShape& shape, int rank);
/// The number of `rank`'s tp x dp group (as tp_group_index).
int tp_dp_group_index(const GridShape& shape, int rank);
/// The number of `rank`'s cp group ("cp<i>"), counted as the others.
int cp_group_index(const GridShape& shape, int rank);
/// The number of `rank`'s dp x cp group ("dpcp<i>"), counted as the others.
int dp_cp_group_index(const GridShape& shape, int rank);

/// The group table: a title line, a header, then one line per world rank with its coordinates
/// and the name and members (world ranks, in group order) of its tp, dp, pp and tp x dp groups
/// (and with cp > 1 its cp index, cp and dp x cp groups):
///   process grid: dp 2 x tp 2 x pp 2 = 8 ranks, order megatron (rank = pp*4 + dp*2 + tp)
///   rank  dp  tp  pp  tp group     dp group     pp group     tp x dp group
///      0   0   0   0  tp0 [0 1]    dp0 [0 2]    pp0 [0 4]    tpdp0 [0 1 2 3]
std::string grid_table(const GridShape& shape);

// ---- the grid of a running job -----------------------------------------------------------------

/// The grid of a running job: this rank's coordinate and a communicator for each of its groups,
/// made once (collectively) and then handed to the model and the step.
class ProcessGrid {
 public:
  ProcessGrid() = default;  ///< not usable
  /// Lays the ranks of `world` out as dp x tp x pp (x cp) and splits it into its kinds of group
  /// (collective over `world`: every rank calls it with the same arguments). Throws UsageError
  /// when the sizes do not fit (check_grid). With cp = 1 the cp group is this rank alone and
  /// the dp x cp group is the dp group.
  ProcessGrid(const Communicator& world, int dp, int tp, int pp,
              GridOrder order = GridOrder::megatron, int cp = 1);
  /// The same, with the sizes and the layout of `shape`.
  explicit ProcessGrid(const Communicator& world, const GridShape& shape)
      : ProcessGrid(world, shape.dp, shape.tp, shape.pp, shape.order, shape.cp) {}

  /// The sizes and the layout.
  const GridShape& shape() const { return shape_; }
  /// Replicas.
  int dp_size() const { return shape_.dp; }
  /// Ranks per tensor-parallel group.
  int tp_size() const { return shape_.tp; }
  /// Pipeline stages.
  int pp_size() const { return shape_.pp; }
  /// Ranks per context-parallel group.
  int cp_size() const { return shape_.cp; }
  /// The layout.
  GridOrder order() const { return shape_.order; }

  /// This rank in `world`, and its coordinates.
  int rank() const { return rank_; }
  /// This rank's coordinate.
  const GridCoord& coord() const { return coord_; }
  /// Its replica: its rank in dp().
  int dp_rank() const { return coord_.dp; }
  /// Its slice: its rank in tp().
  int tp_rank() const { return coord_.tp; }
  /// Its stage: its rank in pp().
  int pp_rank() const { return coord_.pp; }
  /// Its chunks of each sequence: its rank in cp().
  int cp_rank() const { return coord_.cp; }

  /// The communicators. Names: "tp<i>", "dp<i>", "pp<i>", "tpdp<i>", "cp<i>", "dpcp<i>" (i:
  /// *_group_index), as the
  /// watchdog reports, the trace and the byte counters show them.
  /// (A Communicator is a handle: the copy returned shares the group.)
  Communicator world() const { return world_; }
  /// The ranks sharing this rank's layers: activations' all-reduces (lab 07).
  Communicator tp() const { return tp_; }
  /// The replicas of this rank's shard: the gradients' average, ZeRO's shards (labs 03, 09).
  Communicator dp() const { return dp_; }
  /// The stages of this rank's pipeline: activations and gradients between neighbours (lab 08).
  Communicator pp() const { return pp_; }
  /// The ranks holding this rank's stage.
  Communicator tp_dp() const { return tp_dp_; }
  /// The ranks sharing each sequence of this rank's rows: the ring of K/V blocks (lab 11).
  Communicator cp() const { return cp_; }
  /// The ranks whose replicated weights see different tokens: a context-parallel model's
  /// gradient average (dp() when cp = 1).
  Communicator dp_cp() const { return dp_cp_; }

  /// The rank in `world` at a coordinate.
  int world_rank_of(int dp, int tp, int pp, int cp = 0) const {
    return grid_rank(shape_, {dp, tp, pp, cp});
  }

  /// Pipeline neighbours as ranks of pp() (== their pp index), -1 past either end:
  ///   pp().send(x, next_stage_rank()) on every stage but the last.
  int prev_stage_rank() const { return is_first_stage() ? -1 : coord_.pp - 1; }
  /// The next stage's rank in pp(), -1 on the last stage.
  int next_stage_rank() const { return is_last_stage() ? -1 : coord_.pp + 1; }
  /// True on stage 0 (the embedding's).
  bool is_first_stage() const { return coord_.pp == 0; }
  /// True on the last stage (the head's).
  bool is_last_stage() const { return coord_.pp == shape_.pp - 1; }

  /// grid_table(shape()): print it on rank 0.
  std::string table() const { return grid_table(shape_); }

 private:
  GridShape shape_;
  int rank_ = 0;
  GridCoord coord_;
  Communicator world_, tp_, dp_, pp_, tp_dp_, cp_, dp_cp_;
};

}  // namespace scalelab::comm
