// Parameter storage for ZeRO, on one rank (the collectives are lab 09's; here a copy stands in
// for them): shards of a padded flat layout, optimizer groups over a shard, gradients kept per
// unit and released as soon as they are reduced (ZeRO-2: the full gradient never exists, the
// allocator's peak shows it), values kept per unit, released and gathered again (ZeRO-3: the
// bytes go back), and in mixed precision a unit's bf16 compute buffer bound alone (ZeRO-3 in
// bf16: the layers read it while the fp32 values stay unbound). Every model result is compared
// bitwise with the flat model's (CPU, same ops).
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "common/nn/gpt.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "tests/common/gradcheck.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {

ModelConfig config() { return ModelConfig{"storage", 64, 16, 4, 2, 32}; }

void expect_bitwise(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.item(i), want.item(i)) << what << " at " << i;
}

std::size_t now() { return memory_stats(Device::cpu()).current; }

// ZeRO-3's step on one rank: every unit of the per-unit `model` bound by `gather` (values, or in
// mixed precision the bf16 compute buffer); its loss and unit gradients equal the `flat` model's
// bitwise; then `release` frees each unit and the allocator is back at `before`.
void expect_gathered_units_run_like_flat(nn::GPT& model, nn::GPT& flat, const Tensor& x,
                                         const Tensor& y,
                                         const std::function<void(std::size_t)>& gather,
                                         const std::function<void(std::size_t)>& release,
                                         std::size_t before) {
  nn::ParameterSet& ps = model.params();
  for (std::size_t u = 0; u < ps.units().size(); ++u) gather(u);
  flat.zero_grad();
  const double want = flat.forward(x, y);
  flat.backward();
  EXPECT_EQ(model.forward(x, y), want);
  model.backward();
  for (std::size_t u = 0; u < ps.units().size(); ++u) {
    expect_bitwise(ps.unit_grads(u),
                   flat.params().grads().flat(ps.units()[u].lo, ps.units()[u].numel()),
                   ps.units()[u].name);
    release(u);
    ps.release_grads(u);
  }
  EXPECT_EQ(now(), before) << "nothing of the model is held when every unit is released";
}

}  // namespace

TEST(ParamStorage, ShardRangesCoverThePaddedLayoutInEqualShards) {
  // 10 elements over 4 shards: size 3, padded to 12; the last shard holds 1 real element
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 3}, {3, 6}, {6, 9}, {9, 10}};
  for (int r = 0; r < 4; ++r) {
    const nn::ShardRange s = nn::shard_range(10, r, 4);
    EXPECT_EQ(s.size, 3);
    EXPECT_EQ(std::make_pair(s.lo, s.hi), want[r]) << "shard " << r;
  }
  // more shards than elements: the last shards are all padding
  EXPECT_EQ(nn::shard_range(2, 3, 4).real(), 0);
  EXPECT_EQ(nn::shard_range(12, 3, 4).lo, 9);
  EXPECT_EQ(nn::shard_range(12, 3, 4).hi, 12);
}

TEST(ParamStorage, FlatLayoutPadsToAMultipleAndKeepsThePaddingZero) {
  nn::GPTOptions o;
  o.storage.pad_to = 7;
  nn::GPT model(config(), o), plain(config());
  EXPECT_EQ(model.params().numel(), plain.params().numel());
  EXPECT_EQ(model.params().padded_numel() % 7, 0);
  EXPECT_LT(model.params().padded_numel() - model.params().numel(), 7);
  EXPECT_EQ(model.params().values().numel(), model.params().numel()) << "values(): no padding";
  const Tensor& padded = model.params().padded_values();
  for (int64_t i = model.params().numel(); i < padded.numel(); ++i) EXPECT_EQ(padded.item(i), 0.0);
  expect_bitwise(model.params().values(), plain.params().values(), "same values, padded or not");
}

TEST(ParamStorage, AdamWOverAShardEqualsTheFullStepOnThatRange) {
  // ZeRO-1's optimizer: m and v for 1/n of the elements, and the same update there
  nn::GPT full(config()), sharded(config());
  fill_uniform(full.params().grads(), 3, -1, 1);
  sharded.params().grads().copy_from(full.params().grads());
  optim::AdamW whole(optim::groups(full.parameters()));
  const int n = 3;
  std::vector<optim::AdamW> shards;
  for (int r = 0; r < n; ++r) {
    const nn::ShardRange s = nn::shard_range(sharded.params().numel(), r, n);
    Tensor v = sharded.params().values().flat(s.lo, s.real());
    Tensor g = sharded.params().grads().flat(s.lo, s.real());
    shards.emplace_back(optim::groups_in_range(sharded.params(), s.lo, s.hi, v, g));
    EXPECT_EQ(shards.back().state_bytes(), static_cast<std::size_t>(s.real()) * 2 * 4)
        << "m and v for this shard only";
  }
  for (int step = 0; step < 3; ++step) {
    whole.step(1e-2);
    for (auto& a : shards) a.step(1e-2);
  }
  expect_bitwise(sharded.params().values(), full.params().values(), "values after 3 steps");
  // weight decay follows each parameter across shard borders: a range cut inside wte decays
  const auto g = optim::groups_in_range(sharded.params(), 5, 20, sharded.params().values(),
                                        sharded.params().grads());
  ASSERT_EQ(g.size(), 1u);
  EXPECT_TRUE(g[0].weight_decay);
  EXPECT_EQ(g[0].value.numel(), 15);
}

