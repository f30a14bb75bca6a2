// Lab 09 in mixed precision (--precision bf16: fp32 master values, gradients and AdamW state, a
// bf16 compute copy the layers use, bf16 activations), stages 0-2. A ZeRO-1 and a ZeRO-2 step
// take the bf16 DDP step (the given stage 0, same seed, same global batches): losses and the
// fp32 parameters within the tolerances below, and after every step each rank's compute copy is
// EXACTLY cast(values) (the all-gather moves fp32 values; a rank that forgets to recast its copy
// computes the next step with stale weights). The held counters count the copy and equal the
// allocator. Stage 3 refuses bf16 (a UsageError). Planted fault: ZeRO-1 without the recast.
#include <gtest/gtest.h>

#include "common/optim/optim.hpp"
#include "common/train/equivalence.hpp"
#include "ddp.hpp"
#include "tests/09_zero/zero_checks.hpp"

using namespace scalelab;
using namespace scalelab::lab09test;
using labtest::world;

namespace {

// Tolerances against the bf16 DDP over kSteps steps. ZeRO-1 all-reduces the same fp32 gradients
// and updates each element as DDP does, and AdamW's fused cast and refresh_compute round alike:
// it is bitwise DDP (tolerance 0, as in fp32). ZeRO-2 reduces to the owners in another order:
// the fp32 gradients differ in their last bits, so the masters do, and a master near a bf16
// rounding boundary can give a copy one bf16 ulp (2^-8 relative) away, which moves the next
// losses. Measured (kLab, 3 steps at lr 1e-2): 1 and 2 ranks bitwise; 4 ranks losses bitwise and
// parameters within 7.7e-7 (|p| up to ~1). 1e-5 relative + 1e-5 absolute leaves a margin of
// ~13 and still fails a stale copy by far (it moves the second loss by 8%, the parameters by
// 3.5e-2).
constexpr int kSteps = 3;
constexpr double kZero1Rtol = 0, kZero1Atol = 0;
constexpr double kZero2Rtol = 1e-5, kZero2Atol = 1e-5;

// kSteps steps of `t` against the bf16 DDP: the losses and the fp32 parameters within rtol/atol,
// and the compute copy cast(values) on every rank. Collective.
testing::AssertionResult takes_the_bf16_ddp_step(lab09::Trainer& t, double rtol, double atol) {
  lab09::Ddp ddp(kLab.config(), mixed_bf16(), world());
  const std::vector<double> want = run_steps(ddp, kSteps), got = run_steps(t, kSteps);
  auto copy = compute_is_cast(t.model().params());
  auto params = labtest::close_on_every_rank(t.full_parameters(), ddp.full_parameters(), rtol, atol);
  for (std::size_t s = 0; s < want.size(); ++s)
    if (std::abs(got[s] - want[s]) > atol + rtol * std::abs(want[s]))
      return testing::AssertionFailure() << "loss of step " << s << ": " << got[s]
                                         << ", bf16 DDP " << want[s];
  if (!params) return params << " (fp32 parameters against the bf16 DDP's)";
  return copy;
}

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

TEST(Step3_Bf16, Zero2TakesTheBf16DdpStepAndRecastsTheCopy) {
  lab09::Zero2 z(kLab.config(), mixed_bf16(), world());
  ASSERT_TRUE(z.model().params().compute_values().defined()) << "built without the bf16 copy";
  EXPECT_TRUE(takes_the_bf16_ddp_step(z, kZero2Rtol, kZero2Atol));
  EXPECT_EQ(train::max_divergence_from_rank0(z.full_parameters(), world()), 0.0);
}

TEST(Step3_Bf16, HeldCountsTheCopyAndEqualsTheAllocator) {
  // Between steps: fp32 values + the bf16 copy (6 bytes per padded element) as parameters, and
  // the trainer's total exactly the allocator's bytes, as in fp32 (the program prints both).
  for (int stage = 0; stage <= 2; ++stage) {
    std::shared_ptr<lab09::Trainer> t;
    const Footprint f = footprint([&]() {
      t = lab09::make_trainer(stage, kLab.config(), mixed_bf16(), world());
      return Steps{[t](const data::Batch& b) { t->forward_backward(b); }, [t]() { t->step(kLr); }};
    });
    const lab09::Held h = t->held();
    const auto padded = static_cast<std::size_t>(t->model().params().padded_numel());
    EXPECT_EQ(h.params, padded * (4 + 2)) << "stage " << stage;
    EXPECT_EQ(h.total(), f.held) << "stage " << stage << ": held counters against the allocator";
  }
}

TEST(Step4_Bf16, Stage3RefusesMixedPrecision) {
  // Its per-unit values have no compute copy: a UsageError, before any collective.
  EXPECT_THROW(std::make_unique<lab09::Zero3>(kLab.config(), mixed_bf16(), world()), UsageError);
  EXPECT_THROW(lab09::make_trainer(3, kLab.config(), mixed_bf16(), world()), UsageError);
}
