// Every layer's backward against central finite differences in float64 (tolerance kGradTol =
// 1e-6 relative, see gradcheck.hpp). Each layer's loss is L = sum(out * R) for a fixed random R,
// so dL/dout = R is what backward is given.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/nn/attention.hpp"
#include "common/nn/block.hpp"
#include "common/nn/embedding.hpp"
#include "common/nn/layernorm.hpp"
#include "common/nn/linear.hpp"
#include "common/nn/mlp.hpp"
#include "common/ops/ops.hpp"
#include "tests/common/gradcheck.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
const DType f64 = DType::f64;

// Binds a layer's parameters to flat f64 buffers with random (not the usual) values, so that
// zero biases or unit LayerNorm weights cannot hide a bug.
nn::ParameterSet bind_random(std::vector<nn::Parameter*> params, uint64_t seed) {
  nn::ParameterSet set;
  set.bind(params, f64, Device::cpu(), seed);
  fill_uniform(set.values(), seed + 1, -0.5, 0.5);
  return set;
}

// Checks every parameter's gradient of `loss` (which reads parameter values).
void check_params(const std::vector<nn::Parameter*>& params, const std::function<double()>& loss) {
  for (nn::Parameter* p : params) EXPECT_GRAD_OK(gradcheck(p->value, p->grad, loss), p->name);
}

// An input gradient for a backward that sets it (nn::InputGrad::set): NaN everywhere, so a
// backward that reads it (adds to it) anywhere leaves NaN there and fails the check.
Tensor nan_filled(std::vector<int64_t> shape) {
  Tensor t = Tensor::empty(std::move(shape), f64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = std::nan("");
  return t;
}
}  // namespace

// The ctest entries named `.poisoned` run this binary with SCALELAB_POISON_EMPTY=1: every
// Tensor::empty starts as NaN, so every check below also fails if a backward reads a temporary
// before writing it. This makes sure the poison is really on there (skipped elsewhere).
TEST(GradCheck, PoisonedRunsStartEveryEmptyTensorAsNaN) {
  const char* v = std::getenv("SCALELAB_POISON_EMPTY");
  if (!v || !*v || std::string(v) == "0") GTEST_SKIP() << "SCALELAB_POISON_EMPTY is not set";
  const Tensor t = Tensor::empty({3, 5}, f64);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_TRUE(std::isnan(t.item(i))) << i;
}

TEST(GradCheck, CatchesAWrongGradient) {
  // The checker itself must fail on a wrong gradient: d/dx sum(x^2) is 2x, not 2.1x.
  Tensor x = uniform({10}, 1);
  Tensor wrong = Tensor::empty({10}, f64);
  for (int i = 0; i < 10; ++i) wrong.data<double>()[i] = 2.1 * x.item(i);
  auto loss = [&] { return dot(x, x); };
  EXPECT_GT(gradcheck(x, wrong, loss).max_error, 1e-3);
  Tensor right = Tensor::empty({10}, f64);
  for (int i = 0; i < 10; ++i) right.data<double>()[i] = 2 * x.item(i);
  EXPECT_LT(gradcheck(x, right, loss).max_error, kGradTol);
}

TEST(GradCheck, Linear) {
  nn::Linear lin("lin", 5, 3);
  auto set = bind_random(lin.parameters(), 2);
  Tensor x = uniform({2, 4, 5}, 3), R = uniform({2, 4, 3}, 4);
  auto loss = [&] {
    Tensor y = Tensor::empty({2, 4, 3}, f64);
    lin.forward(y, x);
    return dot(y, R);
  };
  Tensor dx = Tensor::zeros({2, 4, 5}, f64);
  lin.backward(dx, R, x);
  EXPECT_GRAD_OK(gradcheck(x, dx, loss), "dx");
  check_params(lin.parameters(), loss);
}

TEST(GradCheck, LinearSetsOrAddsItsInputGradient) {
  // InputGrad::set never reads din (a block's backward hands it uninitialised memory: no
  // zero-fill); the default adds to what din holds
  nn::Linear lin("lin", 5, 3);
  auto set = bind_random(lin.parameters(), 40);
  const Tensor x = uniform({4, 5}, 41), R = uniform({4, 3}, 42);
  Tensor from_zero = Tensor::zeros({4, 5}, f64);
  lin.backward(from_zero, R, x);
  Tensor din = nan_filled({4, 5});
  lin.backward(din, R, x, nn::InputGrad::set);
  Tensor added = uniform({4, 5}, 43);
  const Tensor before = added.clone();
  lin.backward(added, R, x);
  for (int64_t i = 0; i < din.numel(); ++i) {
    EXPECT_EQ(din.item(i), from_zero.item(i)) << i;
    EXPECT_NEAR(added.item(i), before.item(i) + from_zero.item(i), 1e-15) << i;
  }
}

