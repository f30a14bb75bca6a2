// Step 3 with the 4th axis (cp_setup.cpp, lab 11's attention in lab 10's model), on 8 ranks:
// dp 2 x cp 2 x tp 2 x pp 1 and dp 1 x cp 2 x tp 2 x pp 2. One step of Trainer3D (the given
// driver the program runs for cp > 1, on step 2's model wrapped by with_context_parallel) gives
// the single-device loss and gradients of the GLOBAL batch, cut to what each rank holds, within
// kRtol / kAtol (float64: the ring's log-sum-exp merges and the dp x cp average add in another
// order than the single device, which moves the last digits only). The byte counters show the cp
// group carrying exactly the ring's K/V blocks and the dp x cp group averaging the gradients
// once (the dp group alone: nothing). The planted fault averages over dp only (the 3D recipe on
// a cp grid) and must fail the same check. ZeRO-1 shards over dp x cp. Trainer3D builds the test's
// own pieces (own_builder), so step 3 is graded without the attendee's step 2 here too
// (lab10.planted.step3_without_step2.np8). About 3 s on 2 cores.
#include <gtest/gtest.h>

#include "grid3d_checks.hpp"

namespace {

using namespace scalelab;
using namespace scalelab::lab10test;
using labtest::world;

constexpr int kMicro = 2;

std::vector<lab10::GridShape> grids_4d() {
  // {dp, tp, pp, order, cp}
  return {{2, 2, 1, lab10::GridOrder::megatron, 2}, {1, 2, 2, lab10::GridOrder::megatron, 2}};
}

std::string name4(const lab10::GridShape& s) { return fmt::format("{} x cp {}", name(s), s.cp); }

// true on every rank when `ok` is true on every rank (collective over world()).
bool on_every_rank(bool ok) {
  Tensor t = Tensor::from_vector({ok ? 1.0 : 0.0}, {1}, DType::f64);
  world().all_reduce(t, comm::ReduceOp::min);
  return t.item() == 1.0;
}

testing::AssertionResult matches(nn::GPT& model, double loss, const lab10::GridShape& shape) {
  const data::Batch global = kLab.batch(0);
  auto ref = reference_model(global);
  const Tensor l = Tensor::from_vector({loss}, {1}, DType::f64);
  const Tensor want_l = Tensor::from_vector({ref->forward(global.x, global.y)}, {1}, DType::f64);
  auto loss_ok = labtest::close_on_every_rank(l, want_l, kRtol, kAtol);
  if (!loss_ok) return testing::AssertionFailure() << name4(shape) << ": loss: " << loss_ok.message();
  auto grads_ok = labtest::close_on_every_rank(model.params().grads(), expected(model, *ref, true),
                                               kRtol, kAtol);
  if (!grads_ok)
    return testing::AssertionFailure() << name4(shape) << ": gradients: " << grads_ok.message();
  return testing::AssertionSuccess();
}

TEST(Step3_4D, CpStepMatchesTheSingleDeviceAndItsTraffic) {
  if (world().size() != 8) GTEST_SKIP() << "the 4D grids run on 8 ranks";
  const ModelConfig c = config();
  for (const lab10::GridShape& shape : grids_4d()) {
    for (lab11::Attention attention : {lab11::Attention::ring, lab11::Attention::all_to_all}) {
      if (attention == lab11::Attention::all_to_all && shape.pp == 2) continue;  // one of each
      SCOPED_TRACE(fmt::format("{}, {}", name4(shape), lab11::attention_name(attention)));
      const comm::ProcessGrid grid(world(), shape);
      lab10::Groups g = lab10::groups_of(grid);
      lab10::Plan plan{shape, kMicro, 0, false};
      plan.attention = attention;
      lab10::Trainer3D t(c, g, plan, f64(), {}, own_builder);  // the test's pieces, not step 2's
      const comm::CommStats before = comm::comm_stats();
      const double loss = t.step(kLab.batch(0));
      const comm::CommStats did = comm::comm_stats() - before;
      EXPECT_TRUE(matches(t.model(), loss, shape));

      // cp: per block and micro-batch, the ring sends this rank's K/V block (k and v of its
      // b rows x T/cp tokens x C/tp) cp - 1 times forward and 2 cp - 1 times backward (lab 11);
      // all-to-all: q, k, v and y forward, their gradients backward, 8 all-to-alls of one
      // activation's bytes (the library counts an all-to-all's whole input).
      const nn::GPT& m = t.model();
      const int64_t b = kLab.global_batch / shape.dp / kMicro, tokens = c.block_size / shape.cp;
      const int64_t blocks = m.last_block() - m.first_block(), cp = shape.cp;
      const int64_t act = b * tokens * (c.n_embd / shape.tp) * 8;  // one of q, k, v, y: f64
      const int64_t cp_want = attention == lab11::Attention::ring
                                  ? blocks * kMicro * (3 * cp - 2) * 2 * act
                                  : blocks * kMicro * 8 * act;
      const int64_t cp_sent = attention == lab11::Attention::ring
                                  ? comm::comm_total(did, g.cp.name(), "send").bytes
                                  : comm::comm_total(did, g.cp.name(), "all_to_all").bytes;
      EXPECT_TRUE(on_every_rank(cp_sent == cp_want))
          << fmt::format("the cp group moved {} bytes on this rank, want {}", cp_sent, cp_want);
      // tp: lab 07's operators on this rank's T/cp tokens (every term scales with the tokens)
      EXPECT_TRUE(on_every_rank(all_reduce_bytes(before, g.tp.name()) ==
                                tp_bytes(m, kLab.global_batch / shape.dp) / shape.cp));
      // dp x cp: the gradients once, and the loss; dp alone: nothing
      const int64_t grads = m.num_parameters() * 8;
      const int64_t dpcp = comm::comm_total(did, g.dp_cp.name(), "all_reduce").bytes;
      EXPECT_TRUE(on_every_rank(dpcp == grads + 8))
          << fmt::format("dp x cp all-reduced {} bytes, want the gradients' {} + the loss' 8",
                         dpcp, grads);
      EXPECT_TRUE(on_every_rank(comm::comm_total(did, g.dp.name()).bytes == 0));
    }
  }
}

// ZeRO-1 with cp shards AdamW's state over dp x cp (4 ranks here, Megatron's distributed
// optimizer): the step still gives the single device's gradients, each rank keeps 1/4 of m and
// v, and after the optimizer step (shards stepped, then all-gathered over dp x cp) every rank of
// the group holds the same values.
TEST(Step3_4D, ZeroOneShardsOverDpTimesCp) {
  if (world().size() != 8) GTEST_SKIP() << "the 4D grids run on 8 ranks";
  const lab10::GridShape shape = grids_4d()[0];
  const comm::ProcessGrid grid(world(), shape);
  lab10::Groups g = lab10::groups_of(grid);
  lab10::Trainer3D t(config(), g, lab10::Plan{shape, kMicro, 1, false}, f64(), {}, own_builder);
  const double loss = t.step(kLab.batch(0));
  EXPECT_TRUE(matches(t.model(), loss, shape));
  const int64_t padded = t.model().params().padded_numel();
  EXPECT_EQ(padded % (shape.dp * shape.cp), 0);
  EXPECT_EQ(t.optimizer_state_bytes(),
            static_cast<std::size_t>(2 * padded / (shape.dp * shape.cp) * 8));
  t.optimizer_step(1e-3);
  // the values, the same on every rank of dp x cp: their max and min over the group agree
  const Tensor values = t.parameters();
  Tensor hi = values.clone(), lo = values.clone();
  g.dp_cp.all_reduce(hi, comm::ReduceOp::max);
  g.dp_cp.all_reduce(lo, comm::ReduceOp::min);
  EXPECT_TRUE(labtest::close_on_every_rank(hi, lo, 0, 0));
}

// The 3D recipe on a cp grid: the same model and tokens, the gradients averaged over dp only.
// Each cp rank then keeps the gradient of its own tokens' mean: half of the answer, different on
// the two cp ranks. The check above must see it.
TEST(Step3_4DPlantedFault, AveragingOverDpOnlyIsCaught) {
  if (world().size() != 8) GTEST_SKIP() << "the 4D grids run on 8 ranks";
  const lab10::GridShape shape = grids_4d()[0];
  const comm::ProcessGrid grid(world(), shape);
  lab10::Groups g = lab10::groups_of(grid);
  auto model = own_model(g);
  model->set_mappings(lab10::with_context_parallel(model->shared_mappings(), config(), g,
                                                   lab11::Attention::ring));
  const data::Batch mine = lab10::cp_columns(lab10::dp_rows(kLab.batch(0), g), g);
  model->zero_grad();
  const double local = model->forward(mine.x, mine.y);
  model->backward();
  g.dp.all_reduce(model->params().grads(), comm::ReduceOp::avg);  // wrong: dp, not dp x cp
  Tensor l = Tensor::from_vector({local}, {1}, DType::f64);
  g.dp.all_reduce(l, comm::ReduceOp::avg);
  EXPECT_FALSE(matches(*model, l.item(), shape));
}

}  // namespace
