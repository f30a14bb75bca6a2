// Lab 07 step 3: the tensor-parallel block, float64, against the single-device nn::Block.
// The single-device block gets random values (LayerNorms and biases included); the TP block
// (lab07::make_block, which cuts with the attendee's head_shards, column_shard and row_shard,
// talking through the attendee's lab07::TensorParallel mappings) holds its shard of them. Checked:
//  - HOLDS: q, k, v rows and projection columns of NH/tp whole heads, 4C/tp MLP units;
//  - COMPUTES: output, dx and every gradient shard within kRel = 1e-12 of the largest value;
//  - SENDS: exactly 2 all-reduces of B*T*C forward (attention, MLP) and 2 backward;
//  - WORKS: exactly 1/tp of the single-device block's GEMM FLOPs each way (ops' work counters);
//  - the four hooks (enter, leave and their backwards) allocate nothing and hand back the
//    tensor's own storage: step 1's operators work in place;
//  - a GPT of TP blocks (nn::GPT with tp_rank/tp_size, these mappings on its blocks; embedding and
//    head whole on every rank) follows the single-device
//    GPT over 5 AdamW steps, every parameter shard within kAdamRel = 1e-9 of its largest value.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/allocator.hpp"
#include "common/nn/gpt.hpp"
#include "common/optim/optim.hpp"
#include "tensor_parallel.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/own_work.hpp"
#include "tests/support/reduce_mappings.hpp"
#include "tp_formulas.hpp"
#include "tp_test_support.hpp"

using namespace scalelab;
using namespace lab07test;

namespace {

constexpr int64_t kB = 2, kT = 5;

// The single-device block with random values, forward and backward on x, dout.
struct Whole {
  ModelConfig c = test_config();
  nn::Block block{0, c.n_embd, c.n_head, c.n_layer};
  nn::ParameterSet set;
  Tensor x = random_tensor({kB, kT, c.n_embd}, 31), dout = random_tensor({kB, kT, c.n_embd}, 32);
  Tensor y, dx;
  ops::WorkCount forward_work, backward_work;  // the single device's (tensor ops' counters)
  Whole() {
    set.bind(block.parameters(), DType::f64, Device::cpu(), 3);
    set.values().copy_from(random_tensor({set.numel()}, 33));
    nn::BlockActivations a;
    const ops::WorkCount start = ops::work_stats();
    y = block.forward(x, a);
    const ops::WorkCount mid = ops::work_stats();
    dx = block.backward(dout, x, a);
    forward_work = mid - start;
    backward_work = ops::work_stats() - mid;
  }
};

// Binds `part` and gives it its shard of whole's values.
void take_shard(nn::Block& part, nn::ParameterSet& set, const Whole& whole) {
  set.bind(part.parameters(), DType::f64, Device::cpu(), 3);
  for (nn::Parameter* p : part.parameters())
    p->value.copy_from(
        Tensor::from_vector(cut(whole.set.get(p->name).value, p->shard), p->shape(), DType::f64));
}

// The whole check of a TP block (hooks set by the caller).
::testing::AssertionResult check_block(nn::Block& part, const Whole& whole) {
  const int tp = size();
  const int64_t C = whole.c.n_embd, hs = C / whole.c.n_head;
  const bool shapes = part.attn.qkv.weight.shape() == std::vector<int64_t>{3 * C / tp, C} &&
                      part.attn.proj.weight.shape() == std::vector<int64_t>{C, C / tp} &&
                      part.mlp.fc.weight.shape() == std::vector<int64_t>{4 * C / tp, C} &&
                      part.mlp.proj.weight.shape() == std::vector<int64_t>{C, 4 * C / tp};
  if (!on_every_rank(shapes))
    return ::testing::AssertionFailure()
           << "each rank holds 1/" << tp << " of every weight: qkv (" << 3 * C / tp << ", " << C
           << "), attn proj (" << C << ", " << C / tp << "), fc (" << 4 * C / tp << ", " << C
           << "), mlp proj (" << C << ", " << 4 * C / tp << ") (on every rank)";
  Verdict v;
  for (const auto& [b, e] : part.attn.qkv.weight.shard.ranges)
    if (b % hs != 0 || e % hs != 0)
      v(::testing::AssertionFailure() << "qkv rows [" << b << ", " << e << ") cut a head of "
                                      << hs << " rows", "");
  const int64_t act = kB * kT * C * 8;
  nn::BlockActivations a;
  Tensor y, dx;
  const Traffic fwd = traffic_of([&] { y = part.forward(whole.x, a); });
  v(only_all_reduces(fwd, 2, 2 * act), " (forward: one all-reduce after attention, one after "
                                       "the MLP)");
  v(a_share_of_the_work(fwd, whole.forward_work, tp), " (forward)");
  v(near(y, whole.y), " (block output)");
  const Traffic bwd = traffic_of([&] { dx = part.backward(whole.dout, whole.x, a); });
  v(only_all_reduces(bwd, 2, 2 * act), " (backward: one all-reduce into ln2's gradient, one "
                                       "into ln1's)");
  v(a_share_of_the_work(bwd, whole.backward_work, tp), " (backward)");
  v(near(dx, whole.dx), " (dx)");
  for (nn::Parameter* p : part.parameters())
    v(near(p->grad, cut(whole.set.get(p->name).grad, p->shard)), " (" + p->name + " gradient)");
  return v.first;
}

// Written here for the planted faults (they never call the attendee's code): the library's own
// TP block (nn::Block with tp_rank/tp_size) whose mappings all-reduce leaving a region (g) and
// the gradient entering it (f's backward).
void all_reduce(Tensor& t) { group().all_reduce(t); }
const scalelab::labtest::ReduceMappings kFAndG(all_reduce, all_reduce);
const scalelab::labtest::ReduceMappings kOnlyG(all_reduce, nullptr);

std::unique_ptr<nn::Block> planted_base(const ModelConfig& c) {
  auto b = std::make_unique<nn::Block>(0, c.n_embd, c.n_head, c.n_layer, rank(), size());
  b->mappings = &kFAndG;
  return b;
}

nn::GPTOptions f64(int tp_rank = 0, int tp_size = 1) {
  nn::GPTOptions o;
  o.dtype = DType::f64;
  o.seed = 21;
  o.tp_rank = tp_rank;
  o.tp_size = tp_size;
  return o;
}

}  // namespace

