// Lab 10, given: what a grid must satisfy and the communicators a rank uses. check_3d (the usage
// errors of a dp x tp x pp grid, a model and a batch: one line, the same on every rank) and
// groups_of (a comm::ProcessGrid's coordinate and tp, dp, pp communicators, copied into Groups).
// Not an exercise: read it to see which limits a grid is refused for before anything runs.
#include "3d_parallel.hpp"

#include "common/errors.hpp"

namespace scalelab::lab10 {

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
  return Groups{grid.shape(), grid.coord(), grid.tp(), grid.dp(), grid.pp(), grid.cp(), grid.dp_cp()};
}

}  // namespace scalelab::lab10
