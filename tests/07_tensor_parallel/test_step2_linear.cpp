// Lab 07 step 2: column- and row-parallel Linear against the single-device nn::Linear, float64.
// The single-device layer gets random values (biases included, so a bias counted tp times shows);
// the sharded layer holds the attendee's shard of those same values. Checked:
//  - what each rank HOLDS: the weight's local shape (out/tp, in) or (out, in/tp);
//  - what it COMPUTES: its output features (column) or the whole output (row), dx, dW, db, within
//    kRel = 1e-12 of the largest value (the sharded GEMM and the all-reduce sum in another order);
//  - what it SENDS (the library's traffic ledger, every communicator): column: nothing forward,
//    one sum all-reduce of dx (N x in) backward; row: one sum all-reduce of y (N x out) forward,
//    nothing backward;
//  - what it WORKS (the tensor ops' counters): exactly 1/tp of the single-device layer's GEMM
//    FLOPs each way;
//  - what it ALLOCATES (the allocator's peak above the start of the call): the tensor it returns
//    and nothing else (y forward, dx backward).
#include <gtest/gtest.h>

#include <functional>

#include <fmt/format.h>

#include "common/allocator.hpp"
#include "common/nn/linear.hpp"
#include "common/ops/ops.hpp"
#include "tensor_parallel.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"
#include "tp_formulas.hpp"
#include "tp_test_support.hpp"

using namespace scalelab;
using namespace lab07test;