TEST(ParamStorage, GradientsPerUnitReleasedAfterTheirReduceNeverHoldTheFullGradient) {
  // ZeRO-2: a unit's gradients exist from its backward until its "reduce-scatter" (a copy of
  // this rank's part into the shard buffer here), then they are released.
  const int n = 4, rank = 1;
  Tensor x = random_tokens({2, 16}, 64, 1), y = random_tokens({2, 16}, 64, 2);

  nn::GPT flat(config());
  flat.zero_grad();
  flat.forward(x, y);
  reset_peak_memory(Device::cpu());
  const std::size_t flat_base = now();
  flat.backward();
  const std::size_t flat_peak = memory_stats(Device::cpu()).peak - flat_base;

  nn::GPTOptions o;
  o.storage.grads = nn::Storage::per_unit;
  o.storage.pad_to = n;
  nn::GPT model(config(), o);
  nn::ParameterSet& ps = model.params();
  const nn::ShardRange mine = nn::shard_range(ps.numel(), rank, n);
  Tensor shard = Tensor::zeros({mine.size});  // this rank's gradient shard: 1/n of the layout
  std::map<std::size_t, std::size_t> done;     // unit -> parameters whose gradient is final
  bool ever_all_bound = true;
  model.set_backward_hook([&](const std::vector<nn::Parameter*>& ready) {
    for (nn::Parameter* p : ready) {
      const std::size_t u = ps.unit_of(p);
      const nn::Unit& unit = ps.units()[u];
      if (++done[u] < unit.last - unit.first) continue;
      // the unit is complete: "reduce-scatter" its part of my shard, then drop it
      const int64_t b = std::max(unit.lo, mine.lo), e = std::min(unit.hi, mine.hi);
      if (b < e) {
        Tensor dst = shard.flat(b - mine.lo, e - b);
        dst.copy_from(ps.unit_grads(u).flat(b - unit.lo, e - b));
      }
      for (std::size_t v = 0; v < ps.units().size(); ++v) ever_all_bound &= ps.grads_bound(v);
      ps.release_grads(u);
    }
  });
  EXPECT_THROW(ps.grads(), CheckFailed) << "no flat gradient buffer";
  for (std::size_t u = 0; u < ps.units().size(); ++u) EXPECT_FALSE(ps.grads_bound(u));
  const std::size_t before_step = now();
  model.forward(x, y);
  reset_peak_memory(Device::cpu());
  const std::size_t base = now();
  model.backward();
  const std::size_t peak = memory_stats(Device::cpu()).peak - base;
  EXPECT_EQ(now(), before_step) << "after backward nothing is held but the shard: every "
                                   "unit's gradient buffer went back to the allocator";

  EXPECT_FALSE(ever_all_bound) << "every unit's gradients were held at once";
  for (std::size_t u = 0; u < ps.units().size(); ++u)
    EXPECT_FALSE(ps.grads_bound(u)) << ps.units()[u].name << " released after its reduce";
  const std::size_t full_grad = static_cast<std::size_t>(ps.numel()) * 4;
  // the flat model's backward peak is on top of its full gradient, allocated at bind; this one
  // holds at most a few units at once (the tied embedding's lives through the whole backward)
  EXPECT_LT(peak, flat_peak + full_grad / 2)
      << "per-unit gradients must keep the peak well below the flat model's + full gradient";
  // and the shard got exactly the flat model's gradients on [lo, hi)
  expect_bitwise(shard.flat(0, mine.real()),
                 flat.params().grads().flat(mine.lo, mine.real()), "gradient shard");
}

TEST(ParamStorage, ValuesPerUnitAreReleasedAndGatheredBack) {
  // ZeRO-3: the model keeps only this rank's shard of the values; a unit's values are bound and
  // "all-gathered" (copied from the full layout here) before use, and released after.
  nn::GPT flat(config());
  const Tensor full = flat.params().values().clone();  // what an all-gather would return
  Tensor x = random_tokens({2, 16}, 64, 3), y = random_tokens({2, 16}, 64, 4);

  nn::GPTOptions o;
  o.storage.values = nn::Storage::per_unit;
  o.storage.grads = nn::Storage::per_unit;
  std::vector<double> seen;  // on_init shows every unit's initial values once
  o.on_init = [&](const nn::Unit&, const Tensor& v) {
    for (double d : v.to_vector()) seen.push_back(d);
  };
  nn::GPT model(config(), o);
  nn::ParameterSet& ps = model.params();
  expect_bitwise(Tensor::from_vector(seen, {static_cast<int64_t>(seen.size())}), full,
                 "initial values drawn as the flat model's");
  for (std::size_t u = 0; u < ps.units().size(); ++u) EXPECT_FALSE(ps.values_bound(u));
  EXPECT_THROW(model.forward(x, y), CheckFailed) << "forward on released values";

  auto gather = [&](std::size_t u) {
    Tensor v = ps.bind_values(u);
    v.copy_from(full.flat(ps.units()[u].lo, ps.units()[u].numel()));
  };
  // a unit's bytes come and go with bind / release
  const std::size_t before = now();
  const std::size_t b1 = model.block_unit(1);
  gather(b1);
  EXPECT_EQ(now() - before, static_cast<std::size_t>(ps.units()[b1].numel()) * 4);
  ps.release_values(b1);
  EXPECT_EQ(now(), before) << "a released block's parameters free their bytes";

  // forward/backward with everything gathered equals the flat model bitwise
  expect_gathered_units_run_like_flat(model, flat, x, y, gather,
                                      [&](std::size_t u) { ps.release_values(u); }, before);
}