TEST(GradCheck, LinearWithoutBiasAndSharded) {
  // a row-parallel slice: columns 1..3 and 4..6 of a (4, 6) weight
  nn::Linear lin("lin", 6, 4, false, 0.02, nn::Shard{1, {{1, 3}, {4, 6}}});
  EXPECT_EQ(lin.in_features(), 4);
  auto set = bind_random(lin.parameters(), 5);
  Tensor x = uniform({3, 4}, 6), R = uniform({3, 4}, 7);
  auto loss = [&] {
    Tensor y = Tensor::empty({3, 4}, f64);
    lin.forward(y, x);
    return dot(y, R);
  };
  Tensor dx = Tensor::zeros({3, 4}, f64);
  lin.backward(dx, R, x);
  EXPECT_GRAD_OK(gradcheck(x, dx, loss), "dx");
  check_params(lin.parameters(), loss);
}

TEST(GradCheck, LayerNorm) {
  nn::LayerNorm ln("ln", 6);
  auto set = bind_random(ln.parameters(), 8);
  Tensor x = uniform({5, 6}, 9, f64, -2, 2), R = uniform({5, 6}, 10);
  Tensor mean = Tensor::empty({5}, f64), rstd = Tensor::empty({5}, f64);
  auto loss = [&] {
    Tensor y = Tensor::empty({5, 6}, f64);
    ln.forward(y, mean, rstd, x);
    return dot(y, R);
  };
  loss();  // saves mean, rstd at x
  Tensor dx = Tensor::zeros({5, 6}, f64);
  ln.backward(dx, R, x, mean, rstd);
  EXPECT_GRAD_OK(gradcheck(x, dx, loss), "dx");
  check_params(ln.parameters(), loss);
}

TEST(GradCheck, Gelu) {
  Tensor x = uniform({40}, 11, f64, -4, 4), R = uniform({40}, 12);
  auto loss = [&] {
    Tensor y = Tensor::empty({40}, f64);
    ops::gelu_forward(y, x);
    return dot(y, R);
  };
  Tensor dx = Tensor::zeros({40}, f64);
  ops::gelu_backward(dx, x, R);
  EXPECT_GRAD_OK(gradcheck(x, dx, loss), "dx");
  // GELU(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.841192 (tanh form)
  Tensor one = Tensor::from_vector({1.0}, {1}, f64), y = Tensor::empty({1}, f64);
  ops::gelu_forward(y, one);
  EXPECT_NEAR(y.item(), 0.8411919906, 1e-9);
}

TEST(GradCheck, Embedding) {
  nn::Embedding emb(7, 5, 3);
  auto set = bind_random(emb.parameters(), 13);
  Tensor tokens = random_tokens({2, 4}, 7, 14), R = uniform({2, 4, 3}, 15);
  auto loss = [&] {
    Tensor y = Tensor::empty({2, 4, 3}, f64);
    emb.forward(y, tokens);
    return dot(y, R);
  };
  emb.backward(R, tokens);
  check_params(emb.parameters(), loss);
}

TEST(GradCheck, CrossEntropy) {
  Tensor logits = uniform({6, 5}, 16, f64, -3, 3);
  Tensor targets = random_tokens({6}, 5, 17);
  Tensor probs = Tensor::empty({6, 5}, f64), losses = Tensor::empty({6}, f64);
  auto loss = [&] {
    ops::cross_entropy_forward(losses, probs, logits, targets);
    return 0.7 * ops::sum(losses);
  };
  loss();
  Tensor dlogits = Tensor::empty({6, 5}, f64);
  ops::cross_entropy_backward(dlogits, probs, targets, 0.7);
  EXPECT_GRAD_OK(gradcheck(logits, dlogits, loss), "dlogits");
  // the loss of uniform logits is log(V)
  Tensor flat = Tensor::zeros({1, 5}, f64), p = Tensor::empty({1, 5}, f64), l = Tensor::empty({1}, f64);
  Tensor t0 = Tensor::zeros({1}, DType::i32);
  ops::cross_entropy_forward(l, p, flat, t0);
  EXPECT_NEAR(l.item(), std::log(5.0), 1e-12);
}

TEST(GradCheck, CausalSoftmax) {
  Tensor pre = uniform({2, 4, 4}, 18, f64, -2, 2), R = uniform({2, 4, 4}, 19);
  const double scale = 0.6;
  Tensor att = Tensor::empty({2, 4, 4}, f64);
  auto loss = [&] {
    ops::causal_softmax_forward(att, pre, scale);
    return dot(att, R);
  };
  loss();
  for (int t = 0; t < 4; ++t)  // the future is masked: row t has zeros after column t
    for (int s = t + 1; s < 4; ++s) EXPECT_EQ(att.item(t * 4 + s), 0.0);
  Tensor dpre = Tensor::empty({2, 4, 4}, f64);
  ops::causal_softmax_backward(dpre, att, R, scale);
  EXPECT_GRAD_OK(gradcheck(pre, dpre, loss), "dpreatt");
}

