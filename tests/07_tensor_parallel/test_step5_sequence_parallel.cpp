// Lab 07 step 5: sequence parallelism, float64.
//  - the operators: all-gather / reduce-scatter of rows on integer-valued tensors (exact), with
//    their byte counts (payload: all-gather its output, reduce-scatter its input);
//  - the library's nn::Block on this rank's rows, talking through the attendee's
//    lab07::SequenceParallel mappings, against the single-device nn::Block: this rank's rows of
//    the output and of dx, every gradient shard (LayerNorm gradients whole after their
//    all-reduce) within kRel = 1e-12;
//  - what it SENDS (the traffic ledger, every communicator, sums only): forward exactly 2
//    all-gathers + 2 reduce-scatters of N*C, no all-reduce; backward 4 all-gathers + 2
//    reduce-scatters of N*C and all-reduces of the 4 LayerNorm gradients only (4*C numbers);
//  - what it COMPUTES: 1/tp of the single-device block's GEMM FLOPs each way and LayerNorms on
//    this rank's N/tp rows only (the tensor ops' work counters);
//  - what it HOLDS: the activations' bytes equal those of the same block with sequence-parallel
//    mappings written here (measured, not a formula: step 6 asks for the formula), and the
//    sequence-parallel GPT holds less than the tensor-parallel one for tp >= 2; the whole
//    process heap (a counting malloc: std::vector, new[], statics too) keeps after the forward
//    no more than a correct block does, give or take half an (N, C) tensor;
//  - the GPT with sequence parallelism (make_tp_gpt) follows the single-device GPT over 5 AdamW
//    steps (kAdamRel).
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>

#include <fmt/format.h>

#include "common/nn/gpt.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "tensor_parallel.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/heap.hpp"
#include "tests/support/own_work.hpp"
#include "tp_test_support.hpp"

using namespace scalelab;
using namespace lab07test;

