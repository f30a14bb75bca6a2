// Lab 09 step 2: ZeRO-1. The heart: five AdamW steps BITWISE equal to lab 03's DDP (the same
// all-reduce, the same elementwise AdamW update of every element by its owner, exact copies
// back), replicas bitwise identical. What each rank holds: AdamW's m and v for its shard only
// (state size), read from the optimizer and from the allocator; what it sends: one all_reduce
// of the gradients and one all_gather of the parameters (byte counters). Planted faults: an
// AdamW over the whole buffer on every rank (right numbers, no saving: the state check fails) and
// a step without the all-gather (the replicas diverge). Then, last, the same stage in bf16
// (zero_checks.hpp, "Mixed precision"): the bf16 DDP step, the compute copy recast; planted: no
// recast.
#include <gtest/gtest.h>

#include "common/optim/optim.hpp"
#include "common/train/equivalence.hpp"
#include "ddp.hpp"
#include "tests/09_zero/zero_checks.hpp"

using namespace scalelab;
using namespace scalelab::lab09test;
using labtest::world;

namespace {

// AdamW state of a stage-1+ rank: m and v for the real elements of its shard, nothing more.
testing::AssertionResult state_is_the_shard(std::size_t state_bytes, const nn::ShardRange& s,
                                            DType dtype) {
  const std::size_t want = static_cast<std::size_t>(s.real()) * 2 * dtype_size(dtype);
  if (state_bytes == want) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "AdamW holds " << state_bytes << " bytes of state; m and v "
                                     << "for this rank's " << s.real() << " elements are " << want;
}

// Stage 1 keeps full parameters and gradients (padded) and 1/n of the state: the allocator must
// agree, with one shard of slack for a staging buffer an implementation may keep.
testing::AssertionResult holds_stage1_bytes(const Footprint& f, int64_t padded, const nn::ShardRange& s) {
  const std::size_t want = static_cast<std::size_t>(2 * padded + 2 * s.real()) * 4;
  const std::size_t slack = static_cast<std::size_t>(s.size) * 4;
  if (f.held <= want + slack) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "holds " << f.held << " bytes between steps; stage 1 "
                                     << "needs " << want << " (+ " << slack << " slack)";
}

// Parameters equal to the DDP run's and identical on every rank.
testing::AssertionResult same_as_ddp(const Tensor& got, const Tensor& want) {
  auto r = labtest::close_on_every_rank(got, want, 0, 0);
  if (!r) return r;
  const double d = train::max_divergence_from_rank0(got, world());
  if (d != 0) return testing::AssertionFailure() << "replicas differ by " << d;
  return testing::AssertionSuccess();
}

}  // namespace

TEST(Step2_Zero1, OptimizerStateIsThisRanksShardOnly) {
  lab09::Zero1 z(kLab.config(), f32(), world());
  const nn::ParameterSet& ps = z.model().params();
  const nn::ShardRange want = nn::shard_range(ps.numel(), world().rank(), world().size());
  EXPECT_EQ(z.shard().lo, want.lo);
  EXPECT_EQ(z.shard().hi, want.hi);
  EXPECT_EQ(ps.padded_numel() % world().size(), 0) << "the layout is padded to n";
  EXPECT_TRUE(state_is_the_shard(z.optimizer().state_bytes(), z.shard(), DType::f32));
}

TEST(Step2_Zero1, TheAllocatorSeesTheSaving) {
  const Footprint f = footprint(1);
  nn::GPTOptions o = f32();
  o.storage.pad_to = world().size();
  nn::GPT m(kLab.config(), o);
  const nn::ShardRange s = nn::shard_range(m.num_parameters(), world().rank(), world().size());
  EXPECT_TRUE(holds_stage1_bytes(f, m.params().padded_numel(), s));
}

// Issue 25, class 8: the numbers, the memory and the traffic of ONE Zero1, built here.
TEST(Step2_Zero1, OneTrainerGivesTheNumbersTheMemoryAndTheTraffic) {
  const Observed o = observe_one(1, [](lab09::Trainer&) {});
  lab09::Ddp ddp(kLab.config(), f32(), world());
  const std::vector<double> want = run_steps(ddp, 2);
  for (std::size_t s = 0; s < want.size(); ++s) EXPECT_EQ(o.losses[s], want[s]) << "loss of step " << s;
  EXPECT_TRUE(same_as_ddp(o.parameters, ddp.full_parameters()));
  nn::GPTOptions opts = f32();
  opts.storage.pad_to = world().size();
  nn::GPT m(kLab.config(), opts);
  const nn::ShardRange s = nn::shard_range(m.num_parameters(), world().rank(), world().size());
  EXPECT_TRUE(holds_stage1_bytes(o.footprint, m.params().padded_numel(), s));
  EXPECT_TRUE(exact_traffic(o.first_step, zero_budget(1, m)));
}

