// Step 2: the 3D model. On every grid of this world size: what each rank holds (its stage's
// blocks, 1/tp of each, the single-device values), and that one pipeline step of the attendee's
// model through lab 08's executor gives the single-device loss and gradients of its replica's
// rows, with the tp all-reduces the blocks must make (byte counters).
#include <gtest/gtest.h>

#include "grid3d_checks.hpp"

namespace {

using namespace scalelab;
using namespace scalelab::lab10test;
using labtest::world;

TEST(Step2_Model, HoldsItsStageAndItsShare) {
  for (const lab10::GridShape& shape : grids_for(world().size())) {
    SCOPED_TRACE(name(shape));
    const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
    lab10::Groups g = lab10::groups_of(grid);
    auto model = lab10::build_3d_model(config(), g, f64());
    auto want = own_model(g);
    const lab08::LayerRange r = lab08::stage_layers(4, shape.pp, g.coord.pp);
    EXPECT_EQ(model->first_block(), r.first);
    EXPECT_EQ(model->last_block(), r.last);
    EXPECT_EQ(model->has_embedding(), g.coord.pp == 0);
    EXPECT_EQ(model->has_head(), g.coord.pp == shape.pp - 1);
    // A rank holds 1/tp of each block: the same parameters, shapes and shards as the test's model.
    EXPECT_EQ(model->num_parameters(), want->num_parameters());
    ASSERT_EQ(model->parameters().size(), want->parameters().size());
    for (std::size_t i = 0; i < want->parameters().size(); ++i) {
      const nn::Parameter& p = *model->parameters()[i];
      const nn::Parameter& w = *want->parameters()[i];
      EXPECT_EQ(p.name, w.name);
      EXPECT_EQ(p.shape(), w.shape()) << p.name;
    }
    // The values are the single-device model's, cut: seed and dtype kept.
    nn::GPT full(config(), f64());
    EXPECT_TRUE(labtest::bitwise(model->params().values(), expected(*model, full, false)));
    for (int i = r.first; i < r.last; ++i)
      EXPECT_TRUE(model->block(i).reduce_forward && model->block(i).reduce_backward)
          << "block " << i << "'s hooks are not set: its projections stay partial sums";
  }
}

TEST(Step2_Model, PipelineStepEqualsSingleDeviceOnItsRows) {
  const data::Batch global = kLab.batch(0);
  for (const lab10::GridShape& shape : grids_for(world().size())) {
    SCOPED_TRACE(name(shape));
    const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
    lab10::Groups g = lab10::groups_of(grid);
    auto model = lab10::build_3d_model(config(), g, f64());
    // This replica's rows (the test cuts them: dp_rows is step 3's), 2 micro-batches, 1F1B.
    const int64_t b = global.batch_size() / shape.dp;
    const data::Batch rows = global.rows(g.coord.dp * b, (g.coord.dp + 1) * b);
    const comm::CommStats before = comm::comm_stats();
    const double loss = lab08::pipeline_step({model.get()}, lab08::schedule_1f1b(shape.pp, 2,
                                             g.coord.pp), rows, 2, g.pp);
    const int64_t tp_bytes = all_reduce_bytes(before, g.tp.name());
    auto ref = reference_model(rows);  // the single device on the same rows
    const Tensor l = Tensor::from_vector({loss}, {1}, DType::f64);
    const Tensor want_l = Tensor::from_vector({ref->forward(rows.x, rows.y)}, {1}, DType::f64);
    EXPECT_TRUE(labtest::close_on_every_rank(l, want_l, kRtol, kAtol));
    EXPECT_TRUE(labtest::close_on_every_rank(model->params().grads(),
                                             expected(*model, *ref, true), kRtol, kAtol));
    // Two all-reduces of (rows, T, C) per block forward, two backward: the blocks really are
    // split (a rank computing whole layers sends nothing and holds more).
    EXPECT_EQ(tp_bytes, tp_block_bytes(model->last_block() - model->first_block(), b));
  }
}

}  // namespace
