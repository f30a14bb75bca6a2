#pragma once
/// @file 3d_parallel.hpp
/// Lab 10 contract: 3D parallelism. The world's ranks are laid out as a grid dp x tp x pp:
///
///   tp  the ranks of one tensor-parallel group share every layer of a stage (lab 07): each holds
///       1/tp of every block's heads and MLP, two all-reduces per block forward, two backward
///   pp  the stages of one pipeline (lab 08): stage s holds blocks stage_layers(L, pp, s), sends
///       activations to s + 1 and gradients to s - 1, 1F1B over m micro-batches
///   dp  replicas of the same (tp, pp) shard (labs 03-05): each takes B/dp rows of the global
///       batch; their gradients are averaged after the last micro-batch
///
/// A rank is one cell of the grid: coordinate (dp, tp, pp). Its tp group is the ranks that differ
/// from it only in tp, and so on. Step 1 writes the layout (which world rank sits where), step 2
/// builds one rank's model, step 3 one training step. The communicators themselves come from the
/// library's comm::ProcessGrid (common/comm/process_grid.hpp), which lays ranks out the same way.
#include <memory>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/comm/process_grid.hpp"
#include "common/data/sampler.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"
#include "pipeline_parallel.hpp"  // lab 08: stages, schedules, the executor
#include "tensor_parallel.hpp"    // lab 07: the tensor-parallel block's operators

namespace scalelab::lab10 {

using comm::GridCoord;
using comm::GridOrder;
using comm::GridShape;

// ---- Step 1: the grid ---------------------------------------------------------------------------

/// Step 1a. The world rank at coordinate `c` of `shape`:
///   megatron  rank = pp*(dp*tp) + dp*tp_size + tp    tp innermost, then dp, pp outermost
///   picotron  rank = dp*(pp*tp) + pp*tp_size + tp    tp innermost, then pp, dp outermost
/// (in each, the sizes multiply the indices: megatron rank = c.pp * (shape.dp * shape.tp) +
/// c.dp * shape.tp + c.tp).
int grid_rank(const GridShape& shape, const GridCoord& c);

/// Step 1b. The coordinate of world rank `rank` (the inverse of grid_rank).
GridCoord grid_coord(const GridShape& shape, int rank);

/// The three kinds of group. A rank's group of kind `axis` is the ranks whose coordinates equal
/// its own on the two OTHER axes.
enum class Axis { tp, dp, pp };

/// Step 1c. The world ranks of `rank`'s group along `axis`, in group-rank order: element i is the
/// rank whose index on `axis` is i (so a rank's position in its tp group is its tp index).
std::vector<int> group_ranks(const GridShape& shape, int rank, Axis axis);

// ---- given: what a grid must satisfy ---------------------------------------------------------------

/// Given. scalelab::UsageError (one line, the same on every rank) unless dp*tp*pp equals
/// `world_size` (comm::check_grid), tp divides the heads, MLP width and vocabulary
/// (lab07::check_tp), pp is at most the number of layers (lab08::stage_layers), m >= 1 and the
/// global batch splits into dp * m equal micro-batches.
void check_3d(const ModelConfig& config, const GridShape& shape, int world_size,
              int64_t global_batch, int micro_batches);

/// Given. The communicators a rank's model and step use, copied out of a comm::ProcessGrid (a
/// Communicator is a handle). The model built in step 2 keeps a pointer to `tp` (lab 07's
/// operators), so a Groups must outlive the model built on it.
struct Groups {
  GridShape shape;
  GridCoord coord;
  comm::Communicator tp, dp, pp;
};
Groups groups_of(const comm::ProcessGrid& grid);

// ---- Step 2: the 3D model ---------------------------------------------------------------------------

/// Step 2. This rank's model: pipeline stage g.coord.pp of g.shape.pp (lab08::build_stage: blocks
/// stage_layers(L, pp, stage), the embedding on the first stage, ln_f and the head on the last),
/// each block holding tp rank g.coord.tp's share of g.shape.tp (nn::GPTOptions::tp_rank, tp_size:
/// the heads and MLP units of lab 07's head_shards / column_shard / row_shard) and made tensor
/// parallel over g.tp (lab07::make_tensor_parallel). The embedding, ln_f and the head are whole
/// on every tp rank (see README: what is left). `options` gives seed, dtype, device; every
/// parameter is drawn from (seed, name), so a rank holds exactly its slice of the single-device
/// model.
std::unique_ptr<nn::GPT> build_3d_model(const ModelConfig& config, Groups& g,
                                        nn::GPTOptions options = {});

// ---- Step 3: the 3D step ------------------------------------------------------------------------------

/// Step 3a. The rows of the global batch this rank trains on: the dp replicas split the rows,
/// dp rank d takes [d*B/dp, (d+1)*B/dp) (a view). Every rank of a tp group and of a pipeline
/// takes the same rows (they compute parts of the same samples).
data::Batch dp_rows(const data::Batch& global, const Groups& g);

/// Step 3b. One training step's gradients of the 3D model `model` (built by step 2 on `g`):
///  1. zero the gradients; cut dp_rows(global) into m equal micro-batches;
///  2. run lab 08's 1F1B schedule for this stage over g.pp (lab08::schedule_1f1b,
///     lab08::run_schedule): tensor parallelism happens inside the blocks;
///  3. the tied embedding: sum the gradients of the first stage's wte and the last stage's copy
///     (lab08::sync_tied_gradients) over the group that holds both: which one?
///  4. average the gradients over the replicas of this shard: which group?
/// Returns the mean loss of the GLOBAL batch (the single-device loss), the same on every rank.
/// The caller steps the optimizer. Fills `stats` (lab 08's timings) when given.
double step_3d(nn::GPT& model, Groups& g, const data::Batch& global, int micro_batches,
               lab08::ExecStats* stats = nullptr);

}  // namespace scalelab::lab10
