// Lab 12 step 2: dispatch and combine on one device, in f64, graded on the LIBRARY's routing
// (nn::MoE's: so without step 1), with the library's experts (nn::MoE::run_experts).
//  - Forward at shapes drawn at grading time (a failure prints the grading seed, the shape and
//    the line that draws them again): the layer's output against the written-out reference
//    that runs EVERY expert on EVERY token and masks by the gates
//    (tests/common/moe_reference.hpp), 1e-12 relative + absolute; dropped tokens give 0 (the
//    residual carries them). Dispatch and combine do no matrix multiply (work_stats).
//  - Backward against central differences (kGradTol), top-2 and top-1, each function's own
//    output first: combine_backward's dye (w.r.t. the experts' outputs ye) and dgates, then the
//    experts' weights (the library's backward, from your dye), then dispatch_backward's dx
//    (routing fixed; dx comes in holding other values: what it added). A failure names every
//    gradient that is off and the function that set it. No matrix multiply in either backward.
//  - Rows stay on their device: none of the four passes as many bytes through the host doors
//    (to_vector, item, from_vector: host_value_bytes) as its rows hold; a few indices may.
//  - On the simulated GPU (Device::sim: host memory that code outside the ops cannot reach, as
//    a GPU's) the four give the host's numbers bit for bit: a loop over the rows through
//    data<T>(), right on the CPU and a crash on a GPU, fails there naming the tensor.
// Planted (solutions/12_*/planted/cheats.plant): combine_backward that leaves dye zero fails dye;
// dgates left 0 at top-1 fails dgates; dispatch_backward setting dx fails dx; a one-hot matrix
// times x for dispatch fails the FLOPs; dispatch by a loop over the tokens on the host fails the
// host bytes (through to_vector/from_vector) or the simulated GPU (through data<T>()).
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/nn/mappings.hpp"
#include "tests/12_expert_parallel/ep_checks.hpp"
#include "tests/support/host_values.hpp"
#include "tests/support/on_sim.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
// The matrix multiply FLOPs of `f`: dispatch, combine and their backwards move and scale rows
// (gathers and index adds); a one-hot (M, N) matrix times x gives the same rows for M N C
// multiply-adds of zeros.
template <class F>
int64_t matmul_flops_of(F&& f) {
  const ops::WorkCount w0 = ops::work_stats();
  f();
  return (ops::work_stats() - w0).matmul_flops;
}
std::string no_flops(const char* what, int64_t flops) {
  if (flops == 0) return "";
  return fmt::format("{} did {} matrix multiply FLOPs: moving rows to their place needs none "
                     "(a one-hot matrix times the rows?): gather and add them by index", what,
                     flops);
}

// "" when `what` passed fewer bytes through the host than `rows` hold (a few indices may).
// Always the tokens' (N, C) rows (x, y, dy, dx), never the experts' (M, C): with every token
// routed to one expert M is that expert's capacity, about N k / 2E at capacity factor 0.5, and
// its rows can hold fewer bytes than the N k i32 pair indices the reference passes; a host loop
// reads or writes all N token rows.
std::string no_host_rows(const char* what, int64_t bytes, const Tensor& rows) {
  return labtest::rows_through_host(what, bytes, rows,
                                    "Move the rows where they go on their device, by index");
}
using labtest::joined;

// The layer with the attendee's dispatch and combine around the library's experts; `technique`
// (when given): dispatch's and combine's own matrix multiplies and host loops, "" if none.
Tensor layer(const eptest::Layer& l, const Tensor& x, const lab12::Routing& r,
             std::vector<Tensor>& kept, Tensor* ye_out = nullptr,
             std::string* technique = nullptr) {
  Tensor xd, y;
  int64_t hd = 0, hc = 0;
  const int64_t fd =
      matmul_flops_of([&] { hd = labtest::host_bytes_of([&] { xd = lab12::dispatch(x, r); }); });
  const Tensor ye = l.moe.run_experts(xd, r.kept, kept);
  if (ye_out) *ye_out = ye;
  const int64_t fc =
      matmul_flops_of([&] { hc = labtest::host_bytes_of([&] { y = lab12::combine(ye, r); }); });
  if (technique)
    *technique = joined({no_flops("dispatch", fd), no_flops("combine", fc),
                         no_host_rows("dispatch", hd, x), no_host_rows("combine", hc, y)});
  return y;
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
    std::string technique;
    const Tensor y = layer(l, x, r, kept, nullptr, &technique);
    if (!technique.empty()) LABTEST_FAIL() << technique;
    ASSERT_EQ(y.shape(), x.shape());
    const MoEReference want = l.reference(x);
    const std::vector<double> got = y.to_vector();
    for (int64_t i = 0; i < s.N * s.C; ++i)
      ASSERT_NEAR(got[i], want.y[i], 1e-12 * (1 + std::abs(want.y[i])))
          << "token " << i / s.C << " column " << i % s.C;
  }
}

