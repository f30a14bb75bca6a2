// Lab 03 graders. The heart of each step: the DDP result equals the single-device result for
// the same seed and global batch, computed here on every rank (tests/support/lab_fixture.hpp).
// Tolerances: parameters after a broadcast and batch rows are exact; gradients after an
// all-reduce 1e-5 relative / 1e-6 absolute (the all-reduce sums in another order); the loss
// 1e-6 relative; SGD parameters after several steps 1e-5 / 1e-6 (SGD keeps rounding differences
// as small as they start). Each planted fault (a deliberately wrong variant written here) must
// make the same check FAIL, so the checks demonstrably can fail.
#include <regex>
#include <utility>

#include <gtest/gtest.h>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/work.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/reference.hpp"
#include "ddp.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/lab_fixture.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"
#include "tests/support/traffic_budget.hpp"

using namespace scalelab;
using labtest::close_on_every_rank;
using labtest::world;

namespace {

constexpr labtest::Setup kLab{.seed = 1234, .global_batch = 8, .corpus_seed = 7};
constexpr uint64_t kSeed = kLab.seed;
constexpr int64_t kGlobalBatch = kLab.global_batch;  // splits over 1, 2 and 4 ranks
constexpr double kGradRtol = labtest::kAllReduceRtol, kGradAtol = labtest::kAllReduceAtol;

// The gradient DDP should produce: forward/backward this rank's rows, then `reduce`.
template <class Reduce>
Tensor ddp_gradient(const data::Batch& mine, Reduce reduce) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  model.zero_grad();
  model.forward(mine.x, mine.y);
  model.backward();
  reduce(model);
  return model.params().grads().clone();
}

// The check of Step2_LocalBatch.RowsOfThisRankAsAView, for any way `slice(global, r, world)`
// of taking rank r's rows: for 1, 2, 4 and 8 ranks, every rank's rows are [r*b, (r+1)*b) of the
// global batch (exact), as a view.
template <class Slice>
testing::AssertionResult rows_of_every_rank(Slice slice) {
  const data::Batch global = kLab.batch(0);
  for (int world_size : {1, 2, 4, 8}) {
    const int64_t b = kGlobalBatch / world_size;
    for (int r = 0; r < world_size; ++r) {
      const data::Batch mine = slice(global, r, world_size);
      const std::string who = fmt::format("rank {} of {}", r, world_size);
      if (mine.batch_size() != b)
        return testing::AssertionFailure() << who << ": " << mine.batch_size() << " rows, want " << b;
      if (!mine.x.shares_storage_with(global.x) || !mine.y.shares_storage_with(global.y))
        return testing::AssertionFailure()
               << who << ": " << (mine.x.shares_storage_with(global.x) ? "y" : "x")
               << " is a copy: both x and y are views of the global batch's rows (rows())";
      if (mine.x.to_vector() != global.x.rows(r * b, (r + 1) * b).to_vector() ||
          mine.y.to_vector() != global.y.rows(r * b, (r + 1) * b).to_vector())
        return testing::AssertionFailure() << who << ": not rows [" << r * b << ", "
                                           << (r + 1) * b << ") of the global batch";
    }
  }
  return testing::AssertionSuccess();
}

