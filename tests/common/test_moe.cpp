// The mixture of experts (common/ops/moe.hpp, common/nn/moe.hpp) on the host:
//  - the routing ops: top-k with ties, moe_route against a hand count (groups, capacity, the
//    dispatched layout), the renormalised gates' and the softmax's backward by finite differences;
//  - nn::MoE against the written-out reference (tests/common/moe_reference.hpp: every expert on
//    every token, masked by the gates) in f64, 1e-12 relative, with dropped tokens;
//  - its backward (the router's, through the gates AND the balancing loss, and the experts') by
//    central differences in f64 (kGradTol, gradcheck.hpp), top-1 and top-2;
//  - a GPT with MoE blocks (tiny-moe): the loss includes the balancing loss, and every gradient
//    of an MoE block passes the same check; one rank's experts of ep = 2 are the single device's.
#include <gtest/gtest.h>

#include "common/allocator.hpp"
#include "common/nn/gpt.hpp"
#include "common/nn/mappings.hpp"
#include "common/nn/moe.hpp"
#include "common/ops/moe.hpp"
#include "common/ops/ops.hpp"
#include "common/scalar.hpp"
#include "tests/common/gradcheck.hpp"
#include "tests/common/moe_reference.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
const DType f64 = DType::f64;

Tensor ids(const std::vector<int>& v, std::vector<int64_t> shape) {
  return Tensor::from_vector(std::vector<double>(v.begin(), v.end()), std::move(shape),
                             DType::i32);
}
std::vector<int> ints(const Tensor& t) {
  const std::vector<double> v = t.to_vector();
  return {v.begin(), v.end()};
}

nn::ParameterSet bind_random(std::vector<nn::Parameter*> params, uint64_t seed) {
  nn::ParameterSet set;
  set.bind(params, f64, Device::cpu(), seed);
  fill_uniform(set.values(), seed + 1, -0.5, 0.5);
  return set;
}

MoEConfig config(int64_t E, int64_t k, double cf, double aux = 0.1) {
  return {.n_expert = E, .top_k = k, .every = 1, .capacity_factor = cf, .aux_coef = aux};
}
}  // namespace

TEST(MoEOps, TopKTakesTheLargestLowestColumnFirstOnTies) {
  Tensor x = Tensor::from_vector({0.1, 0.5, 0.2, 0.5, /**/ 0.9, 0.0, 0.3, 0.3}, {2, 4}, f64);
  Tensor v = Tensor::empty({2, 2}, f64), i = Tensor::empty({2, 2}, DType::i32);
  ops::top_k(v, i, x, 2);
  EXPECT_EQ(ints(i), (std::vector<int>{1, 3, 0, 2}));
  EXPECT_EQ(v.to_vector(), (std::vector<double>{0.5, 0.5, 0.9, 0.3}));
  Tensor dx = Tensor::zeros({2, 4}, f64);
  ops::top_k_backward(dx, Tensor::from_vector({1, 2, 3, 4}, {2, 2}, f64), i);
  EXPECT_EQ(dx.to_vector(), (std::vector<double>{0, 1, 0, 2, 3, 0, 4, 0}));
}

TEST(MoEOps, RouteCountsAndDropsByHand) {
  // 6 tokens in 2 groups of 3, top-2 of 3 experts, capacity 2 per group and expert.
  // group 0: firsts 0 0 0 -> expert 0 takes tokens 0, 1, drops 2; seconds 1 1 2 -> 1: 0, 1; 2: 2
  // group 1: firsts 2 1 2 -> 2: 3, 5; 1: 4; seconds 0 2 1 -> 0: 3; 2: full, drops 4; 1: 5
  const Tensor idx = ids({0, 1, 0, 1, 0, 2, /**/ 2, 0, 1, 2, 2, 1}, {6, 2});
  Tensor dest = Tensor::empty({6, 2}, DType::i32), as = Tensor::empty({2, 3}, DType::i32),
         kp = Tensor::empty({2, 3}, DType::i32);
  ops::moe_route(dest, as, kp, idx, 3, 2, 2);
  EXPECT_EQ(ints(as), (std::vector<int>{3, 2, 1, /**/ 1, 2, 3}));
  EXPECT_EQ(ints(kp), (std::vector<int>{2, 2, 1, /**/ 1, 2, 2}));
  // layout: expert 0 [g0: t0 t1][g1: t3] = rows 0-2; expert 1 [g0: t0 t1][g1: t4 t5] = 3-6;
  // expert 2 [g0: t2][g1: t3 t5] = 7-9
  EXPECT_EQ(ints(dest), (std::vector<int>{0, 3, 1, 4, -1, 7, /**/ 8, 2, 5, -1, 9, 6}));
}

