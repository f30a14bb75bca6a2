// Lab 07 step 3: the tensor-parallel block, float64, against the single-device nn::Block.
// The single-device block gets random values (LayerNorms and biases included); the TP block
// (lab07::make_block, which cuts with the attendee's head_shards, column_shard and row_shard,
// talking through the attendee's lab07::TensorParallel mappings) holds its shard of them. Checked:
//  - HOLDS: q, k, v rows and projection columns of NH/tp whole heads, 4C/tp MLP units;
//  - COMPUTES: output, dx and every gradient shard within kRel = 1e-12 of the largest value;
//  - SENDS: exactly 2 all-reduces of B*T*C forward (attention, MLP) and 2 backward;
//  - WORKS: exactly 1/tp of the single-device block's GEMM FLOPs each way (ops' work counters);
//  - a GPT of TP blocks (nn::GPT with tp_rank/tp_size, these mappings on its blocks; embedding and
//    head whole on every rank) follows the single-device
//    GPT over 5 AdamW steps, every parameter shard within kAdamRel = 1e-9 of its largest value.
#include <gtest/gtest.h>

#include <memory>

#include "common/nn/gpt.hpp"
#include "common/optim/optim.hpp"
#include "tensor_parallel.hpp"
#include "tests/support/reduce_mappings.hpp"
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

TEST(Step3_HeadShards, WholeHeadsInAContiguousGroup) {
  const int tp = size(), r = rank();
  const int64_t C = 32, NH = 4, hs = 8, per = NH / tp;
  const lab07::HeadShards s = lab07::head_shards(C, NH, r, tp);
  const int64_t b = r * per * hs, e = (r + 1) * per * hs;
  EXPECT_EQ(s.qkv.dim, 0);
  EXPECT_EQ(s.qkv.ranges, (std::vector<std::pair<int64_t, int64_t>>{
                              {b, e}, {C + b, C + e}, {2 * C + b, 2 * C + e}}))
      << "the q, k and v rows of heads [" << r * per << ", " << (r + 1) * per << ")";
  EXPECT_EQ(s.proj.dim, 1);
  EXPECT_EQ(s.proj.ranges, (std::vector<std::pair<int64_t, int64_t>>{{b, e}}));
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