// The gradient a rank's backward produced BEFORE any all-reduce, as seen from the model's
// backward hook (it fires as each part's gradients become final; the last firing is the
// embedding, after which the flat buffer holds this rank's whole local gradient). `step` runs one
// training step on `model` and the global batch (the attendee's forward_backward, or a planted
// variant); the check passes when that local gradient is the gradient of THIS rank's rows
// [r*b, (r+1)*b) alone: the data was split. Running every rank on the whole global batch gives
// the same averaged gradient (so the other checks pass), but its local gradient is the global
// one. Tolerance 1e-6 relative / 1e-7 absolute: the same kernels on the same rows (exact on the
// CPU; room for another device). Collective; the same verdict on every rank.
template <class Step>
testing::AssertionResult backward_saw_only_this_ranks_rows(Step step) {
  const data::Batch global = kLab.batch(0);
  nn::GPT model(kLab.config(), {.seed = kSeed});
  Tensor local;  // the gradient buffer at the hook's last firing
  model.set_backward_hook(
      [&](const std::vector<nn::Parameter*>&) { local = model.params().grads().clone(); });
  step(model, global);
  model.set_backward_hook({});
  if (!local.defined())  // no backward ran on this model
    local = Tensor::zeros(model.params().grads().shape(), model.params().grads().dtype());
  const Tensor mine = ddp_gradient(labtest::my_rows(global), [](nn::GPT&) {});  // no reduce
  testing::AssertionResult r = close_on_every_rank(local, mine, 1e-6, 1e-7);
  if (!r) {
    // got/want along this rank's own gradient: 1 for other rows, 1/n for a pre-scaled backward
    double dot = 0, norm = 0;
    const std::vector<double> g = local.to_vector(), w = mine.to_vector();
    for (std::size_t i = 0; i < g.size(); ++i) dot += g[i] * w[i], norm += w[i] * w[i];
    r << "\n(the gradient your backward produced, before the all-reduce, is not the gradient of "
         "this rank's rows alone: forward and backward local_batch(global, rank, world), not "
         "the whole global batch; or the local gradient is scaled: got/want = "
      << fmt::format("{:.4g}", norm > 0 ? dot / norm : 0.0) << " here, 1/n = "
      << fmt::format("{:.4g}", 1.0 / world().size())
      << ": backward unscaled, then step 3's all_reduce_gradients averages)";
  }
  return r;
}

// True when `moved` is one all-reduce of the whole gradient (`grad_bytes`) on world(), a sum
// (then divided) or an average, plus, when `with_loss`, one sum all-reduce of the loss (one
// number, f32 or f64: train::global_loss), and nothing else on any communicator.
bool one_gradient_all_reduce(const comm::Traffic& moved, int64_t grad_bytes, bool with_loss) {
  std::vector<labtest::TrafficBudget> ok;
  for (int64_t loss_bytes : with_loss ? std::vector<int64_t>{4, 8} : std::vector<int64_t>{0}) {
    const int loss_calls = with_loss ? 1 : 0;
    ok.push_back(labtest::TrafficBudget{}.all_reduce(world(), 1 + loss_calls,
                                                     grad_bytes + loss_bytes));
    labtest::TrafficBudget avg;
    avg.all_reduce(world(), 1, grad_bytes, comm::ReduceOp::avg);
    if (with_loss) avg.all_reduce(world(), 1, loss_bytes);
    ok.push_back(avg);
  }
  for (const labtest::TrafficBudget& b : ok)
    if (labtest::exact_traffic(moved, b)) return true;
  return false;
}

// A correct average, written here so steps 2 and 3 are graded on their own.
void test_average(nn::GPT& model) {
  world().all_reduce(model.params().grads(), comm::ReduceOp::avg);
}

}  // namespace

// ---- Step 1: broadcast ---------------------------------------------------------------------

TEST(Step1_Broadcast, EveryRankHoldsRank0sParameters) {
  nn::GPT model(kLab.config(), {.seed = kSeed + world().rank()});  // different on every rank
  lab03::broadcast_parameters(model, world());
  nn::GPT single(kLab.config(), {.seed = kSeed});  // rank 0's seed
  // exact: a broadcast copies bytes
  testing::AssertionResult same =
      close_on_every_rank(model.params().values(), single.params().values(), 0, 0);
  if (!same) {
    // Whose parameters a wrong rank holds says what went wrong: its own (no broadcast reached
    // it, or it was not waited for) or another rank's (the wrong root).
    const std::vector<double> mine = model.params().values().to_vector();
    for (int r = 0; r < world().size(); ++r) {
      if (r == 0) continue;
      nn::GPT seeded(kLab.config(), {.seed = kSeed + r});
      if (mine == seeded.params().values().to_vector())
        same << (r == world().rank()
                     ? fmt::format("\n(rank {} still holds its own initial parameters: no "
                                   "broadcast reached it, or it was not waited for)", r)
                     : fmt::format("\n(rank {} holds rank {}'s initial parameters: the "
                                   "broadcast's root is rank 0)", world().rank(), r));
    }
  }
  EXPECT_TRUE(same) << "every rank's parameters after broadcast_parameters, against rank 0's "
                       "initial ones";
}