// Each of the four hooks on a (B, T, C) tensor: the allocator's peak above the start of the call
// and the storage handed back. A copy at a region's edge is one more activation-sized tensor per
// region and step (the numbers and the traffic stay right).
::testing::AssertionResult hooks_allocate_nothing(const nn::Mappings& m) {
  using Hook = Tensor (nn::Mappings::*)(const Tensor&) const;
  const std::pair<const char*, Hook> hooks[] = {{"enter", &nn::Mappings::enter},
                                                {"enter_backward", &nn::Mappings::enter_backward},
                                                {"leave", &nn::Mappings::leave},
                                                {"leave_backward", &nn::Mappings::leave_backward}};
  Verdict v;
  for (const auto& [name, hook] : hooks) {
    const Tensor t = random_tensor({kB, kT, 16}, 31);
    reset_peak_memory(Device::cpu());
    const std::size_t start = memory_stats(Device::cpu()).current;
    const Tensor out = (m.*hook)(t);
    const std::size_t peak = memory_stats(Device::cpu()).peak - start;
    if (peak != 0)
      v(::testing::AssertionFailure() << name << " allocated " << peak << " bytes at its peak "
                                      << "(the allocator's statistics)",
        "; the hooks hand on the tensor they are given");
    else if (out.data_ptr() != t.data_ptr())
      v(::testing::AssertionFailure() << name << " returned a tensor on other storage",
        "; the hooks hand on the tensor they are given");
  }
  return v.first;
}

