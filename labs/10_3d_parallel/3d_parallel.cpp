// Starter generated from solutions/10_3d_parallel/3d_parallel.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 1ef64a0359177fce (lets make-labs see your edits).
// Lab 10: 3D parallelism (see 3d_parallel.hpp for the contract, README.md for the steps).
#include "3d_parallel.hpp"

#include "common/errors.hpp"

namespace scalelab::lab10 {

// ---- Step 1 -------------------------------------------------------------------------------------

int grid_rank(const GridShape& shape, const GridCoord& c) {
  int rank = 0;
  // TODO step 1: the world rank of a coordinate, tp innermost in both orders
  // HINT: like a number written in mixed radix: the innermost axis is the last digit.
  throw scalelab::NotImplemented(
      "lab 10 step 1: the world rank of a coordinate, tp innermost in both orders (README.md#step-1)");
  return rank;
}

GridCoord grid_coord(const GridShape& shape, int rank) {
  GridCoord c;
  // TODO step 1: peel the digits off, innermost first
  throw scalelab::NotImplemented(
      "lab 10 step 1: peel the digits off, innermost first (README.md#step-1)");
  return c;
}

std::vector<int> group_ranks(const GridShape& shape, int rank, Axis axis) {
  std::vector<int> ranks;
  // TODO step 1: vary one coordinate, keep the other two
  throw scalelab::NotImplemented(
      "lab 10 step 1: vary one coordinate, keep the other two (README.md#step-1)");
  return ranks;
}

// ---- given -------------------------------------------------------------------------------------

void check_3d(const ModelConfig& config, const GridShape& shape, int world_size,
              int64_t global_batch, int micro_batches) {
  comm::check_grid(shape, world_size);
  lab07::check_tp(config, shape.tp);
  lab08::stage_layers(static_cast<int>(config.n_layer), shape.pp, 0);  // pp <= n_layer
  SCALELAB_REQUIRE(micro_batches >= 1, "the number of micro-batches must be at least 1, got {}",
                   micro_batches);
  SCALELAB_REQUIRE(global_batch % (static_cast<int64_t>(shape.dp) * micro_batches) == 0,
                   "the global batch of {} rows does not split into dp {} x {} micro-batches",
                   global_batch, shape.dp, micro_batches);
}

Groups groups_of(const comm::ProcessGrid& grid) {
  return Groups{grid.shape(), grid.coord(), grid.tp(), grid.dp(), grid.pp()};
}

// ---- Step 2 -------------------------------------------------------------------------------------

std::unique_ptr<nn::GPT> build_3d_model(const ModelConfig& config, Groups& g,
                                        nn::GPTOptions options) {
  std::unique_ptr<nn::GPT> model;
  // TODO step 2: a pipeline stage (lab 08) whose blocks are tensor parallel (lab 07)
  // HINT: nn::GPTOptions has tp_rank and tp_size; lab08::build_stage sets the blocks' range.
  // HINT: a block computes partial sums until its hooks are set: lab07::make_tensor_parallel.
  throw scalelab::NotImplemented(
      "lab 10 step 2: a pipeline stage (lab 08) whose blocks are tensor parallel (lab 07) (README.md#step-2)");
  return model;
}

// ---- Step 3 -------------------------------------------------------------------------------------

data::Batch dp_rows(const data::Batch& global, const Groups& g) {
  data::Batch mine;
  // TODO step 3: this dp replica's rows
  throw scalelab::NotImplemented(
      "lab 10 step 3: this dp replica's rows (README.md#step-3)");
  return mine;
}

double step_3d(nn::GPT& model, Groups& g, const data::Batch& global, int micro_batches,
               lab08::ExecStats* stats) {
  double loss = 0;
  // TODO step 3: 1F1B over pp, the tied gradient over pp, the average over dp
  // HINT: the loss run_schedule returns is this replica's: the global one averages the replicas.
  throw scalelab::NotImplemented(
      "lab 10 step 3: 1F1B over pp, the tied gradient over pp, the average over dp (README.md#step-3)");
  return loss;
}

}  // namespace scalelab::lab10
