// Lab 12 step 1: the router, on one device, in f64.
//  - At shapes drawn at grading time (seeded; a failure prints the grading seed, the shape and
//    the line that draws them again): every field of the Routing against the test's own count:
//    the routed, kept and dropped counts (tests/common/moe_reference.hpp's hand count: per
//    expert, first choices first, in token order), the balancing loss (1e-12), the capacity,
//    the probabilities, the top-k values and experts and every pair's gate, dropped ones too
//    (1e-12), and each pair's row in the dispatched layout (dest: expert-major, then arrival;
//    -1 where dropped). Shape 0 drops for certain, shape 1 is top-1 and shape 2 top-2 whatever
//    the seed, shape 3's capacity factor is above E (the capacity stops at the N k pairs). And
//    route() does no matrix multiply (work_stats): routing given logits is not a layer's GEMM.
//  - The backward against central differences (kGradTol, gradcheck.hpp) of L = sum(gates * R) +
//    0.37 aux, route_backward called with aux_scale 0.37 on a dlogits that holds 1.0 (it is
//    set): the gates' path and the balancing loss's, scaled, top-1 and top-2, with drops; top-1's
//    gates are its values.
// Planted (solutions/12_*/planted/cheats.plant): capacity ignored fails the hand count;
// capacity left 0, or not clamped at N k, fails the capacity; dest left unset fails dest; the
// balancing loss without its gradient, or not scaled by aux_scale, or dlogits added to, fails
// the finite differences; top-1 gates renormalised fail the gates and f per token the balancing
// loss (on every seed); the library's nn::MoE doing the routing fails the FLOPs.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "tests/12_expert_parallel/ep_checks.hpp"
#include "tests/support/on_sim.hpp"

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
    // top-1 and top-2 on every seed (a mistake of one k alone shows whatever the seed draws)
    if (nth == 1) s.k = 1;
    if (nth == 2) s.k = 2;
    // more than E: ceil(cf N k / E) is above the N k pairs, and the capacity stops at N k
    if (nth == 3) s.cf = static_cast<double>(s.E) + 0.5;
    SCOPED_TRACE(s.str());
    const Router in(s);
    const MoEConfig c = s.config();
    const ops::WorkCount w0 = ops::work_stats();
    const lab12::Routing r = lab12::route(in.logits, c);
    // the router's GEMM (x W_r^T) is the layer's; routing its logits is softmax, top-k, counts
    const int64_t flops = (ops::work_stats() - w0).matmul_flops;
    if (flops != 0)
      LABTEST_FAIL() << "route() did " << flops << " matrix multiply FLOPs: routing the given "
                     << "logits needs none (the layer computed them); route them yourself";
    const MoEReference want = moe_reference(
        in.x, in.w, Tensor::zeros({s.E, 1, s.C}, DType::f64), Tensor::zeros({s.E, 1}, DType::f64),
        Tensor::zeros({s.E, s.C, 1}, DType::f64), Tensor::zeros({s.E, s.C}, DType::f64), c, 1);
    const Expected w = expected(in.logits, want, s);
    const auto list = [](const std::vector<int64_t>& v) { return fmt::format("{}", v); };
    if (r.dropped != want.dropped)
      LABTEST_FAIL() << "Routing::dropped: " << r.dropped << " dropped pairs, the hand count "
                     << want.dropped;
    if (r.assigned != want.assigned)
      LABTEST_FAIL() << "Routing::assigned (pairs routed to each expert): " << list(r.assigned)
                     << ", the hand count " << list(want.assigned);
    if (r.kept != want.kept)
      LABTEST_FAIL() << "Routing::kept (pairs each expert keeps): " << list(r.kept)
                     << ", the hand count " << list(want.kept);
    if (!(std::abs(r.aux - want.aux) <= 1e-12))
      LABTEST_FAIL() << "Routing::aux, the balancing loss: " << r.aux << ", the hand count "
                     << want.aux << " (1e-12)";
    if (r.capacity != w.capacity)
      LABTEST_FAIL() << "Routing::capacity: " << r.capacity << ", but an expert may take "
                     << w.capacity << " pairs at this shape (the capacity factor's share of the "
                     << "N k pairs, at most all of them)";
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
        if (static_cast<int>(idx[p]) != e) {
          LABTEST_FAIL() << "Routing::indices: token " << n << " choice " << j << " is expert "
                         << idx[p] << ", not " << e << " (choice j: the j-th most probable)";
          return;
        }
        if (!(std::abs(v[p] - w.probs[n * s.E + e]) <= 1e-12)) {
          LABTEST_FAIL() << "Routing::values: token " << n << " choice " << j << " is " << v[p]
                         << ", not its probability " << w.probs[n * s.E + e];
          return;
        }
        // every pair's gate, dropped ones too: its probability (top-1), or its share of the
        // token's k chosen probabilities
        double chosen = 0;
        for (int64_t i = 0; i < s.k; ++i) chosen += w.probs[n * s.E + want.chosen[n * s.k + i]];
        const double gate = s.k == 1 ? w.probs[n * s.E + e] : w.probs[n * s.E + e] / chosen;
        if (std::abs(g[p] - gate) > 1e-12) {
          LABTEST_FAIL() << "Routing::gates: token " << n << " choice " << j << " is " << g[p]
                         << ", not " << gate << (want.gate[n * s.E + e] == 0 ? " (dropped)" : "")
                         << " (top-" << s.k << ")";
          return;
        }
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
  if (k == 1 && r.gates.to_vector() != r.values.to_vector())
    LABTEST_FAIL() << "top-1: Routing::gates are not Routing::values (a token's one gate is its "
                   << "probability, not renormalised)";
  // dlogits comes in holding 1.0 everywhere: route_backward sets it, whatever it held
  Tensor dlogits = Tensor::empty({s.N, s.E}, DType::f64);
  ops::fill(dlogits, 1.0);
  lab12::route_backward(dlogits, R, r, c, kAuxScale);
  EXPECT_GRAD_OK(gradcheck(in.logits, dlogits, loss),
                 "dlogits of sum(gates R) + 0.37 aux, route_backward(..., aux_scale 0.37; "
                 "dlogits came in holding 1.0: it is set, not added to)");
}
}  // namespace

