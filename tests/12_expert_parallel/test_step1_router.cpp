// Lab 12 step 1: the router, on one device, in f64.
//  - At a shape drawn at grading time (seeded; the seed and shape are printed on failure, never
//    the expected values): the chosen experts, the gates (1e-12), the routed, kept and dropped
//    counts against a hand count (tests/common/moe_reference.hpp: per expert, first choices
//    first, in token order) and the balancing loss (1e-12).
//  - The backward against central differences (kGradTol, gradcheck.hpp) of L = sum(gates * R) +
//    aux: the gates' path and the balancing loss's, top-1 and top-2, with drops.
// Planted (solutions/12_expert_parallel/planted/cheats.plant): capacity ignored fails the hand
// count; the balancing loss
// without its gradient fails the finite differences.
#include <gtest/gtest.h>

#include "tests/12_expert_parallel/ep_checks.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
// logits = x W_r^T of a random layer (its experts are not used here)
struct Router {
  Tensor x, w, logits;
  Router(const eptest::Shape& s) {
    x = uniform({s.N, s.C}, s.seed + 1);
    w = uniform({s.E, s.C}, s.seed + 2);
    logits = Tensor::empty({s.N, s.E}, DType::f64);
    ops::matmul(logits, x, w, false, true);
  }
};
}  // namespace

TEST(Step1_Router, CountsGatesAndLossAgainstAHandCountAtADrawnShape) {
  for (uint64_t extra = 0; extra < 4; ++extra) {
    eptest::Shape s = eptest::draw_shape(eptest::grading_seed() + extra);
    if (extra == 0) s.cf = 0.5, s.N = std::max<int64_t>(s.N, 16);  // drops for certain
    SCOPED_TRACE(s.str());
    const Router in(s);
    const MoEConfig c = s.config();
    const lab12::Routing r = lab12::route(in.logits, c);
    const MoEReference want = moe_reference(
        in.x, in.w, Tensor::zeros({s.E, 1, s.C}, DType::f64), Tensor::zeros({s.E, 1}, DType::f64),
        Tensor::zeros({s.E, s.C, 1}, DType::f64), Tensor::zeros({s.E, s.C}, DType::f64), c, 1);
    EXPECT_EQ(r.dropped, want.dropped) << "dropped pairs";
    EXPECT_EQ(r.assigned, want.assigned) << "pairs routed to each expert";
    EXPECT_EQ(r.kept, want.kept) << "pairs each expert keeps";
    EXPECT_NEAR(r.aux, want.aux, 1e-12) << "the balancing loss";
    ASSERT_TRUE(r.indices.defined() && r.gates.defined());
    const std::vector<double> idx = r.indices.to_vector(), g = r.gates.to_vector();
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t j = 0; j < s.k; ++j) {
        const int e = want.chosen[n * s.k + j];
        EXPECT_EQ(static_cast<int>(idx[n * s.k + j]), e) << "token " << n << " choice " << j;
        // the gate, where the pair was kept (the reference masks dropped ones)
        if (want.gate[n * s.E + e] != 0) EXPECT_NEAR(g[n * s.k + j], want.gate[n * s.E + e], 1e-12);
      }
  }
}

namespace {
void backward_passes(int64_t k, double cf) {
  eptest::Shape s{.seed = 5 + static_cast<uint64_t>(k), .N = 12, .C = 4, .E = 3, .k = k, .cf = cf};
  SCOPED_TRACE(s.str());
  const MoEConfig c = s.config(0.3);
  Router in(s);
  const Tensor R = uniform({s.N * k}, 11);
  auto loss = [&] {
    const lab12::Routing r = lab12::route(in.logits, c);
    return dot(r.gates.view({s.N * k}), R) + r.aux;
  };
  const lab12::Routing r = lab12::route(in.logits, c);
  if (cf < 1) EXPECT_GT(r.dropped, 0) << "the shape must drop some pairs";
  Tensor dlogits = Tensor::zeros({s.N, s.E}, DType::f64);
  lab12::route_backward(dlogits, R, r, c, 1.0);
  EXPECT_GRAD_OK(gradcheck(in.logits, dlogits, loss), "dlogits (gates and balancing loss)");
}
}  // namespace

TEST(Step1_Router, Top1BackwardAgainstFiniteDifferences) { backward_passes(1, 0.75); }
TEST(Step1_Router, Top2BackwardAgainstFiniteDifferences) { backward_passes(2, 0.75); }
