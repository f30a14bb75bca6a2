// Lab 10: 3D parallelism (see 3d_parallel.hpp for the contract, README.md for the steps).
#include "3d_parallel.hpp"

#include "common/errors.hpp"

namespace scalelab::lab10 {

// ---- Step 1 -------------------------------------------------------------------------------------

int grid_rank(const GridShape& shape, const GridCoord& c) {
  int rank = 0;
  // BEGIN SOLUTION step 1: the world rank of a coordinate, tp innermost in both orders
  // HINT: like a number written in mixed radix: the innermost axis is the last digit.
  if (shape.order == GridOrder::megatron)
    rank = (c.pp * shape.dp + c.dp) * shape.tp + c.tp;  // pp outermost, then dp, then tp
  else
    rank = (c.dp * shape.pp + c.pp) * shape.tp + c.tp;  // dp outermost, then pp, then tp
  // END SOLUTION
  return rank;
}

GridCoord grid_coord(const GridShape& shape, int rank) {
  GridCoord c;
  // BEGIN SOLUTION step 1: peel the digits off, innermost first
  c.tp = rank % shape.tp;
  const int rest = rank / shape.tp;
  if (shape.order == GridOrder::megatron) {
    c.dp = rest % shape.dp;
    c.pp = rest / shape.dp;
  } else {
    c.pp = rest % shape.pp;
    c.dp = rest / shape.pp;
  }
  // END SOLUTION
  return c;
}

std::vector<int> group_ranks(const GridShape& shape, int rank, Axis axis) {
  std::vector<int> ranks;
  // BEGIN SOLUTION step 1: vary one coordinate, keep the other two
  const GridCoord me = lab10::grid_coord(shape, rank);  // (comm:: has one too: ours)
  const int n = axis == Axis::tp ? shape.tp : axis == Axis::dp ? shape.dp : shape.pp;
  for (int i = 0; i < n; ++i) {
    GridCoord c = me;
    (axis == Axis::tp ? c.tp : axis == Axis::dp ? c.dp : c.pp) = i;
    ranks.push_back(lab10::grid_rank(shape, c));
  }
  // END SOLUTION
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
  // BEGIN SOLUTION step 2: a pipeline stage (lab 08) whose blocks are tensor parallel (lab 07)
  // HINT: nn::GPTOptions has tp_rank and tp_size; lab08::build_stage sets the blocks' range.
  // HINT: a block computes partial sums until its hooks are set: lab07::make_tensor_parallel.
  options.tp_rank = g.coord.tp;
  options.tp_size = g.shape.tp;
  model = lab08::build_stage(config, g.shape.pp, g.coord.pp, options);
  for (int i = model->first_block(); i < model->last_block(); ++i)
    lab07::make_tensor_parallel(model->block(i), g.tp);
  // END SOLUTION
  return model;
}

// ---- Step 3 -------------------------------------------------------------------------------------

data::Batch dp_rows(const data::Batch& global, const Groups& g) {
  data::Batch mine;
  // BEGIN SOLUTION step 3: this dp replica's rows
  const int64_t b = global.batch_size() / g.shape.dp;
  mine = global.rows(g.coord.dp * b, (g.coord.dp + 1) * b);
  // END SOLUTION
  return mine;
}

double step_3d(nn::GPT& model, Groups& g, const data::Batch& global, int micro_batches,
               lab08::ExecStats* stats) {
  double loss = 0;
  // BEGIN SOLUTION step 3: 1F1B over pp, the tied gradient over pp, the average over dp
  // HINT: the loss run_schedule returns is this replica's: the global one averages the replicas.
  model.zero_grad();
  const data::Batch mine = dp_rows(global, g);
  const int64_t b = mine.batch_size() / micro_batches;
  std::vector<data::Batch> micro;
  for (int i = 0; i < micro_batches; ++i) micro.push_back(mine.rows(i * b, (i + 1) * b));
  const lab08::Schedule schedule = lab08::schedule_1f1b(g.shape.pp, micro_batches, g.coord.pp);
  const std::vector<nn::GPT*> pieces = {&model};
  loss = lab08::run_schedule(pieces, schedule, micro, g.pp, stats);
  // The first and last stage of THIS pipeline (same dp, same tp) hold the two copies of wte: the
  // copies on other tp ranks are other ranks' (equal) copies, not other uses.
  lab08::sync_tied_gradients(pieces, g.pp);
  // The replicas of this shard (same tp, same pp) saw different rows: average. The tp ranks hold
  // different slices, so a reduction over tp would add unrelated numbers.
  g.dp.all_reduce(model.params().grads(), comm::ReduceOp::avg);
  Tensor l = Tensor::from_vector({loss}, {1}, DType::f64);
  g.dp.all_reduce(l, comm::ReduceOp::avg);
  loss = l.item();
  // END SOLUTION
  return loss;
}

}  // namespace scalelab::lab10
