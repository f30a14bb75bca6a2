// Step 3: the 3D step. On every grid of this world size (4 ranks: 1x2x2, 2x1x2, 2x2x1; 8 ranks:
// 2x2x2, 1x2x4, 2x4x1, 4x1x2), one step on the test's own 3D model (not the attendee's step 2)
// gives the single-device loss and gradients of the GLOBAL batch, cut to what each rank holds,
// within kRtol / kAtol (float64); the byte counters show the dp group averaging the gradients
// once and the tp group carrying only the blocks' all-reduces, and the library's execution log
// (common/exec_log.hpp) shows each stage running 1F1B: its forwards, backwards and pipeline
// messages in the order of lab 08's schedule_1f1b for that stage (an AFAB step sends the same
// bytes). The planted faults run the same checks on deliberately wrong steps written here.
#include <algorithm>
#include <cmath>
#include <functional>

#include <gtest/gtest.h>

#include "common/allocator.hpp"
#include "common/exec_log.hpp"
#include "common/optim/optim.hpp"
#include "grid3d_checks.hpp"
#include "tests/08_pipeline_parallel/pp_test.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/memory_use.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"

namespace {

using namespace scalelab;
using namespace scalelab::lab10test;
using labtest::world;

constexpr int kMicro = 2;
// What a step may hold on the rank's heap beside its tensors, at its peak and on return: the
// library's records (the ledger's and the execution log's rows, the schedule, pending messages).
// Measured with the reference on every grid of 4 and 8 ranks: 10 to 21 KB at the peak, at most
// 488 bytes kept; a stage's gradient (at least 136 KB for the tiny model's stages here) or a
// micro-batch's activations kept in a std::vector exceed it.
constexpr int64_t kStepBookkeeping = 48 * 1024;

// true on every rank when `ok` is true on every rank (collective over world()).
bool on_every_rank(bool ok) {
  Tensor t = Tensor::from_vector({ok ? 1.0 : 0.0}, {1}, DType::f64);
  world().all_reduce(t, comm::ReduceOp::min);
  return t.item() == 1.0;
}

using StepFn = std::function<double(nn::GPT&, lab10::Groups&, const data::Batch&)>;

// The models both sides build and how close they must come.
struct Precision {
  nn::GPTOptions options = f64();
  double loss_rtol = kRtol, grad_rtol = kRtol;
  double grad_atol_of_max = 0;  // + this x max |reference gradient| (bf16 rounds each element)
};
// Mixed precision: each tp rank rounds its partial sums to bf16 before the all-reduce adds them,
// and bf16 keeps 8 bits (2^-8 = 4e-3 relative): the loss within 2e-3, the gradients within 3e-2
// of the largest one (lab 07's bounds; measured about a tenth of them).
const Precision kMixed{.options = mixed(), .loss_rtol = 2e-3, .grad_rtol = 3e-2,
                       .grad_atol_of_max = 3e-2};


// One step of `step` on `shape` against the single device: numbers, then traffic per group.
testing::AssertionResult step_matches(const StepFn& step, const lab10::GridShape& shape,
                                      bool checkpoint = false, const Precision& p = {}) {
  const data::Batch global = kLab.batch(0);
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  auto model = own_model(g, 1, checkpoint, p.options);
  // The gradients an earlier step would leave (a step the trainer runs after another): the step
  // must give the global batch's gradients all the same, not add its own to them.
  Tensor& grads = model->params().grads();
  grads.copy_from(Tensor::uniform(grads.shape(), 1010, grads.dtype()));
  auto ref = reference_model(global, p.options);
  // a failure names the first tensor off the twin (this replica's rows, its stage and tp share)
  labtest::Explain why(*model, p.options,
                       {.first_row = g.coord.dp * (global.batch_size() / shape.dp)});
  const comm::CommStats before = comm::comm_stats();
  double loss = 0;
  std::vector<exec_log::Event> log;
  {
    exec_log::Recording recording;
    loss = step(*model, g, global);
    log = recording.events();
  }
  why.step_done(global);
  const int64_t tp_sent = all_reduce_bytes(before, g.tp.name());
  const int64_t dp_bytes = all_reduce_bytes(before, g.dp.name());

  const Tensor l = Tensor::from_vector({loss}, {1}, DType::f64);
  const Tensor want_l = Tensor::from_vector({ref->forward(global.x, global.y)}, {1}, DType::f64);
  auto loss_ok = labtest::close_on_every_rank(l, want_l, p.loss_rtol, kAtol, why);
  if (!loss_ok) return testing::AssertionFailure() << name(shape) << ": loss: " << loss_ok.message();
  const Tensor want_g = expected(*model, *ref, true);
  const double grad_atol = kAtol + p.grad_atol_of_max * labtest::max_abs(want_g);
  auto grads_ok = labtest::close_on_every_rank(model->params().grads(), want_g, p.grad_rtol,
                                               grad_atol, why);
  if (!grads_ok)
    return testing::AssertionFailure()
           << name(shape) << ": gradients (the step ran on a model holding an earlier step's "
           << "gradients: a step's gradients are the global batch's alone): " << grads_ok.message();
  // tp: exactly the blocks' operators and the vocabulary-parallel ends on B/dp rows (nothing
  // else belongs to the tp group).
  const int64_t tp_want = tp_bytes(*model, global.batch_size() / shape.dp, checkpoint);
  if (!on_every_rank(tp_sent == tp_want))
    return testing::AssertionFailure() << fmt::format(
               "{}: the tp group all-reduced {} bytes on this rank, want {} (the blocks' "
               "operators and the vocabulary-parallel ends only)", name(shape), tp_sent, tp_want);
  // dp: the gradients once (and room for a few scalars such as the loss), when there are replicas.
  const int64_t grad_bytes =
      model->num_parameters() * static_cast<int64_t>(dtype_size(model->params().dtype()));
  const bool dp_ok = shape.dp == 1 || (dp_bytes >= grad_bytes && dp_bytes <= grad_bytes + 64);
  if (!on_every_rank(dp_ok))
    return testing::AssertionFailure() << fmt::format(
               "{}: the dp group all-reduced {} bytes on this rank, want the gradients' {} "
               "(+ at most 64 for scalars)", name(shape), dp_bytes, grad_bytes);
  // pp: what ran, from the library's log, never the step's own report: this stage's forwards,
  // backwards and (B/dp/m, T, C) messages in 1F1B's order (AFAB moves the same bytes).
  const int64_t message = global.batch_size() / shape.dp / kMicro * config().block_size *
                          config().n_embd *
                          static_cast<int64_t>(dtype_size(model->compute_dtype()));
  const pptest::Executed ran = pptest::executed(log, {model.get()}, g.pp, message);
  const testing::AssertionResult order = labtest::on_every_rank(
      pptest::ran(ran, lab08::schedule_1f1b(shape.pp, kMicro, g.coord.pp), true));
  if (!order)
    return testing::AssertionFailure()
           << name(shape) << ": not the 1F1B order on every stage (each stage's forwards, "
           << "backwards and messages as lab08::schedule_1f1b orders them, read from the "
           << "library's execution log): " << order.message();
  return testing::AssertionSuccess();
}

// First in step 3's run (this file links before test_step3_with_cp.cpp and test_step3_zero_sweep.cpp;
// tools.memory_first checks it): a buffer the code keeps in a function-local static is allocated
// inside this window, not by an earlier test.
// Activation checkpointing (the model built with checkpoint = true, the test's own): the same step
// gives the same loss and gradients; the rank's heap holds no more than the step's tensors and
// kStepBookkeeping, with checkpointing or without; and the allocator's peak during the step falls
// by at least what the forward no longer keeps: per micro-batch in flight, every block's
// activations but its input, less one block's (recomputed during the backward) and that block's
// dropped output. The bytes a forward keeps are measured on the test's own stages
// (GPTActivations::nbytes after one micro-batch's forward).
// dp_rows alone on every grid of this world size (no step run): "" when each rank gets its
// replica's rows, else the first thing wrong on this rank. Every rank goes through every grid
// (making a grid's communicators is collective), whatever it found.
std::string dp_rows_problem() {
  const data::Batch global = kLab.batch(0);
  std::string first;
  for (const lab10::GridShape& shape : grids_for(world().size())) {
    const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
    const lab10::Groups g = lab10::groups_of(grid);
    const int64_t b = global.batch_size() / shape.dp;
    const data::Batch want = global.rows(g.coord.dp * b, (g.coord.dp + 1) * b);
    if (!first.empty()) continue;
    try {
      const data::Batch got = lab10::dp_rows(global, g);
      if (!labtest::bitwise(got.x, want.x) || !labtest::bitwise(got.y, want.y))
        first = fmt::format("{}: dp_rows on rank (dp {}, tp {}, pp {}) is not rows [{}, {}) of "
                           "the global batch, its replica's contiguous share", name(shape),
                           g.coord.dp, g.coord.tp, g.coord.pp, g.coord.dp * b,
                           (g.coord.dp + 1) * b);
    } catch (const CheckFailed& e) {
      first = fmt::format("{}: lab10::dp_rows on rank (dp {}, tp {}, pp {}) threw a library "
                          "check: {}", name(shape), g.coord.dp, g.coord.tp, g.coord.pp, e.what());
    }
  }
  return first;
}

TEST(Step3_Step, CheckpointedEqualsSingleDeviceAndKeepsLess) {
  // dp_rows first, alone (every step calls it): a wrong share is reported as such rather than
  // as a library check thrown deep in a step. (DpRowsAreThisReplicasShare, the same check,
  // runs after this test: the memory check must come first in step 3's run.)
  const std::string rows = dp_rows_problem();
  ASSERT_TRUE(on_every_rank(rows.empty()))
      << "checked before any step: " << (rows.empty() ? "another rank's dp_rows failed" : rows);
  const StepFn attendee = [](nn::GPT& m, lab10::Groups& g, const data::Batch& b) {
    return calling("lab10::step_3d", [&] { return lab10::step_3d(m, g, b, kMicro); });
  };
  const data::Batch global = kLab.batch(0);
  for (const lab10::GridShape& shape : grids_for(world().size())) {
    EXPECT_TRUE(step_matches(attendee, shape, true));
    SCOPED_TRACE(name(shape));
    const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
    lab10::Groups g = lab10::groups_of(grid);
    std::size_t peak[2] = {0, 0}, kept[2] = {0, 0};
    for (bool ckpt : {false, true}) {
      auto model = own_model(g, 1, ckpt);
      {  // what one micro-batch's forward keeps on this stage
        const int64_t rows = global.batch_size() / shape.dp / kMicro;
        const data::Batch mb = global.rows(0, rows);
        nn::GPTActivations acts;
        Tensor x = model->has_embedding() ? model->embed(mb.x, acts)
                                          : Tensor::zeros({rows, mb.x.size(1), config().n_embd},
                                                          DType::f64);
        model->forward_blocks(x, acts);
        kept[ckpt] = acts.nbytes();  // (the head is not run: both keep the same there)
      }
      world().barrier();
      const labtest::MemoryUse m =
          labtest::memory_use_of([&] {
            calling("lab10::step_3d", [&] { lab10::step_3d(*model, g, global, kMicro); });
          });
      peak[ckpt] = static_cast<std::size_t>(m.tensor_peak);
      EXPECT_TRUE(labtest::nothing_beside_tensors(
          m, kStepBookkeeping, ckpt ? "a checkpointed step_3d" : "step_3d"));
    }
    const int blocks = own_options(g).last_block - own_options(g).first_block;
    const std::size_t in_flight = std::min(shape.pp - g.coord.pp, kMicro);
    const std::size_t per_block = (kept[0] - kept[1]) / blocks;  // one block's, less its input
    // the recomputed block's output (rows, T, C) is made and dropped while its activations live
    const std::size_t output = global.batch_size() / shape.dp / kMicro * config().block_size *
                               config().n_embd * sizeof(double);
    // (with one block and one micro-batch in flight nothing need be saved: the one recomputed)
    const std::size_t want_saved = std::max<int64_t>(
        0, static_cast<int64_t>(in_flight * (kept[0] - kept[1]) - per_block - output));
    EXPECT_LT(kept[1], kept[0]);
    EXPECT_GE(peak[0] - std::min(peak[0], peak[1]), want_saved)
        << "peak " << peak[0] << " B without checkpointing, " << peak[1] << " B with; a forward "
        << "keeps " << kept[0] << " B / " << kept[1] << " B per micro-batch, " << in_flight
        << " in flight";
  }
}

TEST(Step3_Step, DpRowsAreThisReplicasShare) {
  const std::string rows = dp_rows_problem();
  EXPECT_TRUE(on_every_rank(rows.empty())) << (rows.empty() ? "another rank's dp_rows failed"
                                                             : rows);
}

TEST(Step3_Step, EqualsSingleDeviceOnEveryGrid) {
  const StepFn attendee = [](nn::GPT& m, lab10::Groups& g, const data::Batch& b) {
    return calling("lab10::step_3d", [&] { return lab10::step_3d(m, g, b, kMicro); });
  };
  for (const lab10::GridShape& shape : grids_for(world().size()))
    EXPECT_TRUE(step_matches(attendee, shape));
}

// Mixed precision (fp32 master and gradients, bf16 compute copy and activations): the same step
// on every grid, against the single device in bf16; the tp group's all-reduces carry bf16
// activations (half fp32's bytes; tp_bytes counts them in the model's compute dtype) and the dp
// group averages fp32 gradients.
TEST(Step3_Step, MixedPrecisionFollowsTheBf16SingleDevice) {
  const StepFn attendee = [](nn::GPT& m, lab10::Groups& g, const data::Batch& b) {
    return calling("lab10::step_3d", [&] { return lab10::step_3d(m, g, b, kMicro); });
  };
  for (const lab10::GridShape& shape : grids_for(world().size()))
    EXPECT_TRUE(step_matches(attendee, shape, false, kMixed));
}

// Your step with the stage's model on the simulated GPU (tests/support/on_sim.hpp) and the batch
// on the host, on every grid, fp32 and mixed bf16: the host's loss and gradients bit for bit (the
// same kernels and sums run there); a loop over a tensor's elements, or a tensor made or left on
// the host, stops with the tensor's or the op's own line, as it would on a GPU.
TEST(Step3_Step, RunsOnTheSimulatedGpuAsOnTheHost) {
  const data::Batch global = kLab.batch(0);
  std::vector<std::string> problems;
  for (const lab10::GridShape& shape : grids_for(world().size()))
    for (const nn::GPTOptions& host_options : {f64(), mixed()}) {
      const std::string what = fmt::format("{}, {}", name(shape),
                                           host_options.compute_dtype == DType::bf16 ? "bf16" : "f64");
      const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
      lab10::Groups g = lab10::groups_of(grid);
      nn::GPTOptions sim_options = host_options;
      sim_options.device = Device::sim();
      auto host = own_model(g, 1, false, host_options), sim = own_model(g, 1, false, sim_options);
      const double want = lab10::step_3d(*host, g, global, kMicro);
      labtest::collective_run_on_sim([&] {
        const double got = lab10::step_3d(*sim, g, global, kMicro);
        problems.push_back(labtest::step_same_on_sim(what + ": ", want, got, "the gradients",
                                                     host->params().grads(),
                                                     sim->params().grads()));
      });
    }
  const std::string all = labtest::joined(problems);
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
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

// ZeRO-2 and ZeRO-3 over dp on the grids with pp = 1 (Trainer3D: lab 09's trainers driving the
// 3D stage): two steps give the losses and parameters of the whole AdamW on the same grid, to the
// reduction order's rounding (reduce / reduce-scatter instead of all-reduce), with m and v for
// 1/dp of the stage. Also with checkpointing for ZeRO-2.
TEST(Step3_Step, Zero2And3OverDpEqualAdamW) {
  for (const lab10::GridShape& shape : grids_for(world().size())) {
    if (shape.dp == 1 || shape.pp != 1) continue;
    const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
    lab10::Groups g = lab10::groups_of(grid);
    for (const auto& [zero, ckpt] : {std::pair{2, false}, {2, true}, {3, false}}) {
      SCOPED_TRACE(fmt::format("{} ZeRO-{}{}", name(shape), zero, ckpt ? " checkpointed" : ""));
      // the test's own pieces (own_builder), not the attendee's step 2
      lab10::Trainer3D whole(config(), g, {shape, 1, 0, false}, f64(), {}, own_builder);
      lab10::Trainer3D sharded(config(), g, {shape, 1, zero, ckpt}, f64(), {}, own_builder);
      for (int s = 0; s < 2; ++s) {
        const double a = whole.step(kLab.batch(s));
        const double b = sharded.step(kLab.batch(s));
        EXPECT_NEAR(a, b, kRtol * std::abs(a)) << "step " << s;
        whole.optimizer_step(1e-2);
        sharded.optimizer_step(1e-2);
        EXPECT_TRUE(labtest::close_on_every_rank(sharded.parameters(), whole.parameters(), 1e-7,
                                                 1e-10)) << "step " << s;
      }
      const std::size_t shard =
          nn::shard_range(whole.model().num_parameters(), g.coord.dp, shape.dp).real();
      if (zero == 2) EXPECT_EQ(sharded.optimizer_state_bytes(), 2 * shard * sizeof(double));
      else EXPECT_LT(sharded.optimizer_state_bytes(), whole.optimizer_state_bytes());
    }
  }
}

// ---- planted faults -----------------------------------------------------------------------------

// A step written here: 1F1B over pp (lab 08; AFAB with `afab`), then `tie` and `reduce` as given.
StepFn planted(const std::function<void(nn::GPT&, lab10::Groups&)>& tie,
               const std::function<void(nn::GPT&, lab10::Groups&)>& reduce, bool afab = false) {
  return [tie, reduce, afab](nn::GPT& model, lab10::Groups& g, const data::Batch& global) {
    model.zero_grad();
    const int64_t b = global.batch_size() / g.shape.dp;
    const data::Batch mine = global.rows(g.coord.dp * b, (g.coord.dp + 1) * b);
    std::vector<data::Batch> micro;
    for (int i = 0; i < kMicro; ++i) micro.push_back(mine.rows(i * b / kMicro, (i + 1) * b / kMicro));
    const lab08::Schedule schedule = afab ? lab08::schedule_afab(g.shape.pp, kMicro, g.coord.pp)
                                          : lab08::schedule_1f1b(g.shape.pp, kMicro, g.coord.pp);
    double loss = lab08::run_schedule({&model}, schedule, micro, g.pp);
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
    if (shape.pp > 1 && shape.tp > 1) {
      const testing::AssertionResult r = step_matches(wrong, shape);
      EXPECT_FALSE(r);
      // the report leads with the first tensor the fault touches: the tied weight's gradient
      EXPECT_NE(std::string(r.message()).find("first divergence: wte.weight gradient, backward"),
                std::string::npos) << r.message();
    }
}

// AFAB in place of 1F1B: the same loss, gradients and bytes on every group; only the order on a
// stage differs (on the last stage: every forward before the first backward). The library's log
// must show it. On the first grid with a pipeline (one is enough: the check is per stage).
TEST(Step3_PlantedFault, AfabInPlaceOf1F1BIsCaught) {
  const auto afab = planted(tie_over_pp, average_over_dp, /*afab=*/true);
  for (const lab10::GridShape& shape : grids_for(world().size())) {
    if (shape.pp == 1) continue;
    const testing::AssertionResult r = step_matches(afab, shape);
    EXPECT_FALSE(r) << name(shape);
    EXPECT_NE(std::string(r.message()).find("not the 1F1B order"), std::string::npos)
        << name(shape) << ": failed for another reason: " << r.message();
    break;
  }
}

}  // namespace
