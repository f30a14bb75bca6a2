// Lab 09 step 4: ZeRO-3. Equal to DDP (and so to stages 1 and 2) over five AdamW steps in
// float64 (kStageRtol / kStageAtol: reduce-scatter sums in another order). The technique: between
// steps a rank holds its shards only (no unit's values or gradients bound; the allocator agrees
// with 16 bytes per shard element); during a step the working set stays under 3/4 of the model's
// values (12 blocks: a block and its prefetched successor are ~16% of it); the traffic is two
// all-gathers of the parameters and one reduce-scatter of the gradients. Planted fault: a ZeRO-3
// that gathers every unit before forward and frees them only after backward: the right numbers,
// no saving during the step; the peak check must fail it. Prefetch: while block i computes its
// forward, the gather of the next unit has been started (seen from the block's reduce_forward
// hook); the planted fault gathers each unit only when it is needed.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "common/train/equivalence.hpp"
#include "ddp.hpp"
#include "tests/09_zero/zero_checks.hpp"
#include "tests/support/reduce_mappings.hpp"

using namespace scalelab;
using namespace scalelab::lab09test;
using labtest::world;

namespace {

const ModelConfig& deep() { return labtest::test_model(12); }

// Elements this rank keeps per kind with per-unit shards, and the largest unit.
struct UnitShards {
  int64_t shard_elements = 0, padded_elements = 0, biggest_unit = 0;
};
UnitShards unit_shards(const ModelConfig& config) {
  nn::GPTOptions o = f32();
  nn::GPT m(config, o);
  UnitShards r;
  for (const nn::Unit& u : m.params().units()) {
    const nn::ShardRange s = nn::shard_range(u.numel(), world().rank(), world().size());
    r.shard_elements += s.size;
    r.padded_elements += s.size * world().size();
    r.biggest_unit = std::max(r.biggest_unit, u.numel());
  }
  return r;
}

// Between steps: values, gradients, m and v for the shards, nothing else (one largest unit of
// slack). During forward_backward: the DDP peak minus everything DDP holds of the model, plus the
// shards, plus a working set under 3/4 of the model's values (gathered units, the prefetched
// one, their staging buffers, unit gradients: the reference needs ~0.6 of that bound with 12
// blocks; gathering everything, the planted fault, needs ~1.3).
testing::AssertionResult keeps_only_shards(const Footprint& stage3, const Footprint& ddp,
                                           const ModelConfig& config) {
  const UnitShards u = unit_shards(config);
  const int64_t P = psi(config);
  const std::size_t shards = static_cast<std::size_t>(u.shard_elements) * 16;
  const std::size_t held_max = shards + static_cast<std::size_t>(u.biggest_unit) * 4;
  if (stage3.held > held_max)
    return testing::AssertionFailure() << "holds " << stage3.held << " bytes between steps; its "
                                       << "shards are " << shards << " (+ one unit of slack)";
  const std::size_t full = static_cast<std::size_t>(P) * 4;
  const std::size_t peak_max = ddp.peak - 4 * full + shards + full * 3 / 4;
  if (stage3.peak > peak_max)
    return testing::AssertionFailure() << "peak " << stage3.peak << " bytes during forward_backward "
                                       << "(DDP: " << ddp.peak << "); gathering unit by unit and "
                                       << "freeing after use keeps it under " << peak_max;
  return testing::AssertionSuccess();
}

// The planted faults: every unit gathered at the start of forward_backward and released at its
// end (not freeing gathered parameters), or, with on_demand, each unit gathered just before its
// forward and kept (no prefetch: the transfer never overlaps compute).
struct GathersEverything {
  bool on_demand = false;
  HandZero3 z;
  std::unique_ptr<nn::GPT> model;
  explicit GathersEverything(const ModelConfig& config, bool demand = false) : on_demand(demand) {
    model = std::make_unique<nn::GPT>(config, z.options(f32()));
    z.make_optimizer(model->params());
  }
  void gather(std::size_t u) {
    nn::ParameterSet& ps = model->params();
    ps.bind_values(u).copy_from(z.gather_fp32(ps, u));
  }
  void forward_backward(const data::Batch& global) {
    nn::ParameterSet& ps = model->params();
    const data::Batch mine = labtest::my_rows(global);
    if (on_demand) {  // fault: a unit's gather starts only when its compute needs it
      const int L = static_cast<int>(model->config().n_layer);
      nn::GPTActivations acts;
      acts.inputs.assign(L, Tensor());
      acts.blocks.assign(L, nn::BlockActivations());
      gather(model->embedding_unit());
      Tensor x = model->embed(mine.x, acts);
      for (int i = 0; i < L; ++i) {
        gather(model->block_unit(i));
        acts.inputs[i] = x;
        x = model->block(i).forward(x, acts.blocks[i]);
      }
      gather(model->head_unit());
      model->head_forward(x, mine.y, acts);
      model->backward(acts);
    } else {
      for (std::size_t u = 0; u < ps.units().size(); ++u) gather(u);  // fault: all of them, now
      model->forward(mine.x, mine.y);
      model->backward();
    }
    for (std::size_t u = 0; u < ps.units().size(); ++u) {
      z.reduce_scatter(ps, u);
      ps.release_values(u);
    }
  }
  void step() { z.adamw->step(kLr); }
};

Footprint ddp_footprint(const ModelConfig& config) { return footprint(0, f32(), &config); }

// How many all-gathers had been submitted (since `run` started) when each block's forward was
// computing: seen from the block's mappings (leave: lab 07's g operator; here a probe, no
// reduction), called after its attention projection.
std::vector<int64_t> gathers_during_block_forward(nn::GPT& model, const std::function<void()>& run) {
  const int L = static_cast<int>(model.config().n_layer);
  std::vector<int64_t> seen(L, -1);
  const comm::CommStats start = comm::comm_stats();
  std::vector<std::unique_ptr<scalelab::labtest::ReduceMappings>> probes;
  for (int i = 0; i < L; ++i) {
    probes.push_back(std::make_unique<scalelab::labtest::ReduceMappings>(
        [&seen, &start, i](Tensor&) {
          if (seen[i] < 0)
            seen[i] = comm::comm_total(comm::comm_stats() - start, "", "all_gather").calls;
        },
        nullptr));
    model.block(i).mappings = probes.back().get();
  }
  run();
  for (int i = 0; i < L; ++i) model.block(i).mappings = nullptr;
  return seen;
}

// Prefetch: while block i computes, the gathers of the embedding, blocks 0..i AND the next unit
// (block i + 1, or the head) have been started: at least i + 3.
testing::AssertionResult prefetches(const std::vector<int64_t>& seen) {
  for (std::size_t i = 0; i < seen.size(); ++i)
    if (seen[i] < static_cast<int64_t>(i) + 3)
      return testing::AssertionFailure() << "while block " << i << " computed its forward, "
                                         << seen[i] << " all-gathers had been started; the next "
                                         << "unit's gather must be in flight (>= " << i + 3 << ")";
  return testing::AssertionSuccess();
}

}  // namespace