namespace {

constexpr int64_t kB = 4, kT = 16, kN = kB * kT;  // N*C*8 = 16 KiB: a gathered input stands out of the heap's bookkeeping

struct Whole {
  ModelConfig c = test_config();
  nn::Block block{0, c.n_embd, c.n_head, c.n_layer};
  nn::ParameterSet set;
  Tensor x = random_tensor({kB, kT, c.n_embd}, 71), dout = random_tensor({kB, kT, c.n_embd}, 72);
  Tensor y, dx;
  ops::WorkCount forward_work, backward_work;  // the single device's (tensor ops' counters)
  Whole() {
    set.bind(block.parameters(), DType::f64, Device::cpu(), 3);
    set.values().copy_from(random_tensor({set.numel()}, 73));
    nn::BlockActivations a;
    const ops::WorkCount start = ops::work_stats();
    y = block.forward(x, a);
    const ops::WorkCount mid = ops::work_stats();
    dx = block.backward(dout, x, a);
    forward_work = mid - start;
    backward_work = ops::work_stats() - mid;
  }
};

// Rows [lo, hi) of a (B, T, C) tensor flattened to (N, C).
Tensor rows_of(const Tensor& t, int64_t lo, int64_t hi) {
  const int64_t C = t.size(t.dim() - 1);
  return t.view({t.numel() / C, C}).rows(lo, hi).clone();
}

// What a correct sequence-parallel block keeps after its forward (the yardsticks of
// check_sp_block): the library's block with the planted faults' base mappings, below, measured.
struct Held {
  int64_t heap = 0;         // the process heap's growth (counting malloc)
  std::size_t activations = 0;  // BlockActivations::nbytes
};
Held held_by_a_correct_forward(const Whole& whole);

// `part` (its mappings set) on this rank's rows of the whole block's input, forward and backward.
::testing::AssertionResult check_sp_block(nn::Block& part, const Whole& whole) {
  const int tp = size(), r = rank();
  const int64_t C = whole.c.n_embd, n = kN / tp, lo = r * n, NC8 = kN * C * 8;
  const Tensor x_sp = rows_of(whole.x, lo, lo + n);
  nn::BlockActivations a;
  Tensor y_sp, dx_sp;
  Verdict v;
  const Held correct = held_by_a_correct_forward(whole);
  const int64_t held_by_a_correct_one = correct.heap;
  Traffic fwd;
  const labtest::HeapGrowth heap =
      labtest::heap_growth_of([&] { fwd = traffic_of([&] { y_sp = part.forward(x_sp, a, kT); }); });
  // However held (Tensors, a std::vector, a static): after its forward the block keeps what a
  // correct one keeps, give or take half an (N, C) tensor of bookkeeping (the operations' records a
  // communicator's worker thread frees a little after they complete: about 3 KiB measured).
  if (heap.held > held_by_a_correct_one + NC8 / 2)
    v(::testing::AssertionFailure()
          << "after its forward the process heap holds " << heap.held << " bytes more than "
          << "before (counting malloc: Tensors, std::vector, new[], statics); a correct "
          << "sequence-parallel block keeps " << held_by_a_correct_one << " (a gathered (N, C) "
          << "input is " << NC8 << " bytes)", "");
  if (a.nbytes() != correct.activations)
    v(::testing::AssertionFailure()
          << "the block holds " << a.nbytes() << " bytes of activations, a sequence-parallel "
          << "block (LayerNorm outputs, statistics and residual on N/tp rows; the gathered "
          << "inputs not kept) holds " << correct.activations, "");
  v(exactly(fwd, labtest::TrafficBudget{}.all_gather(group(), 2, 2 * NC8)
                                         .reduce_scatter(group(), 2, 2 * NC8)),
    " (forward: 2 all-gathers and 2 sum reduce-scatters of N x C, nothing else)");
  v(a_share_of_the_work(fwd, whole.forward_work, tp), " (forward)");
  if (fwd.work.layernorm_rows != 2 * n)
    v(::testing::AssertionFailure() << "forward: the LayerNorms normalized "
                                    << fwd.work.layernorm_rows << " rows on this rank, want 2 x "
                                    << n << " (this rank's N/tp rows, twice)", "");
  v(near(y_sp, rows_of(whole.y, lo, lo + n)), " (our output rows)");
  const Tensor dout_sp = rows_of(whole.dout, lo, lo + n);
  const Traffic bwd = traffic_of([&] { dx_sp = part.backward(dout_sp, x_sp, a, nullptr, kT); });
  // the LayerNorm gradients' all-reduces: one per gradient or fused, the bytes are fixed
  v(exactly(bwd, labtest::TrafficBudget{}.all_gather(group(), 4, 4 * NC8)
                                         .reduce_scatter(group(), 2, 2 * NC8)
                                         .all_reduce(group(), labtest::kAnyCalls, 4 * C * 8)),
    " (backward: 4 all-gathers (output gradient, LayerNorm output again) and 2 sum "
    "reduce-scatters of N x C, sum all-reduces of the 4 LayerNorm gradients, nothing else)");
  v(a_share_of_the_work(bwd, whole.backward_work, tp), " (backward)");
  v(near(dx_sp, rows_of(whole.dx, lo, lo + n)), " (our dx rows)");
  for (nn::Parameter* p : part.parameters())
    v(near(p->grad, cut(whole.set.get(p->name).grad, p->shard)), " (" + p->name + " gradient)");
  return v.first;
}

void take_shard(nn::Block& part, nn::ParameterSet& set, const Whole& whole) {
  set.bind(part.parameters(), DType::f64, Device::cpu(), 3);
  for (nn::Parameter* p : part.parameters())
    p->value.copy_from(
        Tensor::from_vector(cut(whole.set.get(p->name).value, p->shard), p->shape(), DType::f64));
}

// ---- the planted faults' base, written here (never the attendee's code) -----------------------

// Leaving the TP region: a reduce-scatter, or (the fault) an all-reduce of the whole partial
// output followed by taking our rows.
Tensor planted_scatter(const Tensor& partial, bool by_all_reduce) {
  const int64_t C = partial.size(partial.dim() - 1), n = partial.numel() / C / size();
  if (by_all_reduce) {
    Tensor whole = partial.clone();
    group().all_reduce(whole);
    return whole.view({n * size(), C}).rows(rank() * n, (rank() + 1) * n).clone();
  }
  Tensor mine = Tensor::empty({n, C}, partial.dtype());
  group().reduce_scatter(partial, mine);
  return mine;
}
Tensor planted_gather(const Tensor& rows) {
  Tensor full = Tensor::empty({size() * rows.size(0), rows.size(1)}, rows.dtype());
  group().all_gather(rows, full);
  return full;
}

// Sequence-parallel mappings written here. by_all_reduce: leave a region by an all-reduce of
// the whole partial output, then our rows (right numbers, more bytes). keep_gathered: enter
// keeps each gathered LayerNorm output and hands it out again in backward instead of gathering
// it again (right numbers, fewer bytes, a whole (N, C) more held per sub-layer).
// copy_in_vector: enter also keeps a copy of each gathered input in a std::vector (the same
// traffic, a whole (N, C) more held per sub-layer where the allocator does not look).
struct PlantedSequenceParallel : nn::Mappings {
  bool by_all_reduce = false, keep_gathered = false, copy_in_vector = false;
  mutable std::map<const void*, Tensor> kept;  // by the rows' storage
  mutable std::vector<std::vector<double>> copies;
  Tensor enter(const Tensor& x) const override {
    if (keep_gathered && kept.count(x.data_ptr())) return kept.at(x.data_ptr());
    Tensor full = planted_gather(x.view({-1, x.size(-1)}));
    if (keep_gathered) kept[x.data_ptr()] = full;
    if (copy_in_vector) copies.push_back(full.to_vector());
    return full;
  }
  Tensor enter_backward(const Tensor& dx) const override { return planted_scatter(dx, false); }
  Tensor leave(const Tensor& y) const override { return planted_scatter(y, by_all_reduce); }
  Tensor leave_backward(const Tensor& dy) const override {
    return planted_gather(dy.view({-1, dy.size(-1)}));
  }
  void layernorm_backward(nn::LayerNorm& ln, Tensor& din, const Tensor& dout, const Tensor& in,
                          const Tensor& mean, const Tensor& rstd,
                          const Tensor& dresidual) const override {
    lab07::layernorm_backward_rows(ln, din, dout, in, mean, rstd, dresidual, group());  // given
  }
};

std::unique_ptr<nn::Block> library_tp_block(const ModelConfig& c) {
  return std::make_unique<nn::Block>(0, c.n_embd, c.n_head, c.n_layer, rank(), size());
}

Held held_by_a_correct_forward(const Whole& whole) {
  auto part = library_tp_block(whole.c);
  const PlantedSequenceParallel base;
  part->mappings = &base;
  nn::ParameterSet set;
  take_shard(*part, set, whole);
  const int64_t n = kN / size();
  const Tensor x_sp = rows_of(whole.x, rank() * n, (rank() + 1) * n);
  nn::BlockActivations a;
  Tensor y_sp;
  Held h;
  h.heap = labtest::heap_growth_of([&] { y_sp = part->forward(x_sp, a, kT); }).held;
  h.activations = a.nbytes();
  return h;
}

// The whole GPT's sequence parallelism written here: the base's operators in the blocks and
// around ln_f, this rank's rows of the embedding; the vocabulary ends are the attendee's step 4
// (TensorParallel's). What a correct sequence-parallel GPT holds is measured with these.
struct OwnSequenceParallel : lab07::TensorParallel {
  // the test's tp group (TensorParallel::group() would read the member not yet set)
  OwnSequenceParallel() : lab07::TensorParallel(lab07test::group()) {}
  PlantedSequenceParallel base;
  Tensor enter(const Tensor& x) const override { return base.enter(x); }
  Tensor enter_backward(const Tensor& dx) const override { return base.enter_backward(dx); }
  Tensor leave(const Tensor& y) const override { return base.leave(y); }
  Tensor leave_backward(const Tensor& dy) const override { return base.leave_backward(dy); }
  Tensor split_rows(const Tensor& x) const override {
    const int64_t C = x.size(-1), n = x.numel() / C / size();
    return x.view({n * size(), C}).rows(rank() * n, (rank() + 1) * n).clone();
  }
  Tensor split_rows_backward(const Tensor& dx) const override { return planted_gather(dx); }
  void layernorm_backward(nn::LayerNorm& ln, Tensor& din, const Tensor& dout, const Tensor& in,
                          const Tensor& mean, const Tensor& rstd,
                          const Tensor& dresidual) const override {
    base.layernorm_backward(ln, din, dout, in, mean, rstd, dresidual);
  }
};

// GPTActivations::nbytes after one forward of make_tp_gpt's model on (B, T) with `mappings`
// (null: the model's own, the attendee's).
std::size_t gpt_activation_bytes(const ModelConfig& c, int64_t B, int64_t T, bool sp,
                                 std::shared_ptr<const nn::Mappings> mappings) {
  auto model = lab07::make_tp_gpt(c, group(), {.dtype = DType::f64, .seed = 31,
                                               .sequence_parallel = sp});
  if (mappings) model->set_mappings(std::move(mappings));
  nn::GPTActivations acts;
  model->forward(random_tokens(B, T, c.vocab_size, 801), random_tokens(B, T, c.vocab_size, 802),
                 acts);
  return acts.nbytes();
}

}  // namespace