TEST(Step1_Broadcast, OneBroadcastOfTheFlatValuesFromRank0) {
  nn::GPT model(kLab.config(), {.seed = kSeed + world().rank()});
  const comm::Traffic moved =
      labtest::traffic_of([&] { lab03::broadcast_parameters(model, world()); });
  const int64_t bytes = static_cast<int64_t>(model.params().values().nbytes());
  const labtest::TrafficBudget one = labtest::TrafficBudget{}.broadcast(world(), 0, 1, bytes);
  EXPECT_TRUE(labtest::exact_traffic(moved, one))
      << "broadcast_parameters sent: " << labtest::traffic_str(moved) << "; the step sends ONE "
      << "broadcast of the flat parameter buffer (" << bytes << " bytes) from rank 0, not one "
      << "per tensor";
}

TEST(Step1_Broadcast, GradientsAreLeftAlone) {
  nn::GPT model(kLab.config(), {.seed = kSeed + world().rank()});
  ops::fill(model.params().grads(), 1.0 + world().rank());
  lab03::broadcast_parameters(model, world());
  for (double g : model.params().grads().to_vector())
    ASSERT_EQ(g, 1.0 + world().rank()) << "broadcast_parameters must not touch the gradients";
}

TEST(Step1_PlantedFault, NoBroadcastIsCaught) {
  if (world().size() == 1) GTEST_SKIP() << "one rank: there is nothing to broadcast";
  nn::GPT model(kLab.config(), {.seed = kSeed + world().rank()});
  // fault: no broadcast_parameters(model, world())
  nn::GPT single(kLab.config(), {.seed = kSeed});
  EXPECT_FALSE(close_on_every_rank(model.params().values(), single.params().values(), 0, 0))
      << "the check of Step1_Broadcast must fail when the broadcast is missing";
}

// ---- Step 2: this rank's rows ----------------------------------------------------------------

TEST(Step2_LocalBatch, RowsOfThisRankAsAView) {
  const auto local_batch = [](const data::Batch& global, int r, int world_size) {
    return lab03::local_batch(global, r, world_size);
  };
  EXPECT_TRUE(rows_of_every_rank(local_batch));
}

TEST(Step2_PlantedFault, WrongRowsAreCaught) {
  // fault: rank r takes the rows of rank r + 1 (every row is used once, but by the wrong rank)
  const auto next_ranks_rows = [](const data::Batch& global, int r, int world_size) {
    return labtest::rank_rows(global, (r + 1) % world_size, world_size);
  };
  EXPECT_FALSE(rows_of_every_rank(next_ranks_rows))
      << "the check of Step2_LocalBatch must fail when a rank takes another rank's rows";
}

TEST(Step2_PlantedFault, CopyInsteadOfViewIsCaught) {
  // fault: the right rows, copied
  const auto copied_rows = [](const data::Batch& global, int r, int world_size) {
    const data::Batch rows = labtest::rank_rows(global, r, world_size);
    return data::Batch{rows.x.clone(), rows.y.clone()};
  };
  EXPECT_FALSE(rows_of_every_rank(copied_rows))
      << "the check of Step2_LocalBatch must fail when the rows are a copy";
}