TEST(Step4_Zero3, FiveAdamWStepsEqualDdp) {
  lab09::Ddp ddp(kLab.config(), f64(), world());
  lab09::Zero3 three(kLab.config(), f64(), world());
  const std::vector<double> want = run_steps(ddp, 5), got = run_steps(three, 5);
  for (std::size_t s = 0; s < want.size(); ++s)
    EXPECT_NEAR(got[s], want[s], kStageRtol * std::abs(want[s])) << "loss of step " << s;
  EXPECT_TRUE(labtest::close_on_every_rank(three.full_parameters(), ddp.full_parameters(),
                                           kStageRtol, kStageAtol));
}

TEST(Step4_Zero3, NothingGatheredIsLeftBetweenSteps) {
  lab09::Zero3 three(kLab.config(), f32(), world());
  run_steps(three, 1);
  const nn::ParameterSet& ps = three.model().params();
  for (std::size_t u = 0; u < ps.units().size(); ++u) {
    EXPECT_FALSE(ps.values_bound(u)) << ps.units()[u].name << "'s values are still gathered";
    EXPECT_FALSE(ps.grads_bound(u)) << ps.units()[u].name << "'s gradients are still there";
    const nn::ShardRange want = nn::shard_range(ps.units()[u].numel(), world().rank(), world().size());
    EXPECT_EQ(three.unit_shard(u).lo, want.lo) << ps.units()[u].name;
    EXPECT_EQ(three.unit_shard(u).hi, want.hi) << ps.units()[u].name;
  }
  EXPECT_EQ(three.optimizer().state_bytes(),
            static_cast<std::size_t>(unit_shards(kLab.config()).shard_elements) * 8 -
                [&] {  // m and v exist for the real elements only
                  std::size_t pad = 0;
                  for (std::size_t u = 0; u < ps.units().size(); ++u)
                    pad += (three.unit_shard(u).size - three.unit_shard(u).real()) * 8;
                  return pad;
                }());
}

TEST(Step4_Zero3, TheAllocatorSeesOnlyShardsAndASmallWorkingSet) {
  const Footprint ddp = ddp_footprint(deep()), stage3 = footprint(3, f32(), &deep());
  EXPECT_TRUE(keeps_only_shards(stage3, ddp, deep()));
}

TEST(Step4_Zero3, TwoAllGathersAndOneReduceScatter) {
  lab09::Zero3 three(kLab.config(), f32(), world());
  const comm::CommStats s = one_step_traffic(three);
  const UnitShards u = unit_shards(kLab.config());
  const int64_t P = psi();
  EXPECT_EQ(bytes_of(s, "reduce_scatter"), u.padded_elements * 4) << "every unit's gradients once";
  EXPECT_GE(bytes_of(s, "all_gather"), 2 * (P - u.biggest_unit) * 4)
      << "every block gathered for forward and again for backward";
  EXPECT_LE(bytes_of(s, "all_gather"), 3 * u.padded_elements * 4);
  EXPECT_EQ(bytes_of(s, "all_reduce"), 8) << "only the loss is all-reduced";
}

TEST(Step4_PlantedFault, NotFreeingGatheredParametersIsCaught) {
  std::shared_ptr<GathersEverything> t;
  const Footprint bad = footprint([&]() {
    t = std::make_shared<GathersEverything>(deep());
    return Steps{[t](const data::Batch& b) { t->forward_backward(b); }, [t]() { t->step(); }};
  });
  t.reset();
  EXPECT_FALSE(keeps_only_shards(bad, ddp_footprint(deep()), deep()));
}

TEST(Step4_Zero3, TheNextBlocksGatherIsInFlightDuringEachBlock) {
  lab09::Zero3 three(kLab.config(), f32(), world());
  const std::vector<int64_t> seen = gathers_during_block_forward(
      three.model(), [&] { three.forward_backward(kLab.batch(0)); });
  EXPECT_TRUE(prefetches(seen));
}

TEST(Step4_PlantedFault, GatheringOnlyWhenNeededIsCaught) {
  GathersEverything on_demand(kLab.config(), true);
  const std::vector<int64_t> seen = gathers_during_block_forward(
      *on_demand.model, [&] { on_demand.forward_backward(kLab.batch(0)); });
  EXPECT_FALSE(prefetches(seen));
}
