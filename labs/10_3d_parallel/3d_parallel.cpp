// Starter generated from solutions/10_3d_parallel/3d_parallel.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash f05e1e58997fbf2a (lets make-labs see your edits).
// Lab 10: 3D parallelism (see 3d_parallel.hpp for the contract, README.md for the steps).
#include "3d_parallel.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/ops/flash_attention.hpp"
#include "common/ops/ops.hpp"
#include "common/train/global_loss.hpp"

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
  // TODO step 1: the coordinate of a world rank (grid_rank's inverse)
  throw scalelab::NotImplemented(
      "lab 10 step 1: the coordinate of a world rank (grid_rank's inverse) (README.md#step-1)");
  return c;
}

std::vector<int> group_ranks(const GridShape& shape, int rank, Axis axis) {
  std::vector<int> ranks;
  // TODO step 1: vary one coordinate, keep the other two
  throw scalelab::NotImplemented(
      "lab 10 step 1: vary one coordinate, keep the other two (README.md#step-1)");
  return ranks;
}

// ---- given: check_3d and groups_of are in grid_setup.cpp ----------------------------------------

// ---- Step 2 -------------------------------------------------------------------------------------

std::unique_ptr<nn::GPT> build_3d_model(const ModelConfig& config, Groups& g,
                                        nn::GPTOptions options, bool checkpoint) {
  std::unique_ptr<nn::GPT> model;
  // TODO step 2: a pipeline stage of tensor-parallel blocks, vocabulary-parallel ends
  // HINT: nn::GPTOptions: first_block / last_block (lab08::stage_layers), tp_rank / tp_size and
  // HINT: cut_block (lab07::cut_block), vocab_lo / vocab_hi (lab07::vocab_range). Then the model's
  // HINT: hook points: set_mappings (lab 07's TensorParallel on g.tp), set_block_policy.
  throw scalelab::NotImplemented(
      "lab 10 step 2: a pipeline stage of tensor-parallel blocks, vocabulary-parallel ends (README.md#step-2)");
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
  // TODO step 3: the global batch's gradients and loss, each collective on its own group
  // HINT: the loss run_schedule returns is this replica's: the global one averages the replicas.
  throw scalelab::NotImplemented(
      "lab 10 step 3: the global batch's gradients and loss, each collective on its own group (README.md#step-3)");
  return loss;
}

// ---- given: Zero1Optimizer, check_runnable and Trainer3D are in trainer3d.cpp -------------------

// ---- Step 4 -------------------------------------------------------------------------------------

int64_t stage_parameters(const ModelConfig& config, int tp, int pp, int stage) {
  int64_t n = 0;
  // TODO step 4: what step 2's model holds, counted
  throw scalelab::NotImplemented(
      "lab 10 step 4: what step 2's model holds, counted (README.md#step-4)");
  return n;
}

std::size_t model_state_bytes(int64_t params, int zero_stage, int dp, DType precision) {
  std::size_t bytes = 0;
  // TODO step 4: the model state a rank keeps between steps, ZeRO sharding over dp
  // HINT: master_dtype(precision) for value, gradient, m and v; bf16 adds the 2-byte copy.
  throw scalelab::NotImplemented(
      "lab 10 step 4: the model state a rank keeps between steps, ZeRO sharding over dp (README.md#step-4)");
  return bytes;
}

std::size_t stage_activation_bytes(const ModelConfig& config, int64_t rows, int tp, int pp,
                                   int stage, bool checkpoint, DType precision, int cp,
                                   lab11::Attention attention) {
  int64_t n = 0, stats = 0, lse = 0;  // elements of activations, of LayerNorm statistics, of lse
  // TODO step 4: count GPTActivations tensor by tensor
  // HINT: activations are `precision` (bf16 in mixed precision), statistics ops::stats_dtype of it.
  throw scalelab::NotImplemented(
      "lab 10 step 4: count GPTActivations tensor by tensor (README.md#step-4)");
  return static_cast<std::size_t>(n) * dtype_size(precision) +
         static_cast<std::size_t>(stats) * dtype_size(ops::stats_dtype(precision)) +
         static_cast<std::size_t>(lse) * dtype_size(ops::flash_attention_lse_dtype(precision));
}

std::size_t backward_transient_bytes(const ModelConfig& config, int64_t rows, int tp, int pp,
                                     int stage, bool checkpoint, DType precision, int cp,
                                     lab11::Attention attention) {
  int64_t n = 0;  // elements (of the activations' dtype: every temporary of a backward is)
  std::size_t recompute = 0;  // bytes of the recomputed block's activations (checkpointing)
  // TODO step 4: the largest moment of one micro-batch's backward, temporaries only
  throw scalelab::NotImplemented(
      "lab 10 step 4: the largest moment of one micro-batch's backward, temporaries only (README.md#step-4)");
  return static_cast<std::size_t>(std::max<int64_t>(n, 0)) * dtype_size(precision) + recompute;
}

std::size_t max_in_flight(int pp, int stage, int micro_batches, lab08::Kind schedule,
                          int chunks) {
  int n = 0;
  // TODO step 4: the most micro-batches (pieces) the schedule keeps on this stage
  throw scalelab::NotImplemented(
      "lab 10 step 4: the most micro-batches (pieces) the schedule keeps on this stage (README.md#step-4)");
  return static_cast<std::size_t>(n);
}

Prediction predict(const ModelConfig& config, int64_t global_batch, const Plan& plan,
                   const Machine& machine, DType precision) {
  Prediction best;
  // TODO step 4: every stage's memory and time; the busiest one decides
  throw scalelab::NotImplemented(
      "lab 10 step 4: every stage's memory and time; the busiest one decides (README.md#step-4)");
  return best;
}

// ---- given: measure_machine is in planner_machine.cpp, plan_all in plan_search.cpp --------------

}  // namespace scalelab::lab10