TEST(Step2_LocalBatch, BadSplitsAreUsageErrors) {
  const data::Batch global = kLab.sampler().batch(0);  // 8 rows
  EXPECT_THROW(lab03::local_batch(global, 0, 16), UsageError) << "more ranks than rows";
  EXPECT_THROW(lab03::local_batch(global, 1, 3), UsageError) << "8 rows over 3 ranks";
  // The message names both numbers, each as a number of its own ("8", not the 8 of "18")
  const auto names = [](const std::string& what, int64_t n) {
    return std::regex_search(what, std::regex("(^|[^0-9])" + std::to_string(n) + "($|[^0-9])"));
  };
  for (const auto& [rank, ranks] : {std::pair{0, 16}, std::pair{1, 3}}) {
    try {
      lab03::local_batch(global, rank, ranks);
    } catch (const UsageError& e) {
      const std::string what = e.what();
      if (!names(what, ranks) || !names(what, kGlobalBatch))
        LABTEST_FAIL() << "local_batch(8 rows, rank " << rank << ", " << ranks << " ranks) said \""
                       << what << "\": name the world size (" << ranks << ") and the batch size ("
                       << kGlobalBatch << ") in the message";
    }
  }
}

TEST(Step2_LocalBatch, AveragedGradientsEqualSingleDevice) {
  const data::Batch global = kLab.sampler().batch(0);
  const Tensor got =
      ddp_gradient(lab03::local_batch(global, world().rank(), world().size()), test_average);
  const train::Reference ref = kLab.reference(global);
  EXPECT_TRUE(close_on_every_rank(got, ref.grads, kGradRtol, kGradAtol));
}

TEST(Step2_PlantedFault, SameDataOnEveryRankIsCaught) {
  if (world().size() == 1) GTEST_SKIP() << "one rank: its rows are the whole batch";
  const data::Batch global = kLab.sampler().batch(0);
  const int64_t b = kGlobalBatch / world().size();
  const Tensor got = ddp_gradient(global.rows(0, b), test_average);  // fault: rank 0's rows
  const train::Reference ref = kLab.reference(global);
  EXPECT_FALSE(close_on_every_rank(got, ref.grads, kGradRtol, kGradAtol))
      << "the check of Step2_LocalBatch must fail when every rank trains on the same rows";
}

// ---- Step 3: average the gradients ------------------------------------------------------------

TEST(Step3_AllReduce, GradientsEqualSingleDevice) {
  const data::Batch global = kLab.sampler().batch(0);
  nn::GPT model(kLab.config(), {.seed = kSeed});
  // a failure names the first tensor off the twin (this rank's rows [r b, (r + 1) b))
  labtest::Explain why(model, {.seed = kSeed},
                       {.first_row = world().rank() * (kGlobalBatch / world().size())});
  const data::Batch mine = labtest::my_rows(global);
  model.zero_grad();
  model.forward(mine.x, mine.y);
  model.backward();
  lab03::all_reduce_gradients(model, world());
  why.step_done(global);
  const train::Reference ref = kLab.reference(global);
  EXPECT_TRUE(close_on_every_rank(model.params().grads(), ref.grads, kGradRtol, kGradAtol, why));
}

TEST(Step3_AllReduce, OneAllReduceOfTheWholeGradient) {
  const data::Batch global = kLab.sampler().batch(0);
  comm::Traffic moved;
  int64_t bytes = 0;
  ddp_gradient(labtest::my_rows(global), [&](nn::GPT& m) {
    bytes = static_cast<int64_t>(m.params().grads().nbytes());
    moved = labtest::traffic_of([&] { lab03::all_reduce_gradients(m, world()); });
  });
  EXPECT_TRUE(one_gradient_all_reduce(moved, bytes, false))
      << "all_reduce_gradients sent: " << labtest::traffic_str(moved) << "; the step makes ONE "
      << "all-reduce of the flat gradient buffer (" << bytes << " bytes) for the whole model, "
      << "not one per tensor";
}

TEST(Step3_AllReduce, EveryRankHoldsTheSameGradient) {
  const data::Batch global = kLab.sampler().batch(1);
  const Tensor got = ddp_gradient(labtest::my_rows(global), [](nn::GPT& m) {
    lab03::all_reduce_gradients(m, world());
  });
  EXPECT_EQ(train::max_divergence_from_rank0(got, world()), 0.0);
}