TEST(MoEOps, GateAndSoftmaxBackwardsAgainstFiniteDifferences) {
  Tensor in = uniform({3, 2}, 5, f64, 0.1, 1.0), R = uniform({3, 2}, 6);
  auto loss = [&] {
    Tensor out = Tensor::empty({3, 2}, f64);
    ops::normalize_rows(out, in);
    return dot(out, R);
  };
  Tensor din = Tensor::zeros({3, 2}, f64);
  ops::normalize_rows_backward(din, R, in);
  EXPECT_GRAD_OK(gradcheck(in, din, loss), "normalize_rows");
  Tensor x = uniform({3, 5}, 7), R2 = uniform({3, 5}, 8);
  auto sm = [&] {
    Tensor out = Tensor::empty({3, 5}, f64);
    ops::softmax_forward(out, x);
    return dot(out, R2);
  };
  Tensor y = Tensor::empty({3, 5}, f64), dx = Tensor::zeros({3, 5}, f64);
  ops::softmax_forward(y, x);
  ops::softmax_backward(dx, y, R2);
  EXPECT_GRAD_OK(gradcheck(x, dx, sm), "softmax");
}

TEST(MoEOps, RowScaleAndDot) {
  Tensor x = Tensor::from_vector({1, 2, 3, 4}, {2, 2}, f64);
  Tensor d = Tensor::empty({2}, f64);
  ops::row_dot(d, x, x);
  EXPECT_EQ(d.to_vector(), (std::vector<double>{5, 25}));
  ops::multiply_rows(x, Tensor::from_vector({2, -1}, {2}, f64));
  EXPECT_EQ(x.to_vector(), (std::vector<double>{2, 4, -3, -4}));
}

namespace {
struct Layer {
  nn::MoE moe;
  nn::ParameterSet set;
  Layer(const MoEConfig& c, int64_t C, int64_t groups, uint64_t seed)
      : moe("moe", C, 2, {.config = c, .groups = groups}),
        set(bind_random(moe.parameters(), seed)) {}
  scalelab::testing::MoEReference reference(const Tensor& x) const {
    return moe_reference(x, moe.router.value, moe.fc_weight.value, moe.fc_bias.value,
                         moe.proj_weight.value, moe.proj_bias.value, moe.config(), moe.groups());
  }
};

void matches_reference(int64_t k, double cf, int64_t groups) {
  const int64_t N = 12, C = 6;
  Layer l(config(4, k, cf), C, groups, 40 + k);
  const Tensor x = uniform({N, C}, 41);
  Tensor y = Tensor::empty({N, C}, f64);
  nn::MoEActivations a;
  l.moe.forward(y, x, a, nn::Mappings::single_device());
  const scalelab::testing::MoEReference r = l.reference(x);
  EXPECT_EQ(a.dropped, r.dropped);
  if (cf < 1) EXPECT_GT(r.dropped, 0) << "the shape must drop some pairs";
  EXPECT_EQ(a.assigned, r.assigned);
  EXPECT_EQ(a.kept_counts, r.kept);
  EXPECT_NEAR(a.aux, r.aux, 1e-12);
  const std::vector<double> got = y.to_vector();
  for (int64_t i = 0; i < N * C; ++i) EXPECT_NEAR(got[i], r.y[i], 1e-12) << i;
}
}  // namespace

TEST(MoELayer, Top1EqualsTheMaskedDenseReference) { matches_reference(1, 1.0, 1); }
TEST(MoELayer, Top2WithDropsAndGroupsEqualsTheMaskedDenseReference) {
  matches_reference(2, 0.5, 2);  // capacity 0.5 * 6 * 2 / 4 = 2 of a group's 12 pairs: drops
}

namespace {
void gradients_pass(int64_t k, double cf) {
  const int64_t N = 8, C = 4;
  Layer l(config(3, k, cf), C, 2, 50 + k);
  Tensor x = uniform({N, C}, 51), R = uniform({N, C}, 52);
  nn::MoEActivations a;
  auto loss = [&] {
    Tensor y = Tensor::empty({N, C}, f64);
    l.moe.forward(y, x, a, nn::Mappings::single_device());
    return dot(y, R) + a.aux;  // the balancing loss's gradient is checked too
  };
  loss();
  EXPECT_GT(a.aux, 0);
  l.set.zero_grad();
  Tensor dx = Tensor::zeros({N, C}, f64);
  l.moe.backward(dx, R, a, nn::Mappings::single_device(), 1.0);
  EXPECT_GRAD_OK(gradcheck(x, dx, loss), "dx");
  for (nn::Parameter* p : l.moe.parameters())
    EXPECT_GRAD_OK(gradcheck(p->value, p->grad, loss), p->name);
}
}  // namespace