TEST(Step2_Zero1, FiveAdamWStepsBitwiseEqualToDdp) {
  // Tolerance: none. Both all-reduce the same flat gradients; AdamW updates each element alone.
  lab09::Ddp ddp(kLab.config(), f32(), world());
  lab09::Zero1 z(kLab.config(), f32(), world());
  const std::vector<double> want = run_steps(ddp, 5), got = run_steps(z, 5);
  for (std::size_t s = 0; s < want.size(); ++s) EXPECT_EQ(got[s], want[s]) << "loss of step " << s;
  EXPECT_TRUE(same_as_ddp(z.full_parameters(), ddp.full_parameters()));
  // and the first loss is the single-device one (lab 03's tolerance for an all-reduced mean)
  EXPECT_NEAR(got[0], kLab.reference(kLab.batch(0)).loss, 1e-6 * std::abs(got[0]));
}

// The padding (odd_model(): no size a multiple of 2 or 4): the same bitwise DDP step where the
// last shard is partly padding. On kLab's model every check above passes a gather into values()
// instead of padded_values(): there the two are the same size at n = 1, 2 and 4.
TEST(Step2_Zero1, APaddedLayoutStepsBitwiseLikeDdp) {
  lab09::Ddp ddp(odd_model(), f32(), world());
  lab09::Zero1 z(odd_model(), f32(), world());
  const nn::ParameterSet& ps = z.model().params();
  if (world().size() > 1)
    ASSERT_GT(ps.padded_numel(), ps.numel()) << "the test model must need padding at this n";
  const std::vector<double> want = run_steps(ddp, 3), got = run_steps(z, 3);
  for (std::size_t s = 0; s < want.size(); ++s) EXPECT_EQ(got[s], want[s]) << "loss of step " << s;
  EXPECT_TRUE(same_as_ddp(z.full_parameters(), ddp.full_parameters()))
      << "a layout of " << ps.numel() << " elements padded to " << ps.padded_numel();
}

TEST(Step2_Zero1, OneAllReduceOfTheGradientsAndOneAllGatherOfTheParameters) {
  lab09::Zero1 z(kLab.config(), f32(), world());
  const comm::Traffic t = one_step_ledger(z);
  const comm::CommStats s = by_kind(t);
  const int64_t numel = z.model().num_parameters(), padded = z.model().params().padded_numel();
  EXPECT_EQ(bytes_of(s, "all_reduce"), numel * 4 + 8) << "the gradients (fp32) and the loss (f64)";
  EXPECT_EQ(bytes_of(s, "all_gather"), padded * 4) << "the parameters, once";
  EXPECT_EQ(comm::comm_total(s, "", "all_gather").calls, 1);
  EXPECT_TRUE(exact_traffic(t, zero_budget(1, z.model())));
}

// ---- The two pieces alone (step 2a, 2b): lab 10's ZeRO calls them, not Zero1 -----------------

namespace {

// Where a view starts in its storage's layout, in elements of `base` (a view at element 0).
int64_t element_of(const Tensor& view, const Tensor& base) {
  return (static_cast<const char*>(view.data_ptr()) - static_cast<const char*>(base.data_ptr())) /
         static_cast<int64_t>(dtype_size(view.dtype()));
}

// "" when `got` (shard_groups' groups for shard s, gradients from `grads`) covers the shard's
// real elements once each, in the model's own values, each element's gradient at its index of
// `grads` (element s.lo at 0), weight decay and the compute copy as the library's groups say.
std::string groups_problem(const std::vector<optim::Group>& got, nn::ParameterSet& ps,
                           const nn::ShardRange& s, const Tensor& grads) {
  const Tensor& values = ps.padded_values();
  const std::vector<optim::Group> lib =
      optim::groups_in_range(ps, s.lo, s.hi, values.flat(s.lo, s.real()), grads);
  std::vector<int> decay(s.real(), -1), times(s.real(), 0);
  bool copies = false;
  for (const optim::Group& g : lib) {
    copies = copies || g.compute.defined();
    const int64_t at = element_of(g.value, values) - s.lo;
    for (int64_t i = 0; i < g.value.numel(); ++i) decay[at + i] = g.weight_decay;
  }
  for (const optim::Group& g : got) {
    if (!g.value.shares_storage_with(values))
      return "a group's value is not a view of the model's own values (padded_values()): AdamW "
             "would update a copy, never the model";
    if (!g.grad.shares_storage_with(grads))
      return "a group's grad is not a view of shard_grads: stage 2 hands each rank its own "
             "gradient shard there, not the flat gradient buffer";
    if (g.grad.numel() != g.value.numel())
      return fmt::format("a group of {} values with {} gradients", g.value.numel(), g.grad.numel());
    const int64_t at = element_of(g.value, values), n = g.value.numel();
    if (at < s.lo || at + n > s.hi)
      return fmt::format("a group holds elements [{}, {}) of the layout, outside the shard's real "
                         "elements [{}, {})", at, at + n, s.lo, s.hi);
    if (element_of(g.grad, grads) != at - s.lo)
      return fmt::format("the gradient of element {} is read at index {} of shard_grads; element "
                         "s.lo ({}) is index 0 there, so it is {}", at, element_of(g.grad, grads),
                         s.lo, at - s.lo);
    if (copies && !g.compute.defined())
      return "in mixed precision a group without its parameter's bf16 compute copy "
             "(Group::compute): the layers would read stale weights";
    for (int64_t i = 0; i < n; ++i) {
      ++times[at - s.lo + i];
      if (decay[at - s.lo + i] != static_cast<int>(g.weight_decay))
        return fmt::format("element {}: weight decay {}, its parameter says {}", at + i,
                           g.weight_decay ? "on" : "off", decay[at - s.lo + i] ? "on" : "off");
    }
  }
  for (int64_t e = 0; e < s.real(); ++e)
    if (times[e] != 1)
      return fmt::format("element {} of the layout is in {} groups (once: AdamW steps it once)",
                         s.lo + e, times[e]);
  return "";
}

}  // namespace