// What is wrong with head_shards' answer for rank r of tp (C features, NH heads), said as the
// rule it breaks and what it returned, never as the right ranges ("" when nothing).
std::string head_shards_problem(const lab07::HeadShards& s, int64_t C, int64_t NH, int r, int tp) {
  const int64_t hs = C / NH, width = C / tp;
  const auto str = [](const nn::Shard& x) {
    std::string out = fmt::format("dim {}:", x.dim);
    for (const auto& [b, e] : x.ranges) out += fmt::format(" [{}, {})", b, e);
    return out;
  };
  const std::string got = fmt::format("head_shards(C {}, NH {}, rank {}, tp {}) gave qkv {}, "
                                      "proj {}: ", C, NH, r, tp, str(s.qkv), str(s.proj));
  if (s.qkv.dim != 0 || s.qkv.ranges.size() != 3)
    return got + "qkv keeps rows (dim 0) of the fused weight, three ranges: q's, k's, v's";
  const char* part[] = {"q", "k", "v"};
  for (int p = 0; p < 3; ++p) {
    const auto [b, e] = s.qkv.ranges[p];
    if (b < p * C || e > (p + 1) * C || e - b != width)
      return got + fmt::format("range {} is not 1/tp of the {} rows, which are rows [{}, {}) of "
                               "the fused weight", p, part[p], p * C, (p + 1) * C);
    if ((b - p * C) % hs != 0)
      return got + fmt::format("the {} range cuts a head (a head is {} rows)", part[p], hs);
    if (b - p * C != s.qkv.ranges[0].first)
      return got + "q, k and v ranges of different heads: a rank needs all three of its heads";
  }
  if (s.qkv.ranges[0].first != r * width)
    return got + "ranks keep contiguous groups of heads in rank order, rank 0 the first group";
  if (s.proj.dim != 1 || s.proj.ranges.size() != 1 || s.proj.ranges[0] != s.qkv.ranges[0])
    return got + "proj keeps the columns (dim 1) that read this rank's heads' outputs, one range";
  return "";
}

TEST(Step3_HeadShards, WholeHeadsInAContiguousGroup) {
  const int tp = size(), r = rank();
  // the fixed case of the lab's model, then shapes drawn at grading time (tests/support/drawn.hpp:
  // the seed, the same on every rank, printed with every failure)
  labtest::Drawn draw;
  SCOPED_TRACE("heads " + draw.trace());
  for (int i = 0; i < 16; ++i) {
    const int64_t NH = i == 0 ? 4 : static_cast<int64_t>(tp) * draw.in(1, 6);
    const int64_t C = i == 0 ? 32 : NH * draw.in(1, 12);
    const std::string p = head_shards_problem(lab07::head_shards(C, NH, r, tp), C, NH, r, tp);
    if (!p.empty()) ADD_FAILURE() << "rank " << r << ": " << p;
  }
}

TEST(Step3_HeadShards, TpNotDividingTheHeadsIsAUsageError) {
  EXPECT_THROW(lab07::head_shards(48, 6, 0, 4), UsageError);
  EXPECT_THROW(lab07::check_tp(ModelConfig{"x", 256, 16, 2, 6, 48}, 4), UsageError);
  EXPECT_THROW(lab07::check_tp(ModelConfig{"x", 250, 16, 2, 4, 32}, 4), UsageError);
}

TEST(Step3_Block, EqualsTheSingleDeviceBlock) {
  Whole whole;
  auto part = lab07::make_block(0, whole.c, rank(), size());
  const lab07::TensorParallel tp(group());
  part->mappings = &tp;
  nn::ParameterSet set;
  take_shard(*part, set, whole);
  EXPECT_TRUE(check_block(*part, whole));
}