TEST(Step1_Router, Top1BackwardAgainstFiniteDifferences) { backward_passes(1, 0.75); }
TEST(Step1_Router, Top2BackwardAgainstFiniteDifferences) { backward_passes(2, 0.75); }

// route and route_backward again with their tensors on the simulated GPU (tests/support/on_sim.hpp):
// the host's routing, counts, loss and dlogits bit for bit. A tensor made without the logits'
// device, or a loop over the probabilities or the indices, stops with the op's or the tensor's
// own line, as it would on a GPU.
TEST(Step1_Router, RunsOnTheSimulatedGpuAsOnTheHost) {
  const eptest::Shape s{.seed = 31, .N = 16, .C = 4, .E = 4, .k = 2, .cf = 0.75};
  SCOPED_TRACE(s.str());
  const MoEConfig c = s.config(0.3);
  const Router in(s);
  const Device sim = Device::sim();
  const Tensor dgates = uniform({s.N * s.k}, 12);
  const lab12::Routing want = lab12::route(in.logits, c);
  Tensor dlogits = Tensor::empty({s.N, s.E}, DType::f64);
  lab12::route_backward(dlogits, dgates, want, c, kAuxScale);
  std::vector<std::string> problems;
  problems.push_back(labtest::runs_on_sim([&] {
    const lab12::Routing got = lab12::route(in.logits.to(sim), c);
    const auto same = [&](const char* what, const Tensor& host, const Tensor& on_sim) {
      problems.push_back(labtest::same_on_sim(fmt::format("Routing::{}", what), host, on_sim));
    };
    same("probs", want.probs, got.probs);
    same("values", want.values, got.values);
    same("indices", want.indices, got.indices);
    same("gates", want.gates, got.gates);
    same("dest", want.dest, got.dest);
    if (got.assigned != want.assigned || got.kept != want.kept || got.capacity != want.capacity ||
        got.dropped != want.dropped || got.aux != want.aux)
      problems.push_back(fmt::format(
          "the counts or the balancing loss on the simulated GPU (assigned {}, kept {}, aux {}) "
          "are not the host's (assigned {}, kept {}, aux {})", fmt::join(got.assigned, " "),
          fmt::join(got.kept, " "), got.aux, fmt::join(want.assigned, " "),
          fmt::join(want.kept, " "), want.aux));
    Tensor dlogits_s = Tensor::empty({s.N, s.E}, DType::f64, sim);
    lab12::route_backward(dlogits_s, dgates.to(sim), got, c, kAuxScale);
    same("route_backward's dlogits", dlogits, dlogits_s);
  }));
  const std::string all = labtest::joined(problems);
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}
