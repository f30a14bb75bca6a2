// Lab 09 in mixed precision (--precision bf16: fp32 master values, gradients and AdamW state, a
// bf16 compute copy the layers use, bf16 activations). A ZeRO-1 and a ZeRO-2 step take the bf16
// DDP step (the given stage 0, same seed, same global batches): losses and the fp32 parameters
// within the tolerances below, and after every step each rank's compute copy is EXACTLY
// cast(values) (the all-gather moves fp32 values; a rank that forgets to recast its copy
// computes the next step with stale weights). The held counters count the copy and equal the
// allocator. Planted fault: ZeRO-1 without the recast.
// ZeRO-3 in bf16 (the paper's way): the same step within its tolerance, its all-gathers carry
// bf16 (the same gathers as the fp32 ZeRO-3, half the bytes), between steps it holds the fp32
// shards only (no unit's compute buffer, values or gradients bound; held == allocator). Planted
// fault: a ZeRO-3 that gathers the fp32 shards and casts afterwards (right numbers, 2x bytes).
#include <gtest/gtest.h>

#include <functional>

#include "common/optim/optim.hpp"
#include "common/train/equivalence.hpp"
#include "ddp.hpp"
#include "tests/09_zero/zero_checks.hpp"

using namespace scalelab;
using namespace scalelab::lab09test;
using labtest::world;

namespace {

// Tolerances against the bf16 DDP over kSteps steps. ZeRO-1 all-reduces the same fp32 gradients
// and updates each element as DDP does, and AdamW's fused cast and refresh_compute round alike:
// it is bitwise DDP (tolerance 0, as in fp32). ZeRO-2 reduces to the owners in another order:
// the fp32 gradients differ in their last bits, so the masters do, and a master near a bf16
// rounding boundary can give a copy one bf16 ulp (2^-8 relative) away, which moves the next
// losses. Measured (kLab, 3 steps at lr 1e-2): 1 and 2 ranks bitwise; 4 ranks losses bitwise and
// parameters within 7.7e-7 (|p| up to ~1). 1e-5 relative + 1e-5 absolute leaves a margin of
// ~13 and still fails a stale copy by far (it moves the second loss by 8%, the parameters by
// 3.5e-2).
constexpr int kSteps = 3;
constexpr double kZero1Rtol = 0, kZero1Atol = 0;
constexpr double kZero2Rtol = 1e-5, kZero2Atol = 1e-5;
// ZeRO-3 computes each rank's gradient from the same bf16 weights as DDP (the gathered
// cast(shard) is cast(master), element by element), bitwise; the fp32 gradients are then
// reduce-scattered per unit, which the communicator may sum in another order than DDP's
// all-reduce (it does not promise the same order), and then, as ZeRO-2, a master may differ in
// its last bits and its copy by one bf16 ulp. Measured (kLab, 3 steps at lr 1e-2, MPI backend):
// losses and parameters bitwise DDP's on 1, 2 and 4 ranks. ZeRO-2's bound keeps room for the
// other order; a real fault (fp32 weights computed with, a stale unit) moves far more.
constexpr double kZero3Rtol = 1e-5, kZero3Atol = 1e-5;

// kSteps steps of `t` against the bf16 DDP: the losses and the fp32 parameters (full_parameters)
// within rtol/atol. `after` runs on `t` after the steps (collective checks). Collective.
testing::AssertionResult steps_like_the_bf16_ddp(
    lab09::Trainer& t, double rtol, double atol,
    const std::function<testing::AssertionResult()>& after = testing::AssertionSuccess) {
  lab09::Ddp ddp(kLab.config(), mixed_bf16(), world());
  const std::vector<double> want = run_steps(ddp, kSteps), got = run_steps(t, kSteps);
  auto extra = after();
  auto params = labtest::close_on_every_rank(t.full_parameters(), ddp.full_parameters(), rtol, atol);
  for (std::size_t s = 0; s < want.size(); ++s)
    if (std::abs(got[s] - want[s]) > atol + rtol * std::abs(want[s]))
      return testing::AssertionFailure() << "loss of step " << s << ": " << got[s]
                                         << ", bf16 DDP " << want[s];
  if (!params) return params << " (fp32 parameters against the bf16 DDP's)";
  return extra;
}

// The same, and the flat compute copy cast(values) on every rank (stages 0-2). Collective.
testing::AssertionResult takes_the_bf16_ddp_step(lab09::Trainer& t, double rtol, double atol) {
  return steps_like_the_bf16_ddp(t, rtol, atol,
                                 [&t] { return compute_is_cast(t.model().params()); });
}

// The planted fault: ZeRO-1 in bf16 that steps its shard (AdamW over groups_in_range: no compute
// copy in the groups) and all-gathers the fp32 values, but never recasts the bf16 copy. Its
// values are right; the layers compute with the initial weights for ever.
class NoRecast final : public lab09::Trainer {
 public:
  NoRecast() : Trainer(world()) {
    nn::GPTOptions o = mixed_bf16();
    o.storage.pad_to = world().size();
    model_ = std::make_unique<nn::GPT>(kLab.config(), o);
    nn::ParameterSet& ps = model_->params();
    s_ = nn::shard_range(ps.numel(), world().rank(), world().size());
    adamw_ = std::make_unique<optim::AdamW>(optim::groups_in_range(
        ps, s_.lo, s_.hi, ps.padded_values().flat(s_.lo, s_.real()),
        ps.padded_grads().flat(s_.lo, s_.size)));
  }
  int stage() const override { return 1; }
  double forward_backward(const data::Batch& global) override {
    return lab03::forward_backward(*model_, global, world());
  }
  void step(double lr) override {
    adamw_->step(lr);
    gather_fp32_values(model_->params(), s_);  // fault: no refresh_compute()
  }
  Tensor full_parameters() override { return model_->params().values(); }
  lab09::Held held() const override { return {}; }