TEST(ParamStorage, MixedPrecisionPerUnitComputeBuffersAloneRunTheModel) {
  // ZeRO-3 in bf16: the rank keeps fp32 shards; a unit's bf16 weights are "gathered" (the cast of
  // the flat model's values copied in here) into its compute buffer, and only that is bound.
  nn::GPTOptions mixed;
  mixed.compute_dtype = DType::bf16;
  nn::GPT flat(config(), mixed);  // the flat mixed model: its compute copy is cast(values)
  const Tensor full = flat.params().compute_values().clone();
  Tensor x = random_tokens({2, 16}, 64, 5), y = random_tokens({2, 16}, 64, 6);

  nn::GPTOptions o = mixed;
  o.storage.values = nn::Storage::per_unit;
  o.storage.grads = nn::Storage::per_unit;
  nn::GPT model(config(), o);
  nn::ParameterSet& ps = model.params();
  EXPECT_TRUE(ps.mixed());
  EXPECT_EQ(ps.compute_dtype(), DType::bf16) << "activations in bf16 without a flat copy";
  EXPECT_FALSE(ps.compute_values().defined()) << "per-unit values: no flat compute copy";
  for (std::size_t u = 0; u < ps.units().size(); ++u) {
    EXPECT_FALSE(ps.compute_bound(u)) << ps.units()[u].name;
    EXPECT_FALSE(ps.values_bound(u)) << ps.units()[u].name;
  }
  EXPECT_THROW(model.forward(x, y), CheckFailed) << "forward without the bf16 weights";

  auto gather = [&](std::size_t u) {
    Tensor c = ps.bind_compute(u);
    c.copy_from(full.flat(ps.units()[u].lo, ps.units()[u].numel()));
  };
  // a unit's compute buffer: 2 bytes per parameter, the parameters' `compute` point into it,
  // their values stay unbound; the bytes go back with release_compute
  const std::size_t before = now();
  const std::size_t b1 = model.block_unit(1);
  gather(b1);
  EXPECT_EQ(now() - before, static_cast<std::size_t>(ps.units()[b1].numel()) * 2);
  EXPECT_TRUE(ps.compute_bound(b1));
  EXPECT_FALSE(ps.values_bound(b1));
  for (std::size_t i = ps.units()[b1].first; i < ps.units()[b1].last; ++i) {
    const nn::Parameter& p = *ps.list()[i];
    EXPECT_EQ(p.compute.dtype(), DType::bf16) << p.name;
    EXPECT_EQ(p.compute.shape(), p.shape()) << p.name;
    EXPECT_FALSE(p.value.defined()) << p.name;
    EXPECT_TRUE(p.compute_value().shares_storage_with(ps.unit_compute(b1))) << p.name;
  }
  EXPECT_THROW(ps.bind_compute(b1), CheckFailed) << "bound twice";
  ps.release_compute(b1);
  EXPECT_FALSE(ps.compute_bound(b1));
  EXPECT_FALSE(ps.list()[ps.units()[b1].first]->compute.defined());
  EXPECT_EQ(now(), before) << "a released unit's compute buffer frees its bytes";

  // every unit's compute buffer bound (no values): the flat mixed model's loss and fp32
  // gradients, bitwise
  expect_gathered_units_run_like_flat(model, flat, x, y, gather, [&](std::size_t u) {
    EXPECT_FALSE(ps.values_bound(u)) << ps.units()[u].name;
    ps.release_compute(u);
  }, before);

  // only per-unit values in mixed precision have per-unit compute buffers; elsewhere what the
  // layers read follows the set's own storage
  EXPECT_THROW(flat.params().bind_compute(0), CheckFailed) << "flat: one copy, always bound";
  EXPECT_TRUE(flat.params().compute_bound(0));
  nn::GPTOptions f32 = o;
  f32.compute_dtype = DType::f32;
  nn::GPT fp32(config(), f32);
  EXPECT_THROW(fp32.params().bind_compute(0), CheckFailed) << "fp32: no bf16 copy";
  EXPECT_FALSE(fp32.params().compute_bound(0));
  fp32.params().bind_values(0);
  EXPECT_TRUE(fp32.params().compute_bound(0)) << "fp32: the layers read the values";
}