TEST(GradCheck, SplitAndMergeHeadsAreAdjoint) {
  // <split(x), y> == <x, split_backward(y)>: the backward is the transpose of the forward
  Tensor qkv = uniform({2, 3, 12}, 20);
  Tensor q = Tensor::empty({2, 2, 3, 2}, f64), k = q.clone(), v = q.clone();
  ops::split_heads(q, k, v, qkv, 2);
  Tensor dq = uniform({2, 2, 3, 2}, 21), dk = uniform({2, 2, 3, 2}, 22), dv = uniform({2, 2, 3, 2}, 23);
  Tensor dqkv = Tensor::empty({2, 3, 12}, f64);
  ops::split_heads_backward(dqkv, dq, dk, dv);
  EXPECT_NEAR(dot(q, dq) + dot(k, dk) + dot(v, dv), dot(qkv, dqkv), 1e-12);
  Tensor y = uniform({2, 2, 3, 2}, 24), out = Tensor::empty({2, 3, 4}, f64);
  ops::merge_heads(out, y);
  Tensor dout = uniform({2, 3, 4}, 25), dy = Tensor::empty({2, 2, 3, 2}, f64);
  ops::merge_heads_backward(dy, dout);
  EXPECT_NEAR(dot(out, dout), dot(y, dy), 1e-12);
  // q of head 1 at (b=0, t=0) is qkv[0, 0, 2:4]
  EXPECT_EQ(q.item(1 * 3 * 2), qkv.item(2));
  EXPECT_EQ(k.item(0), qkv.item(4));
}

TEST(GradCheck, CausalSelfAttention) {
  nn::CausalSelfAttention attn("attn", 8, 2, 2);
  auto set = bind_random(attn.parameters(), 26);
  Tensor x = uniform({2, 5, 8}, 27), R = uniform({2, 5, 8}, 28);
  nn::AttentionActivations acts;
  auto loss = [&] {
    Tensor y = Tensor::empty({2, 5, 8}, f64);
    attn.forward(y, x, acts);
    return dot(y, R);
  };
  loss();
  Tensor dx = Tensor::zeros({2, 5, 8}, f64);
  attn.backward(dx, R, x, acts);
  EXPECT_GRAD_OK(gradcheck(x, dx, loss), "dx");
  check_params(attn.parameters(), loss);
  Tensor set_dx = nan_filled({2, 5, 8});  // set: the same gradient, din never read
  attn.backward(set_dx, R, x, acts, nullptr, nullptr, nn::InputGrad::set);
  EXPECT_GRAD_OK(gradcheck(x, set_dx, loss), "dx (InputGrad::set)");
}

TEST(GradCheck, AttentionIsCausal) {
  // changing the last position's input must not change earlier outputs
  nn::CausalSelfAttention attn("attn", 8, 2, 2);
  auto set = bind_random(attn.parameters(), 29);
  Tensor x = uniform({1, 5, 8}, 30);
  nn::AttentionActivations acts;
  Tensor y1 = Tensor::empty({1, 5, 8}, f64), y2 = y1.clone();
  attn.forward(y1, x, acts);
  for (int c = 0; c < 8; ++c) x.data<double>()[4 * 8 + c] += 1.0;
  attn.forward(y2, x, acts);
  for (int i = 0; i < 4 * 8; ++i) EXPECT_EQ(y1.item(i), y2.item(i));
  EXPECT_NE(y1.item(4 * 8), y2.item(4 * 8));
}

TEST(GradCheck, MLP) {
  nn::MLP mlp("mlp", 4, 2);
  auto set = bind_random(mlp.parameters(), 31);
  Tensor x = uniform({2, 3, 4}, 32), R = uniform({2, 3, 4}, 33);
  nn::MLPActivations acts;
  auto loss = [&] {
    Tensor y = Tensor::empty({2, 3, 4}, f64);
    mlp.forward(y, x, acts);
    return dot(y, R);
  };
  loss();
  Tensor dx = Tensor::zeros({2, 3, 4}, f64);
  mlp.backward(dx, R, x, acts);
  EXPECT_GRAD_OK(gradcheck(x, dx, loss), "dx");
  check_params(mlp.parameters(), loss);
  Tensor set_dx = nan_filled({2, 3, 4});  // set: the same gradient, din never read
  mlp.backward(set_dx, R, x, acts, nullptr, nn::InputGrad::set);
  EXPECT_GRAD_OK(gradcheck(x, set_dx, loss), "dx (InputGrad::set)");
}

TEST(GradCheck, Block) {
  nn::Block block(0, 8, 2, 2);
  auto set = bind_random(block.parameters(), 34);
  Tensor x = uniform({2, 4, 8}, 35), R = uniform({2, 4, 8}, 36);
  nn::BlockActivations acts;
  auto loss = [&] {
    nn::BlockActivations scratch;  // finite differences must not overwrite `acts`
    return dot(block.forward(x, scratch), R);
  };
  block.forward(x, acts);
  Tensor dx = block.backward(R, x, acts);
  EXPECT_GRAD_OK(gradcheck(x, dx, loss), "dx");
  check_params(block.parameters(), loss);
}