 private:
  nn::ShardRange s_;
  std::unique_ptr<optim::AdamW> adamw_;
};

}  // namespace

TEST(Step2_Bf16, Zero1TakesTheBf16DdpStepAndRecastsTheCopy) {
  lab09::Zero1 z(kLab.config(), mixed_bf16(), world());
  ASSERT_TRUE(z.model().params().compute_values().defined()) << "built without the bf16 copy";
  EXPECT_TRUE(takes_the_bf16_ddp_step(z, kZero1Rtol, kZero1Atol));
  EXPECT_EQ(train::max_divergence_from_rank0(z.full_parameters(), world()), 0.0);
}

TEST(Step2_Bf16PlantedFault, SkippingTheRecastIsCaught) {
  NoRecast bad;
  // Stale from the first step on, on every rank count (one rank too: no group carries the copy).
  EXPECT_FALSE(takes_the_bf16_ddp_step(bad, kZero2Rtol, kZero2Atol));
  EXPECT_FALSE(compute_is_cast(bad.model().params()));
}

TEST(Step3_Bf16, Zero2TakesTheBf16DdpStepAndRecastsTheCopy) {
  lab09::Zero2 z(kLab.config(), mixed_bf16(), world());
  ASSERT_TRUE(z.model().params().compute_values().defined()) << "built without the bf16 copy";
  EXPECT_TRUE(takes_the_bf16_ddp_step(z, kZero2Rtol, kZero2Atol));
  EXPECT_EQ(train::max_divergence_from_rank0(z.full_parameters(), world()), 0.0);
}

TEST(Step3_Bf16, HeldCountsTheCopyAndEqualsTheAllocator) {
  // Between steps: fp32 values + the bf16 copy (6 bytes per padded element) as parameters, and
  // the trainer's total exactly the allocator's bytes, as in fp32 (the program prints both).
  for (int stage = 0; stage <= 2; ++stage) {
    std::shared_ptr<lab09::Trainer> t;
    const Footprint f = footprint([&]() {
      t = lab09::make_trainer(stage, kLab.config(), mixed_bf16(), world());
      return Steps{[t](const data::Batch& b) { t->forward_backward(b); }, [t]() { t->step(kLr); }};
    });
    const lab09::Held h = t->held();
    const auto padded = static_cast<std::size_t>(t->model().params().padded_numel());
    EXPECT_EQ(h.params, padded * (4 + 2)) << "stage " << stage;
    EXPECT_EQ(h.total(), f.held) << "stage " << stage << ": held counters against the allocator";
  }
}