namespace {
void backward_passes(int64_t k) {
  const eptest::Shape s{.seed = 19 + static_cast<uint64_t>(k), .N = 10, .C = 4, .E = 3, .k = k,
                        .cf = 0.7};
  SCOPED_TRACE(s.str());
  eptest::Layer l(s.config(), s.C, s.seed);
  Tensor x = uniform({s.N, s.C}, 20 + k), R = uniform({s.N, s.C}, 21 + k);
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
  int64_t host_c = 0, host_d = 0;
  const int64_t flops_c = matmul_flops_of([&] {
    host_c = labtest::host_bytes_of([&] { lab12::combine_backward(dye, dgates, R, ye, r); });
  });
  const Tensor dxd = l.moe.run_experts_backward(dye, r.kept, kept);
  // dx comes in holding D0 (another path's gradient): dispatch_backward adds to it
  const Tensor d0 = uniform({s.N, s.C}, 24);
  Tensor dx = d0.clone();
  const int64_t flops_d = matmul_flops_of([&] {
    host_d = labtest::host_bytes_of([&] { lab12::dispatch_backward(dx, dxd, r); });
  });
  const std::string technique =
      joined({no_flops("combine_backward", flops_c), no_flops("dispatch_backward", flops_d),
              no_host_rows("combine_backward", host_c, R),
              no_host_rows("dispatch_backward", host_d, dx)});
  if (!technique.empty()) LABTEST_FAIL() << technique;
  ops::axpy(dx, -1.0, d0);  // what dispatch_backward added
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
  check(gradcheck(x, dx, loss),
        "dx (dispatch_backward: what it added to the dx it was given; it accumulates)");
  if (!off.empty())
    LABTEST_FAIL() << "gradients off the finite differences: " << off << "; the first, " << worst;
}
}  // namespace

TEST(Step2_DispatchCombine, BackwardAgainstFiniteDifferences) { backward_passes(2); }
// top-1: the gate is the token's one probability, and its gradient still reaches the router
TEST(Step2_DispatchCombine, Top1BackwardAgainstFiniteDifferences) { backward_passes(1); }

// The four on the simulated GPU: the same numbers as on the host, bit for bit (the same CPU
// kernels run), and no element read outside an op. A failure is the tensor's own error line
// ("host code reached the elements of (N, C) f64 sim through data<T>(), outside an op").
TEST(Step2_DispatchCombine, RunsOnTheSimulatedGpuAsOnTheHost) {
  const eptest::Shape s = eptest::draw_shape(200);
  SCOPED_TRACE(s.str());
  const eptest::Layer l(s.config(), s.C, s.seed);
  const Tensor x = uniform({s.N, s.C}, s.seed + 3);
  const lab12::Routing r = l.library_routing(x);
  const Device sim = Device::sim();
  lab12::Routing rs = r;  // the same routing with its tensors on the simulated GPU
  for (Tensor* t : {&rs.probs, &rs.values, &rs.indices, &rs.gates, &rs.dest})
    if (t->defined()) *t = t->to(sim);
  const auto same = labtest::same_on_sim;
  std::vector<std::string> problems;
  problems.push_back(labtest::runs_on_sim([&] {
    const Tensor xd = lab12::dispatch(x, r), xd_s = lab12::dispatch(x.to(sim), rs);
    problems.push_back(same("dispatch's rows", xd, xd_s));
    // any rows stand in for the experts' outputs: combine only moves and weighs them
    const Tensor ye = uniform(xd.shape(), s.seed + 5), dy = uniform({s.N, s.C}, s.seed + 6);
    problems.push_back(same("combine's y", lab12::combine(ye, r), lab12::combine(ye.to(sim), rs)));
    Tensor dye = Tensor::empty(ye.shape(), DType::f64), dgates = Tensor::empty({s.N * s.k}, DType::f64);
    Tensor dye_s = dye.to(sim), dgates_s = dgates.to(sim);
    lab12::combine_backward(dye, dgates, dy, ye, r);
    lab12::combine_backward(dye_s, dgates_s, dy.to(sim), ye.to(sim), rs);
    problems.push_back(same("combine_backward's dye", dye, dye_s));
    problems.push_back(same("combine_backward's dgates", dgates, dgates_s));
    Tensor dx = uniform({s.N, s.C}, s.seed + 7);
    Tensor dx_s = dx.to(sim);
    lab12::dispatch_backward(dx, dye, r);
    lab12::dispatch_backward(dx_s, dye.to(sim), rs);
    problems.push_back(same("dispatch_backward's dx", dx, dx_s));
  }));
  const std::string all = joined(problems);
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}