TEST(MoELayer, Top1GradientsAgainstFiniteDifferences) { gradients_pass(1, 1.0); }
TEST(MoELayer, Top2GradientsWithDropsAgainstFiniteDifferences) { gradients_pass(2, 0.7); }

// A forward reads two things back to the host, each once whatever the number of routing groups:
// the routed and kept counts (they size the experts' buffers) and the balancing loss's column
// sums. On a GPU each read waits for every kernel queued before it: not one per count or group.
// The counts size the dispatch's buffers: one read back a layer. The balancing loss stays on the
// device (the column sums' dot product with the counts' weights).
TEST(MoELayer, AForwardReadsOnlyTheCounts) {
  for (int64_t groups : {1, 3}) {
    Layer l(config(4, 2, 1.0), 4, groups, 70);
    const Tensor x = uniform({12, 4}, 71);
    Tensor y = Tensor::empty({12, 4}, f64);
    nn::MoEActivations a;
    const int64_t before = host_reads();
    l.moe.forward(y, x, a, nn::Mappings::single_device());
    EXPECT_EQ(host_reads() - before, 1) << groups << " routing groups";
    EXPECT_TRUE(a.aux.tensor().defined()) << "the balancing loss as a tensor on the layer's device";
  }
}

TEST(MoELayer, BalancingLossGradientIsNotZero) {
  // With the LM term off (R = 0) the router's gradient is the balancing loss's alone.
  Layer l(config(3, 2, 1.0, 1.0), 4, 1, 60);
  Tensor x = uniform({6, 4}, 61);
  nn::MoEActivations a;
  Tensor y = Tensor::empty({6, 4}, f64);
  l.moe.forward(y, x, a, nn::Mappings::single_device());
  l.set.zero_grad();
  Tensor dx = Tensor::zeros({6, 4}, f64);
  l.moe.backward(dx, Tensor::zeros({6, 4}, f64), a, nn::Mappings::single_device(), 1.0);
  EXPECT_GT(ops::sum_squares(l.moe.router.grad), 1e-8);
  EXPECT_EQ(ops::sum_squares(l.moe.fc_weight.grad), 0.0);
}

TEST(MoEGPT, TinyMoELossIncludesTheBalancingLossAndGradientsPass) {
  ModelConfig c = model_config("tiny-moe");
  c.block_size = 4;
  nn::GPT model(c, {.dtype = f64, .seed = 7});
  ASSERT_TRUE(model.block(1).moe != nullptr);
  ASSERT_TRUE(model.block(0).moe == nullptr);
  fill_uniform(model.params().values(), 8, -0.3, 0.3);
  const Tensor tokens = random_tokens({2, 4}, 256, 9), targets = random_tokens({2, 4}, 256, 10);
  nn::GPTActivations acts;
  auto loss = [&] { return model.forward(tokens, targets, acts); };
  const double total = loss();
  EXPECT_GT(acts.aux_loss, 0);
  EXPECT_NEAR(total - acts.aux_loss, model.loss(tokens, targets), 1e-12);
  model.zero_grad();
  model.backward(acts);
  for (nn::Parameter* p : model.block(1).moe->parameters())
    EXPECT_GRAD_OK(gradcheck(p->value, p->grad, loss, 60), p->name);
}

TEST(MoEGPT, AnEpRankHoldsItsExpertsOfTheSingleDevice) {
  const ModelConfig c = model_config("tiny-moe");
  nn::GPT whole(c, {.seed = 3});
  const std::size_t before = memory_stats(Device::cpu()).current;
  nn::GPT half(c, {.seed = 3, .moe = {.ep_rank = 1, .ep_size = 2}});
  const std::size_t held = memory_stats(Device::cpu()).current - before;
  const nn::MoE& w = *whole.block(1).moe;
  const nn::MoE& h = *half.block(1).moe;
  EXPECT_EQ(h.first_expert(), 2);
  EXPECT_EQ(h.fc_weight.value.size(0), 2);
  const std::vector<double> a = w.fc_weight.value.rows(2, 4).clone().to_vector();
  EXPECT_EQ(h.fc_weight.value.to_vector(), a);
  EXPECT_LT(held, static_cast<std::size_t>(whole.num_parameters()) * 4 * 2);  // values + grads
  EXPECT_EQ(whole.num_parameters(), parameter_count(c));
}
