// Lab 12 step 1: the router, on one device, in f64.
//  - At shapes drawn at grading time (seeded; a failure prints the grading seed, the shape and
//    the line that draws them again): every field of the Routing against the test's own count:
//    the routed, kept and dropped counts (tests/common/moe_reference.hpp's hand count: per
//    expert, first choices first, in token order), the balancing loss (1e-12), the capacity,
//    the probabilities, the top-k values and experts and the gates (1e-12), and each pair's row
//    in the dispatched layout (dest: expert-major, then arrival; -1 where dropped).
//  - The backward against central differences (kGradTol, gradcheck.hpp) of L = sum(gates * R) +
//    0.37 aux, route_backward called with aux_scale 0.37: the gates' path and the balancing
//    loss's, scaled, top-1 and top-2, with drops.
// Planted (solutions/12_*/planted/cheats.plant): capacity ignored fails the hand count;
// capacity left 0 fails the capacity; dest left unset fails dest; the balancing loss without its gradient, or its
// gradient not scaled by aux_scale, fails the finite differences.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

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

// What route must give beyond the reference's counts, worked out here from the logits.
struct Expected {
  std::vector<double> probs;  // (N, E) softmax
  std::vector<int> dest;      // (N k) the dispatched row of pair n k + j, -1 if dropped
  int64_t capacity = 0;
};

Expected expected(const Tensor& logits, const MoEReference& ref, const eptest::Shape& s) {
  Expected w;
  const std::vector<double> l = logits.to_vector();
  w.probs.resize(s.N * s.E);
  for (int64_t n = 0; n < s.N; ++n) {
    double mx = -1e300, sum = 0;
    for (int64_t e = 0; e < s.E; ++e) mx = std::max(mx, l[n * s.E + e]);
    for (int64_t e = 0; e < s.E; ++e) sum += w.probs[n * s.E + e] = std::exp(l[n * s.E + e] - mx);
    for (int64_t e = 0; e < s.E; ++e) w.probs[n * s.E + e] /= sum;
  }
  w.capacity = std::min<int64_t>(
      static_cast<int64_t>(std::ceil(s.cf * static_cast<double>(s.N * s.k) / s.E)), s.N * s.k);
  // expert e's rows start after the kept rows of experts 0..e-1; within e, the pairs in the
  // hand count's order (first choices in token order, then second choices)
  std::vector<int64_t> start(s.E, 0), taken(s.E, 0);
  for (int64_t e = 1; e < s.E; ++e) start[e] = start[e - 1] + ref.kept[e - 1];
  w.dest.assign(s.N * s.k, -1);
  for (int64_t j = 0; j < s.k; ++j)
    for (int64_t n = 0; n < s.N; ++n) {
      const int e = ref.chosen[n * s.k + j];
      if (taken[e] < w.capacity) w.dest[n * s.k + j] = static_cast<int>(start[e] + taken[e]++);
    }
  return w;
}

// "" when `t` is a defined (rows, cols) tensor of `dtype` (cols 0: a vector of `rows`).
std::string shape_problem(const char* name, const Tensor& t, int64_t rows, int64_t cols,
                          DType dtype) {
  const std::vector<int64_t> want = cols ? std::vector<int64_t>{rows, cols}
                                         : std::vector<int64_t>{rows};
  if (!t.defined()) return fmt::format("Routing::{} was left unset", name);
  if (t.shape() != want || t.dtype() != dtype)
    return fmt::format("Routing::{} is {}, not ({}{}) {}", name, t.str(), rows,
                       cols ? fmt::format(", {}", cols) : "", dtype_name(dtype));
  return "";
}
}  // namespace