// First in the file, so first in step 5's run (tools.memory_first checks it): a buffer the code
// keeps in a function-local static is allocated inside this window, not by an earlier test.
TEST(Step5_Block, EqualsTheSingleDeviceBlockOnOurRows) {
  Whole whole;
  auto part = lab07::make_block(0, whole.c, rank(), size());
  const lab07::SequenceParallel sp(group());
  part->mappings = &sp;
  nn::ParameterSet set;
  take_shard(*part, set, whole);
  EXPECT_TRUE(check_sp_block(*part, whole));
}

// The block with your sequence-parallel mappings on this rank's rows, again on the simulated GPU:
// the host's numbers bit for bit (lab07test::block_runs_on_sim_as_on_host).
TEST(Step5_Block, RunsOnTheSimulatedGpuAsOnTheHost) {
  Whole whole;
  const lab07::SequenceParallel sp(group());
  const int64_t n = kN / size(), lo = rank() * n;
  const std::string problems = block_runs_on_sim_as_on_host(
      whole.c, whole.set, sp, rows_of(whole.x, lo, lo + n), rows_of(whole.dout, lo, lo + n), kT);
  if (!problems.empty()) LABTEST_FAIL() << problems;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

TEST(Step5_Operators, GatherAndScatterRowsExactly) {
  const int tp = size(), r = rank();
  const int64_t C = 3, n = 2;
  // gather: rank r's rows hold r*100 + i; the whole tensor is every rank's rows in rank order
  std::vector<double> mine(n * C);
  for (int64_t i = 0; i < n * C; ++i) mine[i] = r * 100 + i;
  Tensor full;
  const Traffic g = traffic_of([&] {
    full = lab07::gather_sequence(Tensor::from_vector(mine, {n, C}, DType::f64), group());
  });
  ASSERT_EQ(full.shape(), (std::vector<int64_t>{tp * n, C}));
  for (int q = 0; q < tp; ++q)
    for (int64_t i = 0; i < n * C; ++i) EXPECT_EQ(full.item(q * n * C + i), q * 100 + i);
  EXPECT_TRUE(exactly(g, labtest::TrafficBudget{}.all_gather(group(), 1, tp * n * C * 8)));
  // scatter: every rank contributes (r + 1) * (i + 1); rank r gets its rows of the sum
  std::vector<double> part(tp * n * C);
  for (int64_t i = 0; i < tp * n * C; ++i) part[i] = (r + 1) * (i + 1);
  Tensor rows;
  const Traffic s = traffic_of([&] {
    rows = lab07::scatter_sequence(Tensor::from_vector(part, {tp * n, C}, DType::f64), group());
  });
  ASSERT_EQ(rows.shape(), (std::vector<int64_t>{n, C}));
  for (int64_t i = 0; i < n * C; ++i)
    EXPECT_EQ(rows.item(i), (r * n * C + i + 1) * tp * (tp + 1) / 2.0);
  EXPECT_TRUE(exactly(s, labtest::TrafficBudget{}.reduce_scatter(group(), 1, tp * n * C * 8)));
  // the backwards are the other collective
  const Traffic gb = traffic_of([&] { lab07::gather_sequence_backward(full, group()); });
  EXPECT_TRUE(exactly(gb, labtest::TrafficBudget{}.reduce_scatter(group(), 1, tp * n * C * 8)));
  const Traffic sb = traffic_of([&] { lab07::scatter_sequence_backward(rows, group()); });
  EXPECT_TRUE(exactly(sb, labtest::TrafficBudget{}.all_gather(group(), 1, tp * n * C * 8)));
  EXPECT_EQ(lab07::sequence_rows(kN, r, tp).lo, r * kN / tp);
  EXPECT_EQ(lab07::sequence_rows(kN, r, tp).hi, (r + 1) * kN / tp);
  EXPECT_THROW(lab07::sequence_rows(6, 0, 4), UsageError);
}

// A block hands its regions' whole tensors over as (B, T, C), and B may be smaller than tp (the
// GPT tests run B = 2 on 4 ranks): the rows are the flattened tokens. Cutting the first
// dimension instead gives the same bytes whenever tp divides B (the block check's B = 4), so
// this runs B = 1: the rows (r + 1) * (i + 1) of every rank, summed to this rank's N/tp.
TEST(Step5_Operators, ABatchSmallerThanTpIsSplitByTokenRows) {
  const int tp = size(), r = rank();
  const int64_t B = 1, T = 2 * tp, C = 3, n = B * T / tp;
  std::vector<double> part(B * T * C);
  for (int64_t i = 0; i < B * T * C; ++i) part[i] = (r + 1) * (i + 1);
  const auto check = [&](const char* name, const std::function<Tensor(const Tensor&)>& fn)
      -> ::testing::AssertionResult {
    Tensor rows;
    std::string threw;
    try {  // the same shapes on every rank: a library check throws on all of them alike
      rows = fn(Tensor::from_vector(part, {B, T, C}, DType::f64));
    } catch (const std::exception& e) {
      threw = e.what();
    }
    const std::string given = fmt::format("{} of a (B, T, C) = ({}, {}, {}) tensor at tp {}", name,
                                          B, T, C, tp);
    const std::string rule = fmt::format(
        ": a rank's rows are its N/tp = {} of the N = B*T = {} tokens (the flattened (N, C)), "
        "whatever B is; here B < tp", n, B * T);
    if (!threw.empty())
      return ::testing::AssertionFailure() << given << " threw \"" << threw << "\"" << rule;
    if (rows.numel() != n * C)
      return ::testing::AssertionFailure() << given << " returned " << rows.str() << rule;
    for (int64_t i = 0; i < n * C; ++i)
      if (rows.item(i) != (r * n * C + i + 1) * tp * (tp + 1) / 2.0)
        return ::testing::AssertionFailure()
               << given << ": element " << i << " of rank " << r << "'s rows is " << rows.item(i)
               << ", not the sum over ranks of its token row" << rule;
    return ::testing::AssertionSuccess();
  };
  EXPECT_TRUE(check("scatter_sequence",
                    [](const Tensor& t) { return lab07::scatter_sequence(t, group()); }))
      << "leaving a block's region";
  EXPECT_TRUE(check("gather_sequence_backward",
                    [](const Tensor& t) { return lab07::gather_sequence_backward(t, group()); }))
      << "the gradient of a block's region input";
}

TEST(Step5_Block, HoldsLessThanTheTensorParallelBlock) {
  const ModelConfig c = test_config();
  // the whole sequence-parallel GPT (make_tp_gpt) with your mappings against the same model
  // with sequence-parallel mappings written here (measured: not your step 6), and below the
  // tensor-parallel GPT's (step 3's mappings: every rank keeps the replicated tensors whole)
  const std::size_t got = gpt_activation_bytes(c, kB, kT, true, nullptr);
  const std::size_t want =
      gpt_activation_bytes(c, kB, kT, true, std::make_shared<OwnSequenceParallel>());
  EXPECT_TRUE(got == want)
      << "the sequence-parallel GPT's GPTActivations hold " << got << " bytes after one forward "
      << "of B " << kB << " x T " << kT << ", a sequence-parallel GPT's hold " << want
      << " (its blocks, ln_f and logits on N/tp rows): nbytes() of each block's activations "
      << "shows which";
  if (size() > 1)
    EXPECT_LT(got, gpt_activation_bytes(c, kB, kT, false, nullptr))
        << "sequence parallelism keeps less than step 3's tensor parallelism";
}

// The same in mixed precision: statistics stay fp32 on the rows, the LayerNorm gradients'
// all-reduce in fp32 (tolerances: tp_test_support.hpp).
TEST(Step5_GPT, MixedPrecisionFollowsTheBf16SingleDeviceGPT) {
  expect_mixed_precision_follows_single_device(/*sequence_parallel=*/true, 43);
}

TEST(Step5_GPT, TrainsLikeTheSingleDeviceGPTForFiveAdamWSteps) {
  const ModelConfig c = test_config();
  nn::GPTOptions o;
  o.dtype = DType::f64;
  o.seed = 29;
  nn::GPT single(c, o);
  auto part_model =
      lab07::make_tp_gpt(c, group(), {.dtype = DType::f64, .seed = 29, .sequence_parallel = true});
  nn::GPT& part = *part_model;
  optim::AdamW a1(optim::groups(single.parameters())), a2(optim::groups(part.parameters()));
  for (int step = 0; step < 5; ++step) {
    const Tensor x = random_tokens(2, 8, c.vocab_size, 500 + step),
                 y = random_tokens(2, 8, c.vocab_size, 600 + step);
    single.zero_grad();
    const double want = single.forward(x, y);
    single.backward();
    a1.step(1e-2);
    part.zero_grad();
    nn::GPTActivations acts;
    const double got = part.forward(x, y, acts);
    if (step == 0)  // rows, not whole tensors, between the regions (measured as above)
      EXPECT_EQ(acts.nbytes(),
                gpt_activation_bytes(c, 2, 8, true, std::make_shared<OwnSequenceParallel>()));
    part.backward(acts);
    a2.step(1e-2);
    EXPECT_NEAR(got, want, 1e-10 * std::abs(want)) << "loss of step " << step + 1;
    for (nn::Parameter* p : part.parameters())
      ASSERT_TRUE(near(p->value, cut(single.params().get(p->name).value, p->shard), kAdamRel))
          << p->name << " after AdamW step " << step + 1 << " on rank " << rank();
  }
}

TEST(Step5_PlantedFault, TheFaultsBaseItselfPasses) {
  Whole whole;
  auto part = library_tp_block(whole.c);
  const PlantedSequenceParallel base;
  part->mappings = &base;
  nn::ParameterSet set;
  take_shard(*part, set, whole);
  EXPECT_TRUE(check_sp_block(*part, whole));
}

// Step 5's block check on the library's tp block whose mappings are the planted operators with
// `plant` applied (the planted faults below each switch one on).
namespace {
bool sp_block_check_with(const std::function<void(PlantedSequenceParallel&)>& plant) {
  Whole whole;
  auto part = library_tp_block(whole.c);
  PlantedSequenceParallel fault;
  plant(fault);
  part->mappings = &fault;
  nn::ParameterSet set;
  take_shard(*part, set, whole);
  return check_sp_block(*part, whole);
}
}  // namespace

// The reduce-scatter replaced by an all-reduce and a slice: the same numbers; the byte check
// catches it (and the full partial output is reduced on every rank).
TEST(Step5_PlantedFault, ReduceScatterReplacedByAllReduceIsCaught) {
  EXPECT_FALSE(sp_block_check_with([](PlantedSequenceParallel& f) { f.by_all_reduce = true; }))
      << "the check of Step5_Block must fail";
}

// Keeping the gathered LayerNorm output instead of gathering it again in backward: the same
// numbers and fewer bytes sent, but each rank holds a whole (B, T, C) more per sub-layer.
TEST(Step5_PlantedFault, KeepingTheGatheredInputIsCaught) {
  EXPECT_FALSE(sp_block_check_with([](PlantedSequenceParallel& f) { f.keep_gathered = true; }))
      << "the check of Step5_Block must fail";
}

// The same traffic and numbers as the base, but each gathered LayerNorm output also kept in a
// std::vector until the mappings go: the allocator's counters and the activations' nbytes do not
// see it; the counting malloc does.
TEST(Step5_PlantedFault, GatheredInputKeptInAStdVectorIsCaught) {
  if (size() == 1) GTEST_SKIP() << "with one rank the gathered input is this rank's rows";
  EXPECT_FALSE(sp_block_check_with([](PlantedSequenceParallel& f) { f.copy_in_vector = true; }))
      << "the check of Step5_Block must fail";
}
