// Lab 12 step 2: dispatch and combine on one device, in f64, graded on the LIBRARY's routing
// (nn::MoE's: so without step 1), with the library's experts (nn::MoE::run_experts).
//  - Forward at shapes drawn at grading time (a failure prints the grading seed, the shape and
//    the line that draws them again): the layer's output against the written-out reference
//    that runs EVERY expert on EVERY token and masks by the gates
//    (tests/common/moe_reference.hpp), 1e-12 relative + absolute; dropped tokens give 0 (the
//    residual carries them).
//  - Backward against central differences (kGradTol), each function's own output first:
//    combine_backward's dye (w.r.t. the experts' outputs ye) and dgates, then the experts'
//    weights (the library's backward, from your dye), then dispatch_backward's dx (routing
//    fixed). A failure names every gradient that is off and the function that set it.
// Planted (solutions/12_*/planted/cheats.plant): combine_backward that leaves dye zero fails dye.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/nn/mappings.hpp"
#include "tests/12_expert_parallel/ep_checks.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
// The layer with the attendee's dispatch and combine around the library's experts.
Tensor layer(const eptest::Layer& l, const Tensor& x, const lab12::Routing& r,
             std::vector<Tensor>& kept, Tensor* ye_out = nullptr) {
  const Tensor xd = lab12::dispatch(x, r);
  const Tensor ye = l.moe.run_experts(xd, r.kept, kept);
  if (ye_out) *ye_out = ye;
  return lab12::combine(ye, r);
}
}  // namespace

TEST(Step2_DispatchCombine, EqualsTheMaskedDenseReferenceAtADrawnShape) {
  for (int nth = 0; nth < 3; ++nth) {
    const eptest::Shape s = eptest::draw_shape(100 + nth);
    SCOPED_TRACE(s.str());
    const eptest::Layer l(s.config(), s.C, s.seed);
    const Tensor x = uniform({s.N, s.C}, s.seed + 3);
    const lab12::Routing r = l.library_routing(x);
    std::vector<Tensor> kept;
    const Tensor y = layer(l, x, r, kept);
    ASSERT_EQ(y.shape(), x.shape());
    const MoEReference want = l.reference(x);
    const std::vector<double> got = y.to_vector();
    for (int64_t i = 0; i < s.N * s.C; ++i)
      ASSERT_NEAR(got[i], want.y[i], 1e-12 * (1 + std::abs(want.y[i])))
          << "token " << i / s.C << " column " << i % s.C;
  }
}

TEST(Step2_DispatchCombine, BackwardAgainstFiniteDifferences) {
  const eptest::Shape s{.seed = 21, .N = 10, .C = 4, .E = 3, .k = 2, .cf = 0.7};
  SCOPED_TRACE(s.str());
  eptest::Layer l(s.config(), s.C, s.seed);
  Tensor x = uniform({s.N, s.C}, 22), R = uniform({s.N, s.C}, 23);
  lab12::Routing r = l.library_routing(x);  // fixed: the routing's own gradient is step 1's
  ASSERT_GT(r.dropped, 0) << "the shape must drop some pairs";
  auto loss = [&] {
    std::vector<Tensor> kept;
    return dot(layer(l, x, r, kept), R);
  };
  std::vector<Tensor> kept;
  Tensor ye;
  layer(l, x, r, kept, &ye);
  l.set.zero_grad();
  Tensor dye = Tensor::empty(ye.shape(), DType::f64);
  Tensor dgates = Tensor::empty({s.N * s.k}, DType::f64);
  lab12::combine_backward(dye, dgates, R, ye, r);
  const Tensor dxd = l.moe.run_experts_backward(dye, r.kept, kept);
  Tensor dx = Tensor::zeros({s.N, s.C}, DType::f64);
  lab12::dispatch_backward(dx, dxd, r);
  // every gradient checked; the failure lists each one off, and the first one's worst element
  std::string off, worst;
  const auto check = [&](const GradCheck& g, const std::string& what) {
    if (g.checked > 0 && g.max_error < kGradTol) return;
    off += (off.empty() ? "" : ", ") + what;
    if (worst.empty())
      worst = fmt::format("{}: element {} analytic {} numeric {}", what, g.worst, g.analytic,
                          g.numeric);
  };
  // dye against the differences of the loss in ye itself (combine's input)
  check(gradcheck(ye, dye, [&] { return dot(lab12::combine(ye, r), R); }),
        "dye (combine_backward)");
  Tensor gates = r.gates.view({s.N * s.k});
  check(gradcheck(gates, dgates, loss), "dgates (combine_backward)");
  for (nn::Parameter* p : l.moe.expert_parameters())
    check(gradcheck(p->value, p->grad, loss), p->name + " (the library's experts, from your dye)");
  check(gradcheck(x, dx, loss), "dx (dispatch_backward)");
  if (!off.empty())
    LABTEST_FAIL() << "gradients off the finite differences: " << off << "; the first, " << worst;
}
