// AdamW, SGD, clipping and the schedule against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/nn/gpt.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "common/scalar.hpp"

using namespace scalelab;

namespace {
optim::Group group(std::vector<double> value, std::vector<double> grad, bool decay,
                   DType dt = DType::f64) {
  const int64_t n = static_cast<int64_t>(value.size());
  return {Tensor::from_vector(value, {n}, dt), Tensor::from_vector(grad, {n}, dt), decay};
}
}  // namespace

TEST(Optim, AdamWMatchesTheFormula) {
  // tolerance 1e-12: float64, the same formula written out
  auto g = group({1.0, -2.0}, {0.5, 0.25}, true);
  optim::AdamWConfig c{0.9, 0.95, 1e-8, 0.1};
  optim::AdamW opt({g}, c);
  double p = 1.0, m = 0, v = 0;
  const double lr = 0.01, grad = 0.5;
  for (int t = 1; t <= 3; ++t) {
    opt.step(lr);
    m = 0.9 * m + 0.1 * grad;
    v = 0.95 * v + 0.05 * grad * grad;
    const double mhat = m / (1 - std::pow(0.9, t)), vhat = v / (1 - std::pow(0.95, t));
    p -= lr * (mhat / (std::sqrt(vhat) + 1e-8) + 0.1 * p);
    EXPECT_NEAR(g.value.item(0), p, 1e-12) << "step " << t;
  }
  EXPECT_EQ(opt.steps(), 3);
  EXPECT_EQ(opt.state_bytes(), 2u * 2 * sizeof(double));
}

TEST(Optim, AdamWDecaysOnlyDecayGroups) {
  auto decayed = group({1.0}, {0.0}, true), kept = group({1.0}, {0.0}, false);
  optim::AdamW opt({decayed, kept}, {0.9, 0.95, 1e-8, 0.5});
  opt.step(0.1);
  EXPECT_NEAR(decayed.value.item(0), 1.0 - 0.1 * 0.5, 1e-12);  // zero gradient: decay only
  EXPECT_EQ(kept.value.item(0), 1.0);
}

TEST(Optim, SGDWithMomentum) {
  auto g = group({1.0}, {2.0}, false);
  optim::SGD opt({g}, 0.9);
  opt.step(0.1);  // buf = 2, p = 1 - 0.2
  EXPECT_NEAR(g.value.item(0), 0.8, 1e-12);
  opt.step(0.1);  // buf = 0.9 * 2 + 2 = 3.8, p = 0.8 - 0.38
  EXPECT_NEAR(g.value.item(0), 0.42, 1e-12);
  auto plain = group({1.0}, {2.0}, false);
  optim::SGD({plain}).step(0.5);
  EXPECT_NEAR(plain.value.item(0), 0.0, 1e-12);
}

TEST(Optim, ClipGradNorm) {
  auto a = group({0, 0}, {3.0, 0.0}, false), b = group({0}, {4.0}, false);
  EXPECT_NEAR(optim::grad_norm({a, b}), 5.0, 1e-12);
  EXPECT_NEAR(optim::clip_grad_norm({a, b}, 1.0), 5.0, 1e-12);  // returns the norm before
  EXPECT_NEAR(optim::grad_norm({a, b}), 1.0, 1e-6);
  EXPECT_NEAR(a.grad.item(0), 0.6, 1e-6);
  // below the threshold nothing changes
  EXPECT_NEAR(optim::clip_grad_norm({a, b}, 10.0), 1.0, 1e-6);
  EXPECT_NEAR(a.grad.item(0), 0.6, 1e-6);
}