namespace {

constexpr int64_t kIn = 8, kOut = 12, kB = 2, kT = 3, kN = kB * kT;

// A column- or row-parallel implementation, as the check sees it (the attendee's by default;
// the planted faults below replace a piece).
struct Impl {
  std::function<nn::Shard(int64_t, int, int)> shard;
  std::function<Tensor(const nn::Linear&, const Tensor&, comm::Communicator&)> forward;
  std::function<Tensor(nn::Linear&, const Tensor&, const Tensor&, comm::Communicator&)> backward;
};
Impl column_impl() {
  return {lab07::column_shard, lab07::column_parallel_forward, lab07::column_parallel_backward};
}
Impl row_impl() {
  return {lab07::row_shard, lab07::row_parallel_forward, lab07::row_parallel_backward};
}

// Written here, so the planted faults (each replaces one piece) never call the attendee's code.
nn::Shard even(int dim, int64_t n, int r, int tp) { return nn::Shard{dim, {{r * n / tp, (r + 1) * n / tp}}}; }
Impl planted_column_base() {
  return {[](int64_t n, int r, int tp) { return even(0, n, r, tp); },
          [](const nn::Linear& layer, const Tensor& x, comm::Communicator&) {
            Tensor y = Tensor::empty({kB, kT, layer.out_features()}, DType::f64);
            layer.forward(y, x);
            return y;
          },
          [](nn::Linear& layer, const Tensor& dy, const Tensor& x, comm::Communicator& c) {
            Tensor dx = Tensor::zeros(x.shape(), x.dtype());
            layer.backward(dx, dy, x);
            c.all_reduce(dx);
            return dx;
          }};
}
Impl planted_row_base() {
  return {[](int64_t n, int r, int tp) { return even(1, n, r, tp); },
          [](const nn::Linear& layer, const Tensor& x, comm::Communicator& c) {
            Tensor y = Tensor::empty({kB, kT, layer.out_features()}, DType::f64);
            layer.forward(y, x);
            c.all_reduce(y);
            layer.add_bias(y);
            return y;
          },
          [](nn::Linear& layer, const Tensor& dy, const Tensor& x, comm::Communicator&) {
            Tensor dx = Tensor::zeros(x.shape(), x.dtype());
            layer.backward(dx, dy, x);
            return dx;
          }};
}

// Runs `fn` and returns what it computed and sent, and the allocator's peak above its start.
Traffic measured(const std::function<void()>& fn, std::size_t& extra_peak) {
  reset_peak_memory(Device::cpu());
  const std::size_t start = memory_stats(Device::cpu()).current;
  const Traffic t = traffic_of(fn);
  extra_peak = memory_stats(Device::cpu()).peak - start;
  return t;
}

// The allocator's peak during a call is the tensor it returns and nothing besides.
::testing::AssertionResult allocates_only(std::size_t extra_peak, int64_t bytes,
                                          const std::string& returned) {
  if (extra_peak <= static_cast<std::size_t>(bytes)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "allocated " << extra_peak << " bytes at its peak (the allocator's statistics); "
         << returned << " it returns is " << bytes << " bytes, and it needs nothing besides";
}

// The single-device layer with random values, and its forward/backward on x, dy.
struct Whole {
  nn::Linear layer{"fc", kIn, kOut};
  nn::ParameterSet set;
  Tensor x = random_tensor({kB, kT, kIn}, 11), dy = random_tensor({kB, kT, kOut}, 12);
  Tensor y = Tensor::empty({kB, kT, kOut}, DType::f64), dx = Tensor::zeros({kB, kT, kIn}, DType::f64);
  ops::WorkCount forward_work, backward_work;  // the single device's (tensor ops' counters)
  Whole() {
    set.bind(layer.parameters(), DType::f64, Device::cpu(), 5);
    set.values().copy_from(random_tensor({set.numel()}, 13));
    const ops::WorkCount start = ops::work_stats();
    layer.forward(y, x);
    const ops::WorkCount mid = ops::work_stats();
    layer.backward(dx, dy, x);
    forward_work = mid - start;
    backward_work = ops::work_stats() - mid;
  }
};

// The sharded layer: the impl's shard of `whole`'s values, on `device`.
struct Part {
  nn::Linear layer;
  nn::ParameterSet set;
  Part(const Whole& whole, const nn::Shard& shard, int64_t in, int64_t out,
       Device device = Device::cpu())
      : layer("fc", in, out, true, 0.02, shard) {
    set.bind(layer.parameters(), DType::f64, device, 5);
    for (nn::Parameter* p : layer.parameters()) {
      const nn::Parameter& w = p == &layer.weight ? whole.layer.weight : whole.layer.bias;
      p->value.copy_from(Tensor::from_vector(cut(w.value, p->shard), p->shape(), DType::f64));
    }
  }
};

::testing::AssertionResult check_column(const Impl& impl) {
  const int tp = size(), r = rank();
  const int64_t n = kOut / tp, lo = r * n;
  Whole whole;
  const nn::Shard shard = impl.shard(kOut, r, tp);
  Part part(whole, shard, kIn, kOut);
  if (!on_every_rank(part.layer.weight.shape() == std::vector<int64_t>{n, kIn} &&
                     !part.layer.row_parallel()))
    return ::testing::AssertionFailure()
           << "rank " << r << " must hold rows [" << lo << ", " << lo + n
           << ") of the weight: a (" << n << ", " << kIn
           << ") column-parallel shard (on every rank)";
  Tensor y;
  std::size_t fwd_peak = 0, bwd_peak = 0;
  const Traffic fwd =
      measured([&] { y = impl.forward(part.layer, whole.x, group()); }, fwd_peak);
  Verdict v;
  v(only_all_reduces(fwd, 0, 0), " (column-parallel forward)");
  v(allocates_only(fwd_peak, kN * n * 8, "the (N, out/tp) y_local"), " (column-parallel forward)");
  v(a_share_of_the_work(fwd, whole.forward_work, tp), " (column-parallel forward)");
  if (!on_every_rank(y.shape() == std::vector<int64_t>{kB, kT, n}))
    return ::testing::AssertionFailure() << "y_local is " << y.str() << ", want (2, 3, " << n
                                         << ") (on every rank)";
  v(near(y, cut(whole.y.view({kN, kOut}), nn::Shard{1, {{lo, lo + n}}})),
    fmt::format(" (y_local: output features [{}, {}))", lo, lo + n));
  const Tensor dy_local = columns(whole.dy.view({kN, kOut}), lo, lo + n).view({kB, kT, n});
  Tensor dx;
  const Traffic bwd = measured(
      [&] { dx = impl.backward(part.layer, dy_local, whole.x, group()); }, bwd_peak);
  v(only_all_reduces(bwd, 1, kN * kIn * 8), " (column-parallel backward: f's all-reduce of dx)");
  v(allocates_only(bwd_peak, kN * kIn * 8, "the (N, in) dx"), " (column-parallel backward)");
  v(a_share_of_the_work(bwd, whole.backward_work, tp), " (column-parallel backward)");
  v(near(dx, whole.dx), " (dx, the whole input gradient)");
  v(near(part.layer.weight.grad, cut(whole.layer.weight.grad, shard)), " (dW rows)");
  v(near(part.layer.bias.grad, cut(whole.layer.bias.grad, shard)), " (db)");
  return v.first;
}

::testing::AssertionResult check_row(const Impl& impl) {
  const int tp = size(), r = rank();
  const int64_t n = kIn / tp, lo = r * n;
  Whole whole;
  const nn::Shard shard = impl.shard(kIn, r, tp);
  Part part(whole, shard, kIn, kOut);
  if (!on_every_rank(part.layer.weight.shape() == std::vector<int64_t>{kOut, n} &&
                     part.layer.row_parallel()))
    return ::testing::AssertionFailure()
           << "rank " << r << " must hold columns [" << lo << ", " << lo + n
           << ") of the weight: a (" << kOut << ", " << n
           << ") row-parallel shard (on every rank)";
  const Tensor x_local = columns(whole.x.view({kN, kIn}), lo, lo + n).view({kB, kT, n});
  Tensor y;
  std::size_t fwd_peak = 0, bwd_peak = 0;
  const Traffic fwd = measured([&] { y = impl.forward(part.layer, x_local, group()); }, fwd_peak);
  Verdict v;
  v(only_all_reduces(fwd, 1, kN * kOut * 8), " (row-parallel forward: g's all-reduce of y)");
  v(allocates_only(fwd_peak, kN * kOut * 8, "the (N, out) y"), " (row-parallel forward)");
  v(a_share_of_the_work(fwd, whole.forward_work, tp), " (row-parallel forward)");
  v(near(y, whole.y), " (y: the bias must count once)");
  Tensor dx;
  const Traffic bwd = measured(
      [&] { dx = impl.backward(part.layer, whole.dy, x_local, group()); }, bwd_peak);
  v(only_all_reduces(bwd, 0, 0), " (row-parallel backward)");
  v(allocates_only(bwd_peak, kN * n * 8, "the (N, in/tp) dx_local"), " (row-parallel backward)");
  v(a_share_of_the_work(bwd, whole.backward_work, tp), " (row-parallel backward)");
  v(near(dx, cut(whole.dx.view({kN, kIn}), nn::Shard{1, {{lo, lo + n}}})),
    fmt::format(" (dx_local: input features [{}, {}))", lo, lo + n));
  v(near(part.layer.weight.grad, cut(whole.layer.weight.grad, shard)), " (dW columns)");
  v(near(part.layer.bias.grad, whole.layer.bias.grad), " (db: whole, the same on every rank)");
  return v.first;
}

}  // namespace

// The base of the planted faults passes the checks (else a failing fault would prove nothing).
TEST(Step2_PlantedFault, TheFaultsBaseItselfPasses) {
  EXPECT_TRUE(check_column(planted_column_base()));
  EXPECT_TRUE(check_row(planted_row_base()));
}

// The lab's sizes, then sizes drawn at grading time (tests/support/drawn.hpp: the seed, the same
// on every rank, printed with every failure); a failure names the rule broken and what came back.
TEST(Step2_Shards, ColumnAndRowShardsCutEvenly) {
  const int tp = size(), r = rank();
  labtest::Drawn draw;
  SCOPED_TRACE("features " + draw.trace());
  const std::vector<int64_t> outs = drawn_sizes(draw, tp, kOut, 8),
                             ins = drawn_sizes(draw, tp, kIn, 8);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    std::string p = shard_problem(fmt::format("column_shard({}, rank {}, tp {})", outs[i], r, tp),
                                  lab07::column_shard(outs[i], r, tp), 0, outs[i], r, tp);
    if (!p.empty()) ADD_FAILURE() << "rank " << r << ": " << p;
    p = shard_problem(fmt::format("row_shard({}, rank {}, tp {})", ins[i], r, tp),
                      lab07::row_shard(ins[i], r, tp), 1, ins[i], r, tp);
    if (!p.empty()) ADD_FAILURE() << "rank " << r << ": " << p;
  }
}