TEST(Step1_Router, CountsGatesAndLossAgainstAHandCountAtADrawnShape) {
  for (int nth = 0; nth < 4; ++nth) {
    eptest::Shape s = eptest::draw_shape(nth);
    if (nth == 0) s.cf = 0.5, s.N = std::max<int64_t>(s.N, 16);  // drops for certain
    SCOPED_TRACE(s.str());
    const Router in(s);
    const MoEConfig c = s.config();
    const lab12::Routing r = lab12::route(in.logits, c);
    const MoEReference want = moe_reference(
        in.x, in.w, Tensor::zeros({s.E, 1, s.C}, DType::f64), Tensor::zeros({s.E, 1}, DType::f64),
        Tensor::zeros({s.E, s.C, 1}, DType::f64), Tensor::zeros({s.E, s.C}, DType::f64), c, 1);
    const Expected w = expected(in.logits, want, s);
    EXPECT_EQ(r.dropped, want.dropped) << "dropped pairs";
    EXPECT_EQ(r.assigned, want.assigned) << "pairs routed to each expert";
    EXPECT_EQ(r.kept, want.kept) << "pairs each expert keeps";
    EXPECT_NEAR(r.aux, want.aux, 1e-12) << "the balancing loss";
    EXPECT_EQ(r.capacity, w.capacity)
        << "Routing::capacity: the pairs an expert may take (ceil(capacity_factor N k / E), at "
        << "most N k)";
    for (const std::string& p :
         {shape_problem("probs", r.probs, s.N, s.E, DType::f64),
          shape_problem("values", r.values, s.N, s.k, DType::f64),
          shape_problem("indices", r.indices, s.N, s.k, DType::i32),
          shape_problem("gates", r.gates, s.N, s.k, DType::f64),
          shape_problem("dest", r.dest, s.N * s.k, 0, DType::i32)})
      if (!p.empty()) LABTEST_FAIL() << p;
    if (HasFailure()) return;  // the shapes are wrong: nothing below can be read
    const std::vector<double> probs = r.probs.to_vector();
    for (int64_t i = 0; i < s.N * s.E; ++i)
      if (std::abs(probs[i] - w.probs[i]) > 1e-12) {
        LABTEST_FAIL() << "Routing::probs: token " << i / s.E << " expert " << i % s.E << " is "
                      << probs[i] << ", not the softmax of its logits";
        break;
      }
    const std::vector<double> idx = r.indices.to_vector(), g = r.gates.to_vector(),
                              v = r.values.to_vector(), d = r.dest.to_vector();
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t j = 0; j < s.k; ++j) {
        const int64_t p = n * s.k + j;
        const int e = want.chosen[p];
        EXPECT_EQ(static_cast<int>(idx[p]), e)
            << "Routing::indices: token " << n << " choice " << j;
        EXPECT_NEAR(v[p], w.probs[n * s.E + e], 1e-12)
            << "Routing::values: token " << n << " choice " << j << " (its probability)";
        // the gate, where the pair was kept (the reference masks dropped ones)
        if (want.gate[n * s.E + e] != 0)
          EXPECT_NEAR(g[p], want.gate[n * s.E + e], 1e-12)
              << "Routing::gates: token " << n << " choice " << j;
        const int got = static_cast<int>(d[p]);
        if (got == w.dest[p]) continue;
        if (w.dest[p] < 0)
          LABTEST_FAIL() << "Routing::dest: token " << n << " choice " << j << " (expert " << e
                        << ") has row " << got << ", but expert " << e << " is full before it: "
                        << "a dropped pair's dest is -1";
        else if (got < 0)
          LABTEST_FAIL() << "Routing::dest: token " << n << " choice " << j << " (expert " << e
                        << ") is dropped (-1), but expert " << e << " has room for it";
        else
          LABTEST_FAIL() << "Routing::dest: token " << n << " choice " << j << " (expert " << e
                        << ") has row " << got << ", not its row of the dispatched layout "
                        << "(expert 0's kept pairs first, each expert's in arrival order: every "
                        << "first choice in token order, then every second)";
        return;  // one pair says it; the rest would repeat it
      }
  }
}

namespace {
constexpr double kAuxScale = 0.37;  // the loss scale route_backward must apply to aux's gradient

void backward_passes(int64_t k, double cf) {
  eptest::Shape s{.seed = 5 + static_cast<uint64_t>(k), .N = 12, .C = 4, .E = 3, .k = k, .cf = cf};
  SCOPED_TRACE(s.str());
  const MoEConfig c = s.config(0.3);
  Router in(s);
  const Tensor R = uniform({s.N * k}, 11);
  auto loss = [&] {
    const lab12::Routing r = lab12::route(in.logits, c);
    return dot(r.gates.view({s.N * k}), R) + kAuxScale * r.aux;
  };
  const lab12::Routing r = lab12::route(in.logits, c);
  if (cf < 1) EXPECT_GT(r.dropped, 0) << "the shape must drop some pairs";
  Tensor dlogits = Tensor::zeros({s.N, s.E}, DType::f64);
  lab12::route_backward(dlogits, R, r, c, kAuxScale);
  EXPECT_GRAD_OK(gradcheck(in.logits, dlogits, loss),
                 "dlogits of sum(gates R) + 0.37 aux, route_backward(..., aux_scale 0.37)");
}
}  // namespace

TEST(Step1_Router, Top1BackwardAgainstFiniteDifferences) { backward_passes(1, 0.75); }
TEST(Step1_Router, Top2BackwardAgainstFiniteDifferences) { backward_passes(2, 0.75); }