TEST(Step4_Bf16, Zero3TakesTheBf16DdpStep) {
  lab09::Zero3 z(kLab.config(), mixed_bf16(), world());
  ASSERT_TRUE(z.mixed());
  ASSERT_EQ(z.model().compute_dtype(), DType::bf16) << "activations in bf16";
  EXPECT_TRUE(steps_like_the_bf16_ddp(z, kZero3Rtol, kZero3Atol));
  const Tensor params = z.full_parameters();  // the fp32 masters, gathered
  EXPECT_EQ(params.dtype(), DType::f32);
  EXPECT_EQ(train::max_divergence_from_rank0(params, world()), 0.0);
}

namespace {

// The planted fault: ZeRO-3 in bf16 with the reference's schedule (forward gathers the embedding,
// each block, the head and the tied embedding; backward each block again), but each gather moves
// the fp32 shards and casts into the unit's compute buffer afterwards. The layers see the same
// bf16 weights, so its numbers are right; the wire carries twice the bytes.
class CastsAfterGather final : public lab09::Trainer {
 public:
  CastsAfterGather() : Trainer(world()) {
    model_ = std::make_unique<nn::GPT>(kLab.config(), z_.options(mixed_bf16()));
    z_.make_optimizer(model_->params());
  }
  int stage() const override { return 3; }
  double forward_backward(const data::Batch& global) override {
    nn::GPT& m = *model_;
    nn::ParameterSet& ps = m.params();
    const data::Batch mine = labtest::my_rows(global);
    const int L = static_cast<int>(m.config().n_layer);
    const std::size_t emb = m.embedding_unit(), head = m.head_unit();
    nn::GPTActivations acts;
    acts.inputs.assign(L, Tensor());
    acts.blocks.assign(L, nn::BlockActivations());
    gather(emb);
    Tensor x = m.embed(mine.x, acts);
    ps.release_compute(emb);
    for (int i = 0; i < L; ++i) {
      gather(m.block_unit(i));
      acts.inputs[i] = x;
      x = m.block(i).forward(x, acts.blocks[i]);
      ps.release_compute(m.block_unit(i));
    }
    gather(head);
    gather(emb);
    Tensor loss = Tensor::from_vector({m.head_forward(x, mine.y, acts)}, {1}, DType::f64);
    Tensor d = m.head_backward(acts);
    ps.release_compute(head);
    ps.release_compute(emb);
    z_.reduce_scatter(ps, head);
    for (int i = L - 1; i >= 0; --i) {
      const std::size_t u = m.block_unit(i);
      gather(u);
      ps.bind_grads(u);
      d = m.block(i).backward(d, acts.inputs[i], acts.blocks[i]);
      acts.blocks[i].reset();
      ps.release_compute(u);
      z_.reduce_scatter(ps, u);
    }
    m.embed_backward(d, acts);
    z_.reduce_scatter(ps, emb);
    world().all_reduce(loss, comm::ReduceOp::sum);
    return loss.item() / world().size();
  }
  void step(double lr) override { z_.adamw->step(lr); }
  Tensor full_parameters() override {
    nn::ParameterSet& ps = model_->params();
    Tensor all = Tensor::empty({ps.numel()});
    for (std::size_t u = 0; u < ps.units().size(); ++u)
      all.flat(ps.units()[u].lo, ps.units()[u].numel()).copy_from(z_.gather_fp32(ps, u));
    return all;
  }
  lab09::Held held() const override { return {}; }