TEST(Step3_PlantedFault, SumWithoutAverageIsCaught) {
  if (world().size() == 1) GTEST_SKIP() << "one rank: the sum is the average";
  const data::Batch global = kLab.sampler().batch(0);
  const Tensor got = ddp_gradient(labtest::my_rows(global), [](nn::GPT& m) {
    world().all_reduce(m.params().grads(), comm::ReduceOp::sum);  // fault: no division
  });
  const train::Reference ref = kLab.reference(global);
  EXPECT_FALSE(close_on_every_rank(got, ref.grads, kGradRtol, kGradAtol))
      << "the check of Step3_AllReduce must fail for a sum without the average";
}

// Step 3 on the simulated GPU (--device sim, tests/support/on_sim.hpp): the same rows' gradients
// on a model there, averaged by all_reduce_gradients, are the host's bit for bit; a loop through
// data<T>() over the gradients stops with the tensor's own line, as it would on a GPU.
TEST(Step3_AllReduce, RunsOnTheSimulatedGpuAsOnTheHost) {
  const data::Batch mine = labtest::my_rows(kLab.sampler().batch(0));
  const Tensor want = ddp_gradient(mine, [](nn::GPT& m) { lab03::all_reduce_gradients(m, world()); });
  nn::GPT sim(kLab.config(), {.device = Device::sim(), .seed = kSeed});
  std::string same;
  HostDeviceCopies moved;
  labtest::collective_run_on_sim([&] {
    const data::Batch on = mine.to(sim.device());
    sim.zero_grad();
    sim.forward(on.x, on.y);
    sim.backward();
    moved = labtest::copies_of([&] { lab03::all_reduce_gradients(sim, world()); });
    same = labtest::same_on_sim("the averaged gradients", want, sim.params().grads());
  });
  if (!same.empty()) LABTEST_FAIL() << same;
  const std::string copied =
      labtest::copies_problem("all_reduce_gradients", moved, sim.params().grads().nbytes());
  if (!copied.empty()) LABTEST_FAIL() << copied;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

// ---- Step 4: the training step -----------------------------------------------------------------

TEST(Step4_Training, OneStepEqualsSingleDevice) {
  const data::Batch global = kLab.sampler().batch(0);
  nn::GPT model(kLab.config(), {.seed = kSeed});  // same start everywhere: step 4 graded alone
  // a failure names the first tensor off the twin (this rank's rows [r b, (r + 1) b))
  labtest::Explain why(model, {.seed = kSeed},
                       {.first_row = world().rank() * (kGlobalBatch / world().size())});
  const double loss = lab03::forward_backward(model, global, world());
  why.step_done(global);
  const train::Reference ref = kLab.reference(global);
  EXPECT_NEAR(loss, ref.loss, 1e-6 * std::abs(ref.loss)) << "the loss of the GLOBAL batch";
  EXPECT_TRUE(close_on_every_rank(model.params().grads(), ref.grads, kGradRtol, kGradAtol, why));
}

TEST(Step4_Training, GradientsAreZeroedEachStep) {
  const data::Batch global = kLab.sampler().batch(0);
  nn::GPT model(kLab.config(), {.seed = kSeed});
  ops::fill(model.params().grads(), 5.0);  // stale gradients from an earlier step
  lab03::forward_backward(model, global, world());
  const train::Reference ref = kLab.reference(global);
  EXPECT_TRUE(close_on_every_rank(model.params().grads(), ref.grads, kGradRtol, kGradAtol));
}

TEST(Step4_Training, SgdStepsFollowSingleDeviceAndReplicasStayIdentical) {
  constexpr int kSteps = 5;
  constexpr double kLr = 0.5;
  const data::Sampler s = kLab.sampler();
  nn::GPT model(kLab.config(), {.seed = kSeed});  // same start everywhere: step 4 graded alone
  optim::SGD sgd(optim::groups(model.parameters()));
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    losses.push_back(lab03::forward_backward(model, s.batch(step), world()));
    sgd.step(kLr);
  }
  const train::SgdRun ref = train::single_device_sgd(kLab.config(), kSeed, s, kSteps, kLr);
  for (int step = 0; step < kSteps; ++step)
    EXPECT_NEAR(losses[step], ref.losses[step], 1e-5 * std::abs(ref.losses[step])) << "step " << step;
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "the run should learn something";
  EXPECT_TRUE(close_on_every_rank(model.params().values(), ref.params, kGradRtol, kGradAtol));
  EXPECT_EQ(lab03::parameter_divergence(model, world()), 0.0) << "replicas must be identical";
}

