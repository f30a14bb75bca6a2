// Step 2: the 3D model. On every grid of this world size: what each rank holds (its stage's
// blocks, 1/tp of each, V/tp rows of the embedding and the head, the single-device values), and
// that one pipeline step of the attendee's model through lab 08's executor gives the single-device loss and gradients of its replica's
// rows, with the tp all-reduces the blocks must make (byte counters).
#include <functional>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "grid3d_checks.hpp"

namespace {

using namespace scalelab;
using namespace scalelab::lab10test;
using labtest::world;

using BuildFn = std::function<std::unique_ptr<nn::GPT>(lab10::Groups&)>;

// `why` ("" where this rank holds what it should) agreed over every rank: the next grid's
// communicators are collective, so every rank stops at the same grid, each failing one with its
// own cause (labtest::on_every_rank).
testing::AssertionResult agreed(const lab10::GridShape& shape, const std::string& why) {
  if (why.empty()) return labtest::on_every_rank(testing::AssertionSuccess());
  return labtest::on_every_rank(testing::AssertionFailure() << name(shape) << ": " << why);
}

// What every rank of every grid holds: its stage's blocks, 1/tp of each, V/tp rows of wte and of
// the head's copy, the single-device values cut by each parameter's shard, the blocks' hooks.
testing::AssertionResult holds_its_share(const BuildFn& build) {
  for (const lab10::GridShape& shape : grids_for(world().size())) {
    const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
    lab10::Groups g = lab10::groups_of(grid);
    auto model = build(g);
    auto want = own_model(g);
    const lab08::LayerRange r = lab08::stage_layers(4, shape.pp, g.coord.pp);
    std::string why;
    if (model->first_block() != r.first || model->last_block() != r.last)
      why = fmt::format("blocks [{}, {}), want [{}, {})", model->first_block(),
                        model->last_block(), r.first, r.last);
    else if (model->has_embedding() != (g.coord.pp == 0) ||
             model->has_head() != (g.coord.pp == shape.pp - 1))
      why = "the embedding belongs to the first stage, the head to the last";
    else if (model->parameters().size() != want->parameters().size())
      why = fmt::format("{} parameters, want {}", model->parameters().size(),
                        want->parameters().size());
    for (std::size_t i = 0; why.empty() && i < want->parameters().size(); ++i) {
      const nn::Parameter& p = *model->parameters()[i];
      const nn::Parameter& w = *want->parameters()[i];
      if (p.name != w.name || p.shape() != w.shape())
        why = fmt::format("parameter {} is {} {}, want {} {} (1/tp of each block, V/tp rows of "
                          "wte and lm_head.weight)", i, p.name, Tensor::empty(p.shape()).str(),
                          w.name, Tensor::empty(w.shape()).str());
    }
    // The values are the single-device model's, cut: seed and dtype kept.
    nn::GPT full(config(), f64());
    if (why.empty() && !labtest::bitwise(model->params().values(), expected(*model, full, false)))
      why = "the values are not the single-device model's, cut by each parameter's shard";
    // lab 07's mappings at every hook point: the blocks' f and g, the vocabulary-parallel ends
    if (why.empty() && dynamic_cast<const lab07::TensorParallel*>(&model->mappings()) == nullptr)
      why = "the model's mappings are not lab 07's TensorParallel: its projections stay partial "
            "sums and its vocabulary shard is not embedded or scored over tp";
    for (int i = r.first; why.empty() && i < r.last; ++i)
      if (model->block(i).mappings != &model->mappings())
        why = fmt::format("block {} does not talk through the model's mappings", i);
    // every rank must agree (the next grid's communicators are collective)
    if (testing::AssertionResult all = agreed(shape, why); !all) return all;
  }
  return testing::AssertionSuccess();
}

TEST(Step2_Model, HoldsItsStageAndItsShare) {
  EXPECT_TRUE(holds_its_share([](lab10::Groups& g) {
    return lab10::build_3d_model(config(), g, f64());
  }));
}

// A stage that keeps the whole vocabulary on every tp rank (wte and the head's copy not cut):
// caught by the shapes on every grid with tp > 1.
TEST(Step2_PlantedFault, WholeVocabularyOnEveryTpRankFails) {
  if (world().size() == 1) GTEST_SKIP() << "no tp > 1 grid on 1 rank";
  EXPECT_FALSE(holds_its_share([](lab10::Groups& g) -> std::unique_ptr<nn::GPT> {
    nn::GPTOptions o = own_options(g);
    o.vocab_lo = 0;
    o.vocab_hi = -1;  // the planted fault: the whole vocabulary
    return own_stage(config(), o, g.tp);
  }));
}

// What one micro-batch's forward leaves on a rank of `model`'s stage (GPTActivations::nbytes;
// the head is not run: it keeps the same with or without checkpointing). Collective over g.tp.
std::size_t forward_keeps(const nn::GPT& model, int64_t rows) {
  const data::Batch mb = kLab.batch(0).rows(0, rows);
  nn::GPTActivations acts;
  Tensor x = model.has_embedding()
                 ? model.embed(mb.x, acts)
                 : Tensor::zeros({rows, mb.x.size(1), config().n_embd}, DType::f64);
  model.forward_blocks(x, acts);
  return acts.nbytes();
}

// build_3d_model(..., checkpoint = true): every block recomputes, so after a forward the stage
// keeps only its blocks' inputs: the bytes of the test's own checkpointed stage (FullCheckpoint),
// less than the same stage without checkpointing. A model that ignores `checkpoint` keeps every
// block's activations (and the program would still say "every block checkpointed").
testing::AssertionResult checkpoints_its_blocks(const BuildFn& build_checkpointed) {
  for (const lab10::GridShape& shape : grids_for(world().size())) {
    const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
    lab10::Groups g = lab10::groups_of(grid);
    auto model = build_checkpointed(g);
    const std::size_t got = forward_keeps(*model, 2);
    const std::size_t want = forward_keeps(*own_model(g, 1, true), 2);
    const std::size_t whole = forward_keeps(*own_model(g, 1, false), 2);
    std::string why;
    if (got != want)
      why = fmt::format(
          "built with checkpoint = true, a forward of 2 rows leaves {} bytes of activations on "
          "this stage; a stage whose blocks are checkpointed keeps {} (only each block's input), "
          "one that keeps everything {}", got, want, whole);
    if (testing::AssertionResult all = agreed(shape, why); !all) return all;
  }
  return testing::AssertionSuccess();
}

TEST(Step2_Model, CheckpointTrueKeepsOnlyTheBlocksInputs) {
  EXPECT_TRUE(checkpoints_its_blocks([](lab10::Groups& g) {
    return lab10::build_3d_model(config(), g, f64(), /*checkpoint=*/true);
  }));
}

// A stage built without its block policy when asked to checkpoint: caught on every grid.
TEST(Step2_PlantedFault, CheckpointIgnoredFails) {
  EXPECT_FALSE(checkpoints_its_blocks([](lab10::Groups& g) {
    return own_stage(config(), own_options(g), g.tp, /*checkpoint=*/false);
  }));
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
    const int64_t tp_sent = all_reduce_bytes(before, g.tp.name());
    auto ref = reference_model(rows);  // the single device on the same rows
    const Tensor l = Tensor::from_vector({loss}, {1}, DType::f64);
    const Tensor want_l = Tensor::from_vector({ref->forward(rows.x, rows.y)}, {1}, DType::f64);
    EXPECT_TRUE(labtest::close_on_every_rank(l, want_l, kRtol, kAtol));
    EXPECT_TRUE(labtest::close_on_every_rank(model->params().grads(),
                                             expected(*model, *ref, true), kRtol, kAtol));
    // Two all-reduces of (rows, T, C) per block forward, two backward, and the vocabulary-parallel
    // ends': the blocks and the ends really are split (a rank computing whole layers sends
    // nothing and holds more).
    EXPECT_EQ(tp_sent, tp_bytes(*model, b));
  }
}

}  // namespace
