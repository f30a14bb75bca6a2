// Tensor-parallel layers on 2 and 4 ranks: each rank holds 1/tp of every block's heads and MLP
// hidden units (column-parallel qkv and fc, row-parallel projections). With the partial outputs
// all-reduced (the mappings' leave, Megatron's "g") and the partial input gradients all-reduced
// (the mappings' enter_backward, the backward of "f"), and the row-parallel biases added ONCE, after the
// reduce, the sharded model equals the single-device one:
//  - one Block: output, input gradient and every gradient shard, float64, 1e-12 relative to the
//    largest value (only summation order differs);
//  - a GPT of such blocks over 5 AdamW steps: every parameter shard after each step, float64,
//    1e-9 relative to the largest value (AdamW divides by sqrt(v), which amplifies rounding).
// The planted fault: the old workaround (each rank adds the whole bias in forward, all but one
// zeroing its copy) is right for one forward but drifts over optimizer steps; it must be caught.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/nn/gpt.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "tests/common/gradcheck.hpp"
#include "tests/support/reduce_mappings.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {

comm::Communicator& world() {
  static comm::Communicator c = comm::Communicator::world("mpi");
  return c;
}

void all_reduce(Tensor& t) { world().all_reduce(t); }

// The local part of a full tensor, as a parameter's shard describes it.
std::vector<double> shard_of(const Tensor& full, const nn::Shard& s) {
  if (s.whole()) return full.to_vector();
  std::vector<double> out;
  const int64_t R = full.size(0), C = full.dim() > 1 ? full.size(1) : 1;
  if (s.dim == 0) {
    for (auto [b, e] : s.ranges)
      for (int64_t r = b; r < e; ++r)
        for (int64_t c = 0; c < C; ++c) out.push_back(full.item(r * C + c));
  } else {
    for (int64_t r = 0; r < R; ++r)
      for (auto [b, e] : s.ranges)
        for (int64_t c = b; c < e; ++c) out.push_back(full.item(r * C + c));
  }
  return out;
}

::testing::AssertionResult matches(const std::vector<double>& got, const std::vector<double>& want,
                               double rel) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements, want " << want.size();
  double scale = 1e-300;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::abs(got[i] - want[i]) > rel * scale)
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs " << want[i]
                                         << " (tolerance " << rel * scale << ")";
  return ::testing::AssertionSuccess();
}

// heads and hidden units divide by 4
ModelConfig micro() { return ModelConfig{"micro-tp", 13, 6, 2, 4, 8}; }

nn::GPTOptions f64(int tp_rank = 0, int tp_size = 1) {
  nn::GPTOptions o;
  o.dtype = DType::f64;
  o.seed = 21;
  o.tp_rank = tp_rank;
  o.tp_size = tp_size;
  return o;
}

void make_tensor_parallel(nn::GPT& model) {
  model.set_mappings(std::make_shared<labtest::ReduceMappings>(all_reduce, all_reduce));
}

// The old, wrong workaround, emulated through the hook: every rank adds its own copy of the
// row-parallel bias to its partial sum before the reduce (copies zeroed on all ranks but 0 at
// the start). The block then adds the local copy after the reduce, so the hook takes it off
// again. Each copy still gets the whole gradient: after one step the zeroed copies are no longer
// zero and the output counts sum_r b_r.
void plant_bias_fault(nn::GPT& model, int rank) {
  for (int i = model.first_block(); i < model.last_block(); ++i) {
    nn::Block* b = &model.block(i);
    if (rank != 0)
      for (nn::Parameter* bias : {&b->attn.proj.bias, &b->mlp.proj.bias})
        for (int64_t k = 0; k < bias->numel(); ++k) bias->value.data<double>()[k] = 0;
    auto calls = std::make_shared<int>(0);  // forward reduces attention, then the MLP
    static std::vector<std::shared_ptr<labtest::ReduceMappings>> keep;  // a block does not own its mappings
    keep.push_back(std::make_shared<labtest::ReduceMappings>([b, calls](Tensor& t) {
      const Tensor& bias = (*calls)++ % 2 == 0 ? b->attn.proj.bias.value : b->mlp.proj.bias.value;
      const int64_t C = bias.numel(), N = t.numel() / C;
      double* y = t.data<double>();
      const double* v = bias.data<double>();
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c) y[n * C + c] += v[c];
      all_reduce(t);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c) y[n * C + c] -= v[c];
    }, all_reduce));
    b->mappings = keep.back().get();
  }
}

