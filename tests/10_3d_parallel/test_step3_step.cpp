// Step 3: the 3D step. On every grid of this world size (4 ranks: 1x2x2, 2x1x2, 2x2x1; 8 ranks:
// 2x2x2, 1x2x4, 2x4x1, 4x1x2), one step on the test's own 3D model (not the attendee's step 2)
// gives the single-device loss and gradients of the GLOBAL batch, cut to what each rank holds,
// within kRtol / kAtol (float64); the byte counters show the dp group averaging the gradients
// once and the tp group carrying only the blocks' all-reduces. The planted faults run the same
// checks on deliberately wrong steps written here.
#include <functional>

#include <gtest/gtest.h>

#include "common/optim/optim.hpp"
#include "grid3d_checks.hpp"

namespace {

using namespace scalelab;
using namespace scalelab::lab10test;
using labtest::world;

constexpr int kMicro = 2;

// true on every rank when `ok` is true on every rank (collective over world()).
bool on_every_rank(bool ok) {
  Tensor t = Tensor::from_vector({ok ? 1.0 : 0.0}, {1}, DType::f64);
  world().all_reduce(t, comm::ReduceOp::min);
  return t.item() == 1.0;
}

using StepFn = std::function<double(nn::GPT&, lab10::Groups&, const data::Batch&)>;

// One step of `step` on `shape` against the single device: numbers, then traffic per group.
testing::AssertionResult step_matches(const StepFn& step, const lab10::GridShape& shape) {
  const data::Batch global = kLab.batch(0);
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  auto model = own_model(g);
  auto ref = reference_model(global);
  const comm::CommStats before = comm::comm_stats();
  const double loss = step(*model, g, global);
  const int64_t tp_bytes = all_reduce_bytes(before, g.tp.name());
  const int64_t dp_bytes = all_reduce_bytes(before, g.dp.name());

  const Tensor l = Tensor::from_vector({loss}, {1}, DType::f64);
  const Tensor want_l = Tensor::from_vector({ref->forward(global.x, global.y)}, {1}, DType::f64);
  auto loss_ok = labtest::close_on_every_rank(l, want_l, kRtol, kAtol);
  if (!loss_ok) return testing::AssertionFailure() << name(shape) << ": loss: " << loss_ok.message();
  auto grads_ok = labtest::close_on_every_rank(model->params().grads(),
                                               expected(*model, *ref, true), kRtol, kAtol);
  if (!grads_ok)
    return testing::AssertionFailure() << name(shape) << ": gradients: " << grads_ok.message();
  // tp: exactly the blocks' operators on B/dp rows (nothing else belongs to the tp group).
  const int blocks = model->last_block() - model->first_block();
  const int64_t tp_want = tp_block_bytes(blocks, global.batch_size() / shape.dp);
  if (!on_every_rank(tp_bytes == tp_want))
    return testing::AssertionFailure() << fmt::format(
               "{}: the tp group all-reduced {} bytes on this rank, want {} (the blocks' "
               "operators only)", name(shape), tp_bytes, tp_want);
  // dp: the gradients once (and room for a few scalars such as the loss), when there are replicas.
  const int64_t grad_bytes = model->num_parameters() * 8;
  const bool dp_ok = shape.dp == 1 || (dp_bytes >= grad_bytes && dp_bytes <= grad_bytes + 64);
  if (!on_every_rank(dp_ok))
    return testing::AssertionFailure() << fmt::format(
               "{}: the dp group all-reduced {} bytes on this rank, want the gradients' {} "
               "(+ at most 64 for scalars)", name(shape), dp_bytes, grad_bytes);
  return testing::AssertionSuccess();
}

TEST(Step3_Step, DpRowsAreThisReplicasShare) {
  const data::Batch global = kLab.batch(0);
  for (const lab10::GridShape& shape : grids_for(world().size())) {
    const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
    const lab10::Groups g = lab10::groups_of(grid);
    const data::Batch got = lab10::dp_rows(global, g);
    const int64_t b = global.batch_size() / shape.dp;
    const data::Batch want = global.rows(g.coord.dp * b, (g.coord.dp + 1) * b);
    EXPECT_TRUE(labtest::bitwise(got.x, want.x)) << name(shape);
    EXPECT_TRUE(labtest::bitwise(got.y, want.y)) << name(shape);
  }
}

TEST(Step3_Step, EqualsSingleDeviceOnEveryGrid) {
  const StepFn attendee = [](nn::GPT& m, lab10::Groups& g, const data::Batch& b) {
    return lab10::step_3d(m, g, b, kMicro);
  };
  for (const lab10::GridShape& shape : grids_for(world().size()))
    EXPECT_TRUE(step_matches(attendee, shape));
}

// Your step with ZeRO-1 over dp (the given Zero1Optimizer, lab 09's pieces) in place of a whole
// AdamW: two steps, bit for bit the same parameters and losses (the same averaged gradient, the
// same elementwise update by the shard's owner, exact copies back), with m and v for 1/dp of the
// stage only. The gradients must not depend on the padding ZeRO adds to the flat layout.
TEST(Step3_Step, Zero1OverDpIsBitwiseAdamW) {
  for (const lab10::GridShape& shape : grids_for(world().size())) {
    if (shape.dp == 1) continue;
    SCOPED_TRACE(name(shape));
    const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
    lab10::Groups g = lab10::groups_of(grid);
    auto whole = own_model(g), sharded = own_model(g, shape.dp);
    optim::AdamW adamw(optim::groups(whole->parameters()));
    lab10::Zero1Optimizer zero1(*sharded, g.dp);
    for (int s = 0; s < 2; ++s) {
      const double a = lab10::step_3d(*whole, g, kLab.batch(s), kMicro);
      const double b = lab10::step_3d(*sharded, g, kLab.batch(s), kMicro);
      EXPECT_EQ(a, b) << "step " << s;
      adamw.step(1e-2);
      zero1.step(1e-2);
      EXPECT_TRUE(labtest::bitwise(sharded->params().values(), whole->params().values()))
          << "step " << s;
    }
    const std::size_t shard = nn::shard_range(whole->num_parameters(), g.coord.dp, shape.dp).real();
    EXPECT_EQ(zero1.state_bytes(), 2 * shard * sizeof(double));
    EXPECT_EQ(adamw.state_bytes(), 2 * static_cast<std::size_t>(whole->num_parameters()) * 8);
  }
}

// ---- planted faults -----------------------------------------------------------------------------

// A step written here: 1F1B over pp (lab 08), then `tie` and `reduce` as given.
StepFn planted(const std::function<void(nn::GPT&, lab10::Groups&)>& tie,
               const std::function<void(nn::GPT&, lab10::Groups&)>& reduce) {
  return [tie, reduce](nn::GPT& model, lab10::Groups& g, const data::Batch& global) {
    model.zero_grad();
    const int64_t b = global.batch_size() / g.shape.dp;
    const data::Batch mine = global.rows(g.coord.dp * b, (g.coord.dp + 1) * b);
    std::vector<data::Batch> micro;
    for (int i = 0; i < kMicro; ++i) micro.push_back(mine.rows(i * b / kMicro, (i + 1) * b / kMicro));
    double loss = lab08::run_schedule({&model}, lab08::schedule_1f1b(g.shape.pp, kMicro, g.coord.pp),
                                      micro, g.pp);
    tie(model, g);
    reduce(model, g);
    Tensor l = Tensor::from_vector({loss}, {1}, DType::f64);
    g.dp.all_reduce(l, comm::ReduceOp::avg);
    return l.item();
  };
}

void tie_over_pp(nn::GPT& m, lab10::Groups& g) { lab08::sync_tied_gradients({&m}, g.pp); }
void average_over_dp(nn::GPT& m, lab10::Groups& g) {
  g.dp.all_reduce(m.params().grads(), comm::ReduceOp::avg);
}

// The planted step that is right shows the harness itself passes.
TEST(Step3_PlantedFault, CorrectPlantedStepPasses) {
  for (const lab10::GridShape& shape : grids_for(world().size()))
    EXPECT_TRUE(step_matches(planted(tie_over_pp, average_over_dp), shape));
}

// The gradients averaged over the tp group: the tp ranks hold DIFFERENT slices of the blocks, so
// this averages unrelated numbers (and the replicas never meet).
TEST(Step3_PlantedFault, DpReductionInsideTpGroupFails) {
  const auto wrong = planted(tie_over_pp, [](nn::GPT& m, lab10::Groups& g) {
    g.tp.all_reduce(m.params().grads(), comm::ReduceOp::avg);
  });
  for (const lab10::GridShape& shape : grids_for(world().size()))
    if (shape.dp > 1 && shape.tp > 1) EXPECT_FALSE(step_matches(wrong, shape));
}

// The tied gradient summed over the tp group instead of the pipeline: the first stage's tp ranks
// hold equal copies of the SAME use (the embedding), so wte gets twice its embedding gradient and
// never the head's.
TEST(Step3_PlantedFault, TiedGradientOverWrongGroupFails) {
  const auto wrong = planted(
      [](nn::GPT& m, lab10::Groups& g) {
        const bool tied_copy = m.has_embedding() != m.has_head();
        if (!tied_copy) return;
        g.tp.all_reduce(m.params().get(m.has_embedding() ? "wte.weight" : "lm_head.weight").grad);
      },
      average_over_dp);
  for (const lab10::GridShape& shape : grids_for(world().size()))
    if (shape.pp > 1 && shape.tp > 1) EXPECT_FALSE(step_matches(wrong, shape));
}

}  // namespace