// Clipping keeps the norm where the gradients are: it reads nothing back (on the host too, where
// host_reads() counts what a GPU would copy), and gives the bits of the host formula: the norm
// sqrt(sum of grad_norm's squares), every gradient times max_norm / (norm + 1e-6).
TEST(Optim, ClippingReadsNothingAndKeepsTheBitsOfTheFormula) {
  for (DType dt : {DType::f32, DType::f64}) {
    auto a = group({0, 0, 0}, {0.3, -1.7, 2.2}, true, dt), b = group({0}, {4.1}, false, dt);
    auto a2 = group({0, 0, 0}, {0.3, -1.7, 2.2}, true, dt), b2 = group({0}, {4.1}, false, dt);
    const double norm = optim::grad_norm({a2, b2});
    for (optim::Group* g : {&a2, &b2}) ops::scale(g->grad, 1.5 / (norm + 1e-6));

    const int64_t reads = host_reads();
    const Scalar clipped = optim::clip_grad_norm({a, b}, 1.5);
    EXPECT_EQ(host_reads(), reads) << "clipping read its norm back";
    EXPECT_EQ(clipped.value(), norm) << dtype_name(dt);
    EXPECT_EQ(a.grad.to_vector(), a2.grad.to_vector()) << dtype_name(dt);
    EXPECT_EQ(b.grad.to_vector(), b2.grad.to_vector()) << dtype_name(dt);
    const std::vector<double> before = a.grad.to_vector();
    optim::clip_grad_norm({a, b}, 100.0);  // below the threshold: untouched
    EXPECT_EQ(a.grad.to_vector(), before);
  }
}

TEST(Optim, CosineScheduleWithWarmup) {
  const double max = 1e-3, min = 1e-4;
  EXPECT_NEAR(optim::cosine_lr(0, 10, 100, max, min), max / 11, 1e-15);  // nanoGPT's warmup
  EXPECT_NEAR(optim::cosine_lr(9, 10, 100, max, min), max * 10 / 11, 1e-15);
  EXPECT_NEAR(optim::cosine_lr(10, 10, 100, max, min), max, 1e-15);
  EXPECT_NEAR(optim::cosine_lr(55, 10, 100, max, min), (max + min) / 2, 1e-15);  // half way
  EXPECT_NEAR(optim::cosine_lr(100, 10, 100, max, min), min, 1e-15);
  EXPECT_NEAR(optim::cosine_lr(500, 10, 100, max, min), min, 1e-15);
}

// A model's parameters lie back to back in one flat buffer: AdamW updates them in one pass
// (ops::adamw_update_segments; on a GPU one launch instead of one per parameter), with the bits
// of one update per parameter, weight decay on the decaying ones only, the bf16 compute copy
// refreshed in the same pass. Groups that are not back to back take one update each.
TEST(Optim, AdamWOverAFlatModelIsOnePassWithThePerParameterBits) {
  for (const DType compute : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(compute));
    const nn::GPTOptions o{.dtype = DType::f32, .seed = 3, .compute_dtype = compute};
    nn::GPT a(model_config("tiny"), o), b(model_config("tiny"), o);
    for (nn::GPT* m : {&a, &b})
      m->params().grads().copy_from(
          Tensor::uniform({m->num_parameters()}, 9, DType::f32, Device::cpu(), -1, 1));
    const optim::AdamWConfig c{0.9, 0.95, 1e-8, 0.1};
    optim::AdamW one(optim::groups(a.parameters()), c);
    EXPECT_TRUE(one.one_pass());
    // b: one ops::adamw_update per parameter, written out
    std::vector<Tensor> m, v;
    for (nn::Parameter* p : b.parameters()) {
      m.push_back(Tensor::zeros({p->value.numel()}));
      v.push_back(Tensor::zeros({p->value.numel()}));
    }
    for (int64_t t = 1; t <= 2; ++t) {
      one.step(1e-2);
      for (std::size_t i = 0; i < b.parameters().size(); ++i) {
        nn::Parameter* p = b.parameters()[i];
        Tensor value = p->value.view({-1});
        Tensor copy = p->compute.defined() ? p->compute.view({-1}) : Tensor();
        ops::adamw_update(value, p->grad.view({-1}), m[i], v[i],
                          {1e-2, 0.9, 0.95, 1e-8, p->weight_decay ? 0.1 : 0.0, t},
                          copy.defined() ? &copy : nullptr);
      }
    }
    EXPECT_EQ(a.params().values().to_vector(), b.params().values().to_vector());
    for (std::size_t i = 0; i < a.parameters().size(); ++i)
      if (a.parameters()[i]->compute.defined())
        EXPECT_EQ(a.parameters()[i]->compute.to_vector(), b.parameters()[i]->compute.to_vector())
            << a.parameters()[i]->name;
  }
  // not back to back: one update per group
  auto x = group({1.0}, {0.5}, true), y = group({2.0}, {0.5}, false);
  EXPECT_FALSE(optim::AdamW({x, y}).one_pass());
}