TEST(Step4_Training, EachRankRunsTheModelOnItsOwnRowsOnly) {
  EXPECT_TRUE(backward_saw_only_this_ranks_rows([](nn::GPT& model, const data::Batch& global) {
    lab03::forward_backward(model, global, world());
  }));
}

TEST(Step4_Training, OneAllReduceOfTheGradientAndNoBroadcast) {
  const data::Batch global = kLab.sampler().batch(0);
  nn::GPT model(kLab.config(), {.seed = kSeed});
  const int64_t bytes = static_cast<int64_t>(model.params().grads().nbytes());
  const comm::Traffic moved =
      labtest::traffic_of([&] { lab03::forward_backward(model, global, world()); });
  EXPECT_TRUE(one_gradient_all_reduce(moved, bytes, true))
      << "forward_backward sent: " << labtest::traffic_str(moved) << "; a step sends ONE "
      << "all-reduce of the flat gradient buffer (" << bytes << " bytes) and one of the loss "
      << "(train::global_loss), and no broadcast: the replicas start equal (step 1) and stay so";
}

// The matmul FLOPs and LayerNorm rows of one forward_backward (ops::work_stats) equal those of
// one forward and backward of this rank's b rows, measured here on a twin: a rank that also runs
// the whole global batch (e.g. a second forward for the loss) does n x the forward's work.
TEST(Step4_Training, WorkIsOneForwardAndBackwardOfThisRanksRows) {
  const data::Batch global = kLab.sampler().batch(0);
  nn::GPT model(kLab.config(), {.seed = kSeed});
  const ops::WorkCount before = ops::work_stats();
  lab03::forward_backward(model, global, world());
  const ops::WorkCount did = ops::work_stats() - before;
  const ops::WorkCount twin_before = ops::work_stats();
  ddp_gradient(labtest::my_rows(global), [](nn::GPT&) {});
  const ops::WorkCount want = ops::work_stats() - twin_before;
  EXPECT_TRUE(did == want)
      << "forward_backward did " << did.matmul_flops << " matmul FLOPs and "
      << did.layernorm_rows << " LayerNorm rows; one forward and backward of this rank's "
      << labtest::my_rows(global).batch_size() << " rows does " << want.matmul_flops << " and "
      << want.layernorm_rows << ": run the model on local_batch(global, rank, world) only. The "
      << "global batch's loss is the average over ranks of the local losses (train::global_loss)";
}

TEST(Step4_PlantedFault, WholeBatchOnEveryRankIsCaught) {
  if (world().size() == 1) GTEST_SKIP() << "one rank: its rows are the whole batch";
  // fault: every rank runs forward/backward on the WHOLE global batch, then averages. The
  // averaged gradient (and so every other check of step 4) is right; the work is not split.
  const auto whole_batch = [](nn::GPT& model, const data::Batch& global) {
    model.zero_grad();
    model.forward(global.x, global.y);
    model.backward();
    test_average(model);
  };
  EXPECT_FALSE(backward_saw_only_this_ranks_rows(whole_batch))
      << "the check of Step4_Training.EachRankRunsTheModelOnItsOwnRowsOnly must fail when every "
         "rank runs the whole global batch";
}