// The block with your mappings again on the simulated GPU: the host's numbers bit for bit
// (lab07test::block_runs_on_sim_as_on_host).
TEST(Step3_Block, RunsOnTheSimulatedGpuAsOnTheHost) {
  Whole whole;
  const lab07::TensorParallel tp(group());
  const std::string problems =
      block_runs_on_sim_as_on_host(whole.c, whole.set, tp, whole.x, whole.dout);
  if (!problems.empty()) LABTEST_FAIL() << problems;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

TEST(Step3_Block, TheMappingsAllocateNothing) {
  EXPECT_TRUE(hooks_allocate_nothing(lab07::TensorParallel(group())));
}

TEST(Step3_GPT, TrainsLikeTheSingleDeviceGPTForFiveAdamWSteps) {
  const ModelConfig c = test_config();
  nn::GPT single(c, f64()), part(c, f64(rank(), size()));
  const lab07::TensorParallel tp(group());
  for (int i = 0; i < c.n_layer; ++i) part.block(i).mappings = &tp;  // the blocks only
  optim::AdamW a1(optim::groups(single.parameters())), a2(optim::groups(part.parameters()));
  for (int step = 0; step < 5; ++step) {
    const Tensor x = random_tokens(2, 8, c.vocab_size, 100 + step),
                 y = random_tokens(2, 8, c.vocab_size, 200 + step);
    for (auto [model, adamw] : {std::pair{&single, &a1}, std::pair{&part, &a2}}) {
      model->zero_grad();
      model->forward(x, y);
      model->backward();
      adamw->step(1e-2);
    }
    for (nn::Parameter* p : part.parameters())
      ASSERT_TRUE(near(p->value, cut(single.params().get(p->name).value, p->shard), kAdamRel))
          << p->name << " after AdamW step " << step + 1 << " on rank " << rank();
  }
}

// head_shards as a table of the one case a failure used to print (C 32, NH 4: heads of 8 rows),
// with that head size everywhere: right there, wrong at the drawn shapes.
TEST(Step3_PlantedFault, HeadShardsRightOnlyAtThePrintedShapeAreCaught) {
  const int tp = size(), r = rank();
  const auto table = [&](int64_t C, int64_t NH) {
    (void)NH;
    const int64_t b = r * 32 / tp, e = (r + 1) * 32 / tp;
    lab07::HeadShards s;
    s.qkv = {0, {{b, e}, {C + b, C + e}, {2 * C + b, 2 * C + e}}};
    s.proj = {1, {{b, e}}};
    return s;
  };
  EXPECT_EQ(head_shards_problem(table(32, 4), 32, 4, r, tp), "");
  EXPECT_NE(head_shards_problem(table(48, 2 * tp), 48, 2 * tp, r, tp), "");
}

TEST(Step3_PlantedFault, TheFaultsBaseItselfPasses) {
  Whole whole;
  auto part = planted_base(whole.c);
  nn::ParameterSet set;
  take_shard(*part, set, whole);
  EXPECT_TRUE(check_block(*part, whole));
}

// The fused QKV weight cut into tp contiguous row blocks (rank 0 gets all of q and some of k at
// tp = 2): the shapes are right, the heads are not.
TEST(Step3_PlantedFault, HeadsSplitInTheWrongOrderAreCaught) {
  if (size() == 1) GTEST_SKIP() << "with one rank every cut is the whole weight";
  Whole whole;
  const int tp = size(), r = rank();
  const int64_t C = whole.c.n_embd;
  auto part = planted_base(whole.c);
  const nn::Shard wrong{0, {{r * 3 * C / tp, (r + 1) * 3 * C / tp}}};
  part->attn.qkv.weight.shard = wrong;
  part->attn.qkv.bias.shard = wrong;
  nn::ParameterSet set;
  take_shard(*part, set, whole);
  EXPECT_FALSE(check_block(*part, whole)) << "the check of Step3_Block must fail";
}

// Every rank holds the whole block and computes all of it, no communication: the numbers are
// right; what each rank holds and sends is not.
TEST(Step3_PlantedFault, EveryRankComputingTheWholeBlockIsCaught) {
  if (size() == 1) GTEST_SKIP() << "with one rank the whole block is the shard";
  Whole whole;
  nn::Block part(0, whole.c.n_embd, whole.c.n_head, whole.c.n_layer);
  nn::ParameterSet set;
  take_shard(part, set, whole);
  EXPECT_FALSE(check_block(part, whole)) << "the check of Step3_Block must fail";
}

// f's backward left out of the block (enter_backward the identity): the forward is right, dx is
// not.
TEST(Step3_PlantedFault, BlockWithoutFsBackwardIsCaught) {
  Whole whole;
  auto part = planted_base(whole.c);
  part->mappings = &kOnlyG;
  nn::ParameterSet set;
  take_shard(*part, set, whole);
  EXPECT_FALSE(check_block(*part, whole)) << "the check of Step3_Block must fail";
}

// enter_backward all-reduces a copy of the gradient: right numbers and traffic, and one more
// (B, T, C) tensor per region; the allocator sees it.
TEST(Step3_PlantedFault, ACopyInEnterBackwardIsCaught) {
  struct Copies : scalelab::labtest::ReduceMappings {
    Copies() : ReduceMappings(all_reduce, all_reduce) {}
    Tensor enter_backward(const Tensor& dx) const override {
      Tensor t = dx.clone();
      group().all_reduce(t);
      return t;
    }
  };
  EXPECT_TRUE(hooks_allocate_nothing(kFAndG)) << "the faults' base passes";
  EXPECT_FALSE(hooks_allocate_nothing(Copies()))
      << "the check of Step3_Block.TheMappingsAllocateNothing must fail";
}