// Step 2a alone, on each shard of 4 of a layout that needs padding: the groups cover the shard's
// real elements once each, in the model's own values, with the gradients of a buffer of the
// shard's own (as stage 2 hands it; in stage 1 it is a slice of the flat gradients, the same
// offsets), fp32 and mixed bf16.
TEST(Step2_Pieces, ShardGroupsCoverTheShardsRealElementsOnce) {
  constexpr int n = 4;
  for (const bool bf16 : {false, true}) {
    nn::GPTOptions o = bf16 ? mixed_bf16() : f32();
    o.storage.pad_to = n;
    nn::GPT model(odd_model(), o);
    nn::ParameterSet& ps = model.params();
    for (int r = 0; r < n; ++r) {
      const nn::ShardRange s = nn::shard_range(ps.numel(), r, n);
      const Tensor grads = Tensor::zeros({s.size}, DType::f32);
      const std::vector<optim::Group> got =
          calling("shard_groups", [&] { return lab09::shard_groups(ps, s, grads); });
      const std::string problem = groups_problem(got, ps, s, grads);
      if (!problem.empty())
        LABTEST_FAIL() << "shard_groups of shard " << r << " of " << n << " (real elements ["
                       << s.lo << ", " << s.hi << ") of " << ps.numel()
                       << (bf16 ? "), mixed bf16: " : "), fp32: ") << problem;
    }
  }
}

// Step 2b alone: every rank "stepped" its own shard (the rest of its layout stale, different on
// every rank); after all_gather_parameters every rank holds every owner's shard, padding
// included, in ONE all-gather of the padded layout and nothing else; in mixed precision the
// bf16 copy is the cast of the gathered masters.
TEST(Step2_Pieces, AllGatherParametersSpreadsEachShardInOneGather) {
  const int n = world().size(), rank = world().rank();
  for (const bool bf16 : {false, true}) {
    nn::GPTOptions o = bf16 ? mixed_bf16() : f32();
    o.storage.pad_to = n;
    nn::GPT model(odd_model(), o);
    nn::ParameterSet& ps = model.params();
    const nn::ShardRange s = nn::shard_range(ps.numel(), rank, n);
    const int64_t padded = ps.padded_numel();
    std::vector<double> mine(padded), want(padded);
    for (int64_t e = 0; e < padded; ++e) {
      want[e] = static_cast<double>(e % 1024) * 0.25;  // exact in fp32 and in bf16
      mine[e] = e / s.size == rank ? want[e] : -1.0 - rank;  // stale: not this rank's shard
    }
    ps.padded_values().copy_from(Tensor::from_vector(mine, {padded}, DType::f32));
    const comm::Traffic moved = labtest::traffic_of([&] {
      calling("all_gather_parameters", [&] { lab09::all_gather_parameters(ps, s, world()); });
    });
    const std::string what = bf16 ? " (mixed bf16)" : " (fp32)";
    EXPECT_TRUE(labtest::close_on_every_rank(ps.padded_values(),
                                             Tensor::from_vector(want, {padded}, DType::f32), 0, 0))
        << "every rank's padded values after all_gather_parameters: each rank's shard from its "
           "owner" << what;
    EXPECT_TRUE(exact_traffic(moved, labtest::TrafficBudget().all_gather(world(), 1, padded * 4)))
        << what;
    if (bf16) EXPECT_TRUE(compute_is_cast(ps)) << "the bf16 copy after the gather";
  }
}

