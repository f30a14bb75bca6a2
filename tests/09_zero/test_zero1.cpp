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