TEST(Step4_Training, DivergenceSeesOneDifferentRank) {
  nn::GPT model(kLab.config(), {.seed = kSeed});
  EXPECT_EQ(lab03::parameter_divergence(model, world()), 0.0);
  if (world().size() == 1) return;
  // one element in the first tensor (wte), one in the middle, the last one: one at a time
  const int64_t n = model.params().values().numel();
  for (int64_t at : {int64_t{3}, n / 2, n - 1}) {
    Tensor v = model.params().values().flat(at, 1);
    const double was = v.item();
    if (world().rank() == world().size() - 1) ops::fill(v, was + 0.25);
    EXPECT_NEAR(lab03::parameter_divergence(model, world()), 0.25, 1e-6)
        << "the same value on every rank, from the last rank's changed parameter: element " << at
        << " of the " << n << " flat values (compare all of model.params().values())";
    ops::fill(v, was);
  }
}

// The step's one read to the host is the global loss, after the backward. Read before it (the
// local loss's value() all-reduced as a double, say), a GPU's host waits for the forward to
// finish before it can queue the backward. Counted on the CPU as on a GPU (host_reads()).
TEST(Step4_Training, ReadsTheLossOnceAfterTheBackward) {
  const data::Batch global = kLab.sampler().batch(0);
  nn::GPT model(kLab.config(), {.seed = kSeed});
  int64_t at_backward = -1;  // host_reads() when the backward's first gradients are final
  model.set_backward_hook([&](const std::vector<nn::Parameter*>&) {
    if (at_backward < 0) at_backward = host_reads();
  });
  const int64_t before = host_reads();
  lab03::forward_backward(model, global, world());
  const int64_t reads = host_reads() - before;
  model.set_backward_hook({});
  ASSERT_GE(at_backward, 0) << "forward_backward ran no backward on the model";
  if (at_backward > before)
    LABTEST_FAIL() << "forward_backward read " << at_backward - before << " number(s) to the "
                   << "host before the backward began (the loss, mid-step?): on a GPU the host "
                   << "then waits for the forward before it can queue the backward. Keep the "
                   << "loss a Scalar on the device (train::global_loss takes one) and read it "
                   << "once, at the end";
  else if (reads != 1)
    LABTEST_FAIL() << "forward_backward read " << reads << " numbers to the host; the step's "
                   << "one read is the global loss it returns";
}

// Step 4 on the simulated GPU: the model there, the global batch drawn on the host as the program
// draws it. The loss and the gradients are the host's bit for bit; this rank's rows left on the
// host (an op given host and sim tensors) stop with the op's line, as they would on a GPU.
TEST(Step4_Training, RunsOnTheSimulatedGpuAsOnTheHost) {
  const data::Batch global = kLab.sampler().batch(0);
  nn::GPT host(kLab.config(), {.seed = kSeed});
  nn::GPT sim(kLab.config(), {.device = Device::sim(), .seed = kSeed});
  const double want = lab03::forward_backward(host, global, world());
  std::vector<std::string> problems;
  HostDeviceCopies moved;
  double got = 0;
  labtest::collective_run_on_sim([&] {
    moved = labtest::copies_of([&] { got = lab03::forward_backward(sim, global, world()); });
    problems.push_back(labtest::step_same_on_sim("", want, got, "the gradients",
                                                 host.params().grads(), sim.params().grads()));
  });
  // To the device: this rank's rows (x and y), not the global batch; to the host: the loss.
  const data::Batch mine = labtest::my_rows(global);
  const int64_t rows_bytes = static_cast<int64_t>(mine.x.nbytes() + mine.y.nbytes());
  const bool same_numbers = labtest::joined(problems).empty();
  if (same_numbers && moved.to_device != rows_bytes)
    problems.push_back(fmt::format(
        "forward_backward copied {} bytes to the device; this rank's rows are {} (x and y; the "
        "global batch {}): move local_batch's rows, and only them", moved.to_device, rows_bytes,
        global.x.nbytes() + global.y.nbytes()));
  if (same_numbers && moved.to_host > 8)
    problems.push_back(fmt::format(
        "forward_backward copied {} bytes to the host: only the loss (one number, 8 bytes) "
        "goes there", moved.to_host));
  const std::string all = labtest::joined(problems);
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}