 private:
  void gather(std::size_t u) {  // fault: 4 bytes per parameter on the wire, cast after
    nn::ParameterSet& ps = model_->params();
    Tensor c = ps.bind_compute(u);
    ops::cast(c, z_.gather_fp32(ps, u));
  }
  HandZero3 z_;
};

// The gathers of one bf16 ZeRO-3 step carry bf16: the same all-gathers (calls) as the fp32 ZeRO-3
// of the same code, at half its bytes, i.e. 2 bytes per gathered parameter (and within the fp32
// test's bounds at 2 bytes); the reduce-scatter moves the fp32 gradients, every unit once.
testing::AssertionResult gathers_bf16(lab09::Trainer& mixed) {
  lab09::Zero3 fp32(kLab.config(), f32(), world());
  const comm::CommStats want = one_step_traffic(fp32), got = one_step_traffic(mixed);
  const auto count = [](const comm::CommStats& s, const std::string& op) {
    return comm::comm_total(s, "", op);
  };
  const comm::CommCount g = count(got, "all_gather"), w = count(want, "all_gather");
  if (g.calls != w.calls)
    return testing::AssertionFailure() << g.calls << " all-gathers in a step, the fp32 ZeRO-3 "
                                       << w.calls;
  if (2 * g.bytes != w.bytes)
    return testing::AssertionFailure() << "the all-gathers moved " << g.bytes << " bytes, the "
                                       << "fp32 ZeRO-3's " << w.bytes << ": bf16 weights are half";
  if (count(got, "reduce_scatter") != count(want, "reduce_scatter"))
    return testing::AssertionFailure() << "the reduce-scatters differ from the fp32 ZeRO-3's "
                                       << "(fp32 gradients, every unit once)";
  return testing::AssertionSuccess() << g.calls << " all-gathers, " << g.bytes << " bytes";
}

}  // namespace

TEST(Step4_Bf16, Zero3GathersBf16Weights) {
  lab09::Zero3 z(kLab.config(), mixed_bf16(), world());
  EXPECT_TRUE(gathers_bf16(z));
  // the peak of gathered units: the fp32 schedule's elements at 2 bytes
  lab09::Zero3 fp32(kLab.config(), f32(), world());
  run_steps(fp32, 1);
  EXPECT_GT(z.peak_gathered_bytes(), 0u);
  EXPECT_EQ(2 * z.peak_gathered_bytes(), fp32.peak_gathered_bytes());
}

TEST(Step4_Bf16PlantedFault, GatheringFp32AndCastingAfterIsCaught) {
  CastsAfterGather bad;
  EXPECT_TRUE(steps_like_the_bf16_ddp(bad, kZero3Rtol, kZero3Atol)) << "its numbers are right";
  CastsAfterGather fresh;
  EXPECT_FALSE(gathers_bf16(fresh)) << "but moves fp32 on the wire";
}

TEST(Step4_Bf16, BetweenStepsOnlyTheFp32ShardsHeldEqualsTheAllocator) {
  std::shared_ptr<lab09::Zero3> t;
  const Footprint f = footprint([&]() {
    t = std::make_shared<lab09::Zero3>(kLab.config(), mixed_bf16(), world());
    return Steps{[t](const data::Batch& b) { t->forward_backward(b); }, [t]() { t->step(kLr); }};
  });
  const nn::ParameterSet& ps = t->model().params();
  std::size_t shard_elements = 0;
  for (std::size_t u = 0; u < ps.units().size(); ++u) {
    EXPECT_FALSE(ps.compute_bound(u)) << ps.units()[u].name << "'s bf16 weights are still there";
    EXPECT_FALSE(ps.values_bound(u)) << ps.units()[u].name << "'s fp32 values were bound";
    EXPECT_FALSE(ps.grads_bound(u)) << ps.units()[u].name << "'s gradients are still there";
    shard_elements += static_cast<std::size_t>(t->unit_shard(u).size);
  }
  const lab09::Held h = t->held();
  EXPECT_EQ(h.params, shard_elements * 4) << "the fp32 master shards, no bf16 copy";
  EXPECT_EQ(h.grads, shard_elements * 4) << "the fp32 gradient shards";
  EXPECT_EQ(h.total(), f.held) << "held counters against the allocator";
  EXPECT_LE(f.held, shard_elements * 16) << "16 bytes per shard element at most";
}