TEST(Step2_Shards, TpNotDividingTheFeaturesIsAUsageError) {
  EXPECT_THROW(lab07::column_shard(10, 0, 4), UsageError);
  EXPECT_THROW(lab07::row_shard(9, 1, 2), UsageError);
}

TEST(Step2_ColumnParallel, EqualsTheSingleDeviceLinear) { EXPECT_TRUE(check_column(column_impl())); }

TEST(Step2_RowParallel, EqualsTheSingleDeviceLinear) { EXPECT_TRUE(check_row(row_impl())); }

// Column parallel then row parallel (the MLP's shape): one all-reduce forward, one backward.
// The four functions again with the layer's shard and the inputs on the simulated GPU
// (tests/support/on_sim.hpp): the host's outputs and gradients bit for bit. An output made
// without the input's device, or a loop over the elements (the bias added on one rank by hand),
// stops there with the op's or the tensor's own line, as it would on a GPU.
TEST(Step2_ColumnThenRow, RunsOnTheSimulatedGpuAsOnTheHost) {
  const Device sim = Device::sim();
  Whole whole;
  std::vector<std::string> problems;
  for (const bool column : {true, false}) {
    const Impl impl = column ? column_impl() : row_impl();
    const char* kind = column ? "column-parallel" : "row-parallel";
    const int64_t features = column ? kOut : kIn, n = features / size(), lo = rank() * n;
    const nn::Shard shard = impl.shard(features, rank(), size());
    Part host(whole, shard, kIn, kOut), dev(whole, shard, kIn, kOut, sim);
    // column: the whole x in, this rank's output features' dy back; row: the reverse
    const Tensor x = column ? whole.x : columns(whole.x.view({kN, kIn}), lo, lo + n).view({kB, kT, n});
    const Tensor dy = column ? columns(whole.dy.view({kN, kOut}), lo, lo + n).view({kB, kT, n})
                             : whole.dy;
    const Tensor y = impl.forward(host.layer, x, group());
    const Tensor dx = impl.backward(host.layer, dy, x, group());
    labtest::collective_run_on_sim([&] {
      const auto same = [&](const char* what, const Tensor& want, const Tensor& got) {
        problems.push_back(labtest::same_on_sim(fmt::format("the {} {}", kind, what), want, got));
      };
      const Tensor x_s = x.to(sim);
      same("forward's y", y, impl.forward(dev.layer, x_s, group()));
      same("backward's dx", dx, impl.backward(dev.layer, dy.to(sim), x_s, group()));
      same("backward's dW", host.layer.weight.grad, dev.layer.weight.grad);
      same("backward's db", host.layer.bias.grad, dev.layer.bias.grad);
    });
  }
  const std::string all = labtest::joined(problems);
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

TEST(Step2_ColumnThenRow, OneAllReduceEachWay) {
  const int tp = size(), r = rank();
  nn::Linear fc("fc", kIn, kOut, true, 0.02, lab07::column_shard(kOut, r, tp));
  nn::Linear proj("proj", kOut, kIn, true, 0.02, lab07::row_shard(kOut, r, tp));
  nn::ParameterSet set;
  set.bind({&fc.weight, &fc.bias, &proj.weight, &proj.bias}, DType::f64, Device::cpu(), 9);
  const Tensor x = random_tensor({kN, kIn}, 21);
  Tensor y, dx;
  const Traffic fwd = traffic_of([&] {
    y = lab07::row_parallel_forward(proj, lab07::column_parallel_forward(fc, x, group()), group());
  });
  EXPECT_TRUE(only_all_reduces(fwd, 1, kN * kIn * 8));
  const Tensor h = lab07::column_parallel_forward(fc, x, group());
  const Traffic bwd = traffic_of([&] {
    dx = lab07::column_parallel_backward(
        fc, lab07::row_parallel_backward(proj, random_tensor({kN, kIn}, 22), h, group()), x, group());
  });
  EXPECT_TRUE(only_all_reduces(bwd, 1, kN * kIn * 8));
}

// f's backward without its all-reduce: dx is this rank's partial sum only. With one rank the
// numbers are right; the byte check still fails.
TEST(Step2_PlantedFault, ColumnBackwardWithoutFsAllReduceIsCaught) {
  Impl wrong = planted_column_base();
  wrong.backward = [](nn::Linear& layer, const Tensor& dy, const Tensor& x, comm::Communicator&) {
    Tensor dx = Tensor::zeros(x.shape(), x.dtype());
    layer.backward(dx, dy, x);
    return dx;
  };
  EXPECT_FALSE(check_column(wrong)) << "the check of Step2_ColumnParallel must fail";
}

// The bias added by every rank before the reduce: the sum counts it tp times.
TEST(Step2_PlantedFault, RowBiasAddedOnEveryRankIsCaught) {
  if (size() == 1) GTEST_SKIP() << "with one rank the bias is added once either way";
  Impl wrong = planted_row_base();
  wrong.forward = [](const nn::Linear& layer, const Tensor& x, comm::Communicator& c) {
    Tensor y = Tensor::empty({kB, kT, kOut}, DType::f64);
    layer.forward(y, x);
    layer.add_bias(y);  // before the all-reduce: on every rank
    c.all_reduce(y);
    return y;
  };
  EXPECT_FALSE(check_row(wrong)) << "the check of Step2_RowParallel must fail";
}

// Every rank holds the whole weight and computes the whole layer, then keeps its columns: the
// numbers are right; the shard shape (and the bytes) are not.
TEST(Step2_PlantedFault, EveryRankComputingTheWholeLayerIsCaught) {
  if (size() == 1) GTEST_SKIP() << "with one rank the whole layer is the shard";
  Impl wrong = planted_column_base();
  wrong.shard = [](int64_t, int, int) { return nn::Shard{}; };
  wrong.forward = [](const nn::Linear& layer, const Tensor& x, comm::Communicator& c) {
    Tensor y = Tensor::empty({kN, kOut}, DType::f64);
    layer.forward(y, x);
    const int64_t n = kOut / c.size();
    return columns(y, c.rank() * n, (c.rank() + 1) * n).view({kB, kT, n});
  };
  EXPECT_FALSE(check_column(wrong)) << "the check of Step2_ColumnParallel must fail";
}

// The column-parallel forward also allocates a full-width (N, out) output beside its own
// (N, out/tp): right numbers, traffic and work; the allocator's peak shows the second tensor.
TEST(Step2_PlantedFault, AFullWidthBufferInTheColumnForwardIsCaught) {
  Impl wrong = planted_column_base();
  wrong.forward = [](const nn::Linear& layer, const Tensor& x, comm::Communicator& c) {
    const Tensor full = Tensor::empty({kB, kT, layer.out_features() * c.size()}, DType::f64);
    Tensor y = Tensor::empty({kB, kT, layer.out_features()}, DType::f64);
    layer.forward(y, x);
    return y;
  };
  EXPECT_FALSE(check_column(wrong)) << "the check of Step2_ColumnParallel must fail";
}