// Trains `model` for `steps` AdamW steps on fixed random batches; after each step, `check(step)`.
template <class Check>
void train(nn::GPT& model, int steps, Check check) {
  optim::AdamW adamw(optim::groups(model.parameters()));
  for (int s = 0; s < steps; ++s) {
    Tensor x = random_tokens({2, 6}, 13, 100 + s), y = random_tokens({2, 6}, 13, 200 + s);
    model.zero_grad();
    model.forward(x, y);
    model.backward();
    adamw.step(1e-2);
    check(s);
  }
}

}  // namespace

TEST(TensorParallel, ShardedBlockMatchesTheWholeBlock) {
  const int tp = world_size(), rank = world_rank();
  const int64_t C = 8, NH = 4, L = 2;
  nn::Block whole(0, C, NH, L), part(0, C, NH, L, rank, tp);
  nn::ParameterSet ws, ps;
  ws.bind(whole.parameters(), DType::f64, Device::cpu(), 3);
  ps.bind(part.parameters(), DType::f64, Device::cpu(), 3);
  // kept whole on every rank: ln1 and ln2 (2C each) and the two row-parallel biases (C each)
  EXPECT_EQ(ps.numel() * tp, ws.numel() + (tp - 1) * 6 * C)
      << "only the weights and the column-parallel biases are split";
  // random values (the same on every rank: same seed), biases included, then cut the shards
  fill_uniform(ws.values(), 4, -0.5, 0.5);
  for (nn::Parameter* p : part.parameters()) {
    const std::vector<double> v = shard_of(ws.get(p->name).value, p->shard);
    for (int64_t i = 0; i < p->numel(); ++i) p->value.data<double>()[i] = v[i];
  }
  const labtest::ReduceMappings f_and_g(all_reduce, all_reduce);
  part.mappings = &f_and_g;

  Tensor x = uniform({2, 5, C}, 5), dout = uniform({2, 5, C}, 6);
  nn::BlockActivations wa, pa;
  EXPECT_TRUE(matches(part.forward(x, pa).to_vector(), whole.forward(x, wa).to_vector(), 1e-12))
      << "output (the row-parallel biases count once)";
  EXPECT_TRUE(matches(part.backward(dout, x, pa).to_vector(), whole.backward(dout, x, wa).to_vector(),
                    1e-12))
      << "dx";
  for (nn::Parameter* p : part.parameters())
    EXPECT_TRUE(matches(p->grad.to_vector(), shard_of(ws.get(p->name).grad, p->shard), 1e-12))
        << p->name;
}

TEST(TensorParallel, GPTOfShardedBlocksTrainsLikeTheSingleDeviceGPTForFiveAdamWSteps) {
  const int tp = world_size(), rank = world_rank();
  nn::GPT single(micro(), f64()), part(micro(), f64(rank, tp));
  make_tensor_parallel(part);
  std::vector<std::vector<double>> want;  // the single-device shard of each parameter, per step
  train(single, 5, [&](int) {
    for (nn::Parameter* p : part.parameters())
      want.push_back(shard_of(single.params().get(p->name).value, p->shard));
  });
  std::size_t k = 0;
  train(part, 5, [&](int step) {
    for (nn::Parameter* p : part.parameters())
      ASSERT_TRUE(matches(p->value.to_vector(), want[k++], 1e-9))
          << p->name << " after AdamW step " << step + 1 << " on rank " << rank;
  });
}

TEST(TensorParallel, PlantedFaultBiasOnEveryRankIsCaught) {
  const int tp = world_size(), rank = world_rank();
  if (tp == 1) GTEST_SKIP() << "one rank has no copy to add twice";
  nn::GPT single(micro(), f64()), part(micro(), f64(rank, tp));
  plant_bias_fault(part, rank);
  std::vector<std::vector<double>> want;
  train(single, 3, [&](int) {
    for (nn::Parameter* p : part.parameters())
      want.push_back(shard_of(single.params().get(p->name).value, p->shard));
  });
  std::size_t k = 0;
  std::vector<int> wrong_after(3, 0);  // parameters off per step
  train(part, 3, [&](int step) {
    for (nn::Parameter* p : part.parameters())
      if (!matches(p->value.to_vector(), want[k++], 1e-9)) ++wrong_after[step];
  });
  EXPECT_EQ(wrong_after[0], 0) << "one step looks right: the zeroed copies were still zero";
  EXPECT_GT(wrong_after[2], 0) << "the check of the test above must fail after several steps";
}