TEST(Step2_PlantedFault, WholeBufferOptimizerOnEveryRankIsCaught) {
  // DDP's optimizer stepping everything on every rank: the right numbers, no saving.
  lab09::Ddp ddp(kLab.config(), f32(), world());
  const nn::ShardRange s =
      nn::shard_range(ddp.model().num_parameters(), world().rank(), world().size());
  if (world().size() == 1) {
    EXPECT_TRUE(state_is_the_shard(ddp.optimizer().state_bytes(), s, DType::f32))
        << "one rank: the shard is everything";
    return;
  }
  EXPECT_FALSE(state_is_the_shard(ddp.optimizer().state_bytes(), s, DType::f32));
  const Footprint f = footprint(0);
  EXPECT_FALSE(holds_stage1_bytes(f, s.size * world().size(), s));
}

TEST(Step2_PlantedFault, MissingAllGatherIsCaught) {
  // Each rank steps its shard and never sends it: every rank keeps the other shards' OLD values.
  nn::GPTOptions o = f32();
  o.storage.pad_to = world().size();
  nn::GPT model(kLab.config(), o);
  nn::ParameterSet& ps = model.params();
  const nn::ShardRange s = nn::shard_range(ps.numel(), world().rank(), world().size());
  optim::AdamW adamw(optim::groups_in_range(ps, s.lo, s.hi, ps.padded_values().flat(s.lo, s.size),
                                            ps.padded_grads().flat(s.lo, s.size)));
  lab09::Ddp ddp(kLab.config(), f32(), world());
  for (int step = 0; step < 3; ++step) {
    lab03::forward_backward(model, kLab.batch(step), world());
    adamw.step(kLr);  // fault: no all-gather
    ddp.forward_backward(kLab.batch(step));
    ddp.step(kLr);
  }
  if (world().size() > 1)
    EXPECT_FALSE(same_as_ddp(ps.values(), ddp.full_parameters()));
  else
    EXPECT_TRUE(same_as_ddp(ps.values(), ddp.full_parameters())) << "one rank owns everything";
}

// ---- bf16 (after the fp32 tests: a fault in ZeRO-1 itself is reported by those first) ----------

namespace {

// The planted fault: ZeRO-1 in bf16 that steps its shard (AdamW over groups_in_range: no compute
// copy in the groups) and all-gathers the fp32 values, but never recasts the bf16 copy. Its
// values are right; the layers compute with the initial weights for ever.
class NoRecast final : public lab09::Trainer {
 public:
  NoRecast() : Trainer(world()) {
    nn::GPTOptions o = mixed_bf16();
    o.storage.pad_to = world().size();
    model_ = std::make_unique<nn::GPT>(kLab.config(), o);
    nn::ParameterSet& ps = model_->params();
    s_ = nn::shard_range(ps.numel(), world().rank(), world().size());
    adamw_ = std::make_unique<optim::AdamW>(optim::groups_in_range(
        ps, s_.lo, s_.hi, ps.padded_values().flat(s_.lo, s_.real()),
        ps.padded_grads().flat(s_.lo, s_.size)));
  }
  int stage() const override { return 1; }
  double forward_backward(const data::Batch& global) override {
    return lab03::forward_backward(*model_, global, world());
  }
  void step(double lr) override {
    adamw_->step(lr);
    gather_fp32_values(model_->params(), s_);  // fault: no refresh_compute()
  }
  Tensor full_parameters() override { return model_->params().values(); }
  lab09::Held held() const override { return {}; }

 private:
  nn::ShardRange s_;
  std::unique_ptr<optim::AdamW> adamw_;
};

}  // namespace

TEST(Step2_Bf16, Zero1TakesTheBf16DdpStepAndRecastsTheCopy) {
  lab09::Zero1 z(kLab.config(), mixed_bf16(), world());
  ASSERT_TRUE(z.model().params().compute_values().defined()) << "built without the bf16 copy";
  EXPECT_TRUE(takes_the_bf16_ddp_step(z, kZero1Rtol, kZero1Atol));
  EXPECT_EQ(train::max_divergence_from_rank0(z.full_parameters(), world()), 0.0);
}

TEST(Step2_Bf16PlantedFault, SkippingTheRecastIsCaught) {
  NoRecast bad;
  // Stale from the first step on, on every rank count (one rank too: no group carries the copy).
  EXPECT_FALSE(takes_the_bf16_ddp_step(bad, kZero2Rtol, kZero2Atol));
  EXPECT_FALSE(compute_is_cast(bad.model().params()));
}

// Stage 1 on the simulated GPU, fp32 and mixed bf16, two steps: the host's losses and
// parameters bit for bit (lab09test::runs_on_sim_as_on_host).
TEST(Step2_Zero1, RunsOnTheSimulatedGpuAsOnTheHost) {
  const std::string problems = runs_on_sim_as_on_host(1);
  if (!problems.empty()) LABTEST_FAIL() << problems;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}
