// Mixed precision in the model (GPTOptions::compute_dtype = bf16): fp32 master weights,
// gradients and AdamW state, a bf16 compute copy, bf16 activations; compared with the fp32 model
// from the same seed.
//
// Tolerances, and why. Every layer rounds its output to bf16 (relative error up to u = 2^-8 per
// rounding, 8 significant bits), and the model stacks a few dozen of those, so bf16 does not match
// fp32 to any fixed number of bits: the question is how far the TRAINING drifts. Measured on this
// CPU (the test prints the figures): at init the losses differ by 3e-5 (tiny: 5.5011 vs 5.5011)
// and the gradient differs from fp32's by 0.2% of its norm; over 150 steps of AdamW on text the
// loss curves stay within 0.0033 of each other while the loss falls from 5.5 to 2.3. The bounds
// below are those figures with a margin of 6-30x, and below what a real bug gives (a compute copy
// not refreshed after a step, planted, moves the curve by more -- see the commit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "common/data/corpus.hpp"
#include "common/data/sampler.hpp"
#include "common/data/tokenizer.hpp"
#include "common/nn/gpt.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "common/train/equivalence.hpp"

using namespace scalelab;

namespace {
constexpr double kInitLossTol = 1e-3;     // |loss_bf16 - loss_fp32| at init (measured 3e-5)
constexpr double kInitGradTol = 0.02;     // ||g_bf16 - g_fp32|| / ||g_fp32|| (measured 0.2%)
constexpr double kLossBand = 0.02;        // max over 150 steps of |loss_bf16 - loss_fp32|
constexpr int kBandSteps = 150;
constexpr double kLr = 1e-3;

nn::GPTOptions options(DType compute, uint64_t seed = 1337) {
  nn::GPTOptions o;
  o.seed = seed;
  o.compute_dtype = compute;
  return o;
}

// The repository's small test text, as byte tokens.
const std::vector<uint16_t>& corpus() {
  static const std::vector<uint16_t> ids =
      data::encode(data::read_text_file(SCALELAB_TEST_DATA "/gpt_golden.txt"));
  return ids;
}

// True when every element of the bf16 copy is bf16(master).
bool copy_is_rounded_master(nn::ParameterSet& set) {
  Tensor& copy = set.compute_values();
  const Tensor& master = set.values();
  for (int64_t i = 0; i < master.numel(); ++i)
    if (copy.data<bf16>()[i].bits != bf16(master.data<float>()[i]).bits) return false;
  return true;
}
}  // namespace

TEST(MixedPrecision, Fp32MasterBf16CopyFp32Gradients) {
  nn::GPT model(model_config("tiny"), options(DType::bf16));
  nn::GPT ref(model_config("tiny"), options(DType::f32));
  nn::ParameterSet& set = model.params();
  EXPECT_EQ(set.dtype(), DType::f32);
  EXPECT_EQ(set.compute_dtype(), DType::bf16);
  EXPECT_EQ(set.values().dtype(), DType::f32);
  EXPECT_EQ(set.grads().dtype(), DType::f32);
  ASSERT_TRUE(set.compute_values().defined());
  EXPECT_EQ(set.compute_values().numel(), set.padded_numel());
  // the master is drawn exactly as the fp32 model's; the copy is its rounding
  EXPECT_TRUE(train::compare(set.values(), ref.params().values()).bitwise);
  EXPECT_TRUE(copy_is_rounded_master(set));
  for (nn::Parameter* p : model.parameters()) {
    ASSERT_EQ(p->compute_value().dtype(), DType::bf16) << p->name;
    ASSERT_TRUE(p->compute.shares_storage_with(set.compute_values())) << p->name;
  }
  // fp32 model: no copy, the layers use the values
  EXPECT_FALSE(ref.params().compute_values().defined());
  EXPECT_EQ(ref.params().compute_dtype(), DType::f32);

  // one AdamW step refreshes the copy (fused into the update), and SGD's too
  data::Sampler sampler(corpus(), 4, 16, 7);
  const data::Batch b = sampler.batch(0);
  optim::AdamW adamw(optim::groups(model.parameters()));
  model.zero_grad();
  model.forward(b.x, b.y);
  model.backward();
  EXPECT_GT(ops::sum_squares(set.grads()), 0.0);
  adamw.step(1e-2);
  EXPECT_TRUE(copy_is_rounded_master(set)) << "AdamW left the compute copy stale";
  optim::SGD sgd(optim::groups(model.parameters()));
  sgd.step(1e-2);
  EXPECT_TRUE(copy_is_rounded_master(set)) << "SGD left the compute copy stale";
  // values changed behind the optimizer's back (a load, a broadcast): refresh_compute
  ops::fill(set.values(), 0.5);
  set.refresh_compute();
  EXPECT_TRUE(copy_is_rounded_master(set));
}

TEST(MixedPrecision, LossAndGradientsNearFp32AtInit) {
  nn::GPT mixed(model_config("tiny"), options(DType::bf16));
  nn::GPT ref(model_config("tiny"), options(DType::f32));
  data::Sampler sampler(corpus(), 8, 16, 3);
  const data::Batch b = sampler.batch(0);
  mixed.zero_grad();
  ref.zero_grad();
  const double lm = mixed.forward(b.x, b.y), lr = ref.forward(b.x, b.y);
  mixed.backward();
  ref.backward();
  Tensor diff = mixed.params().grads().clone();
  ops::axpy(diff, -1.0, ref.params().grads());
  const double rel = std::sqrt(ops::sum_squares(diff) / ops::sum_squares(ref.params().grads()));
  std::printf("init: loss fp32 %.6f bf16 %.6f (|diff| %.2e); gradient |g16 - g32| / |g32| = %.2e\n",
              lr, lm, std::fabs(lm - lr), rel);
  EXPECT_NEAR(lm, lr, kInitLossTol);
  EXPECT_LT(rel, kInitGradTol);
  // the evaluation path (logits, loss) computes in bf16 too
  EXPECT_EQ(mixed.logits(b.x).dtype(), DType::bf16);
  EXPECT_NEAR(mixed.loss(b.x, b.y), lm, 1e-6);
}

TEST(MixedPrecision, LossCurveStaysInTheBand) {
  // tiny, batch 16 x 16 tokens, AdamW at a constant lr 1e-3, the same seed and batches in both
  // precisions. (At lr 3e-3 this run has a loss spike near step 55 in both precisions; the
  // instability amplifies the difference to ~0.15 there: a band is only a band for stable runs.)
  nn::GPT mixed(model_config("tiny"), options(DType::bf16));
  nn::GPT ref(model_config("tiny"), options(DType::f32));
  optim::AdamW om(optim::groups(mixed.parameters())), orf(optim::groups(ref.parameters()));
  data::Sampler sampler(corpus(), 16, 16, 11);
  double band = 0, first = 0, last = 0;
  for (int step = 0; step < kBandSteps; ++step) {
    const data::Batch b = sampler.batch(step);
    mixed.zero_grad();
    ref.zero_grad();
    const double lm = mixed.forward(b.x, b.y), lr = ref.forward(b.x, b.y);
    mixed.backward();
    ref.backward();
    om.step(kLr);
    orf.step(kLr);
    band = std::max(band, std::fabs(lm - lr));
    if (step == 0) first = lr;
    last = lr;
  }
  std::printf("loss band over %d steps: max |loss_bf16 - loss_fp32| = %.4f (fp32 loss %.3f -> "
              "%.3f)\n", kBandSteps, band, first, last);
  EXPECT_LT(band, kLossBand);
  EXPECT_LT(last, first - 1.0) << "the model should learn: the band means little otherwise";
}
