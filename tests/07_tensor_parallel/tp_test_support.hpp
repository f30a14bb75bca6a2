#pragma once
// What lab 07's graders share: the tp group (the whole world), deterministic values, cutting a
// full tensor to a shard, comparisons with a tolerance relative to the largest value, and reading
// the byte counters around a call.
//
// Tolerances (float64 throughout): values that went through an all-reduce or a sharded GEMM are
// summed in another order than on one device, so they are compared at kRel = 1e-12 of the largest
// |value| of the tensor; over 5 AdamW steps at kAdamRel = 1e-9 (AdamW divides by sqrt(v), which
// amplifies the first rounding differences). Integer-valued tensors (step 1) are exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/comm/stats.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"
#include "common/nn/parameter.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/work.hpp"
#include "common/optim/optim.hpp"
#include "common/tensor.hpp"
#include "tensor_parallel.hpp"
#include "tests/support/lab_fixture.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/traffic_budget.hpp"

namespace lab07test {

using namespace scalelab;

inline constexpr double kRel = 1e-12;
inline constexpr double kAdamRel = 1e-9;
/// Mixed precision (fp32 master, bf16 compute), against the single-device GPT in the same
/// precision: each rank rounds its partial sums to bf16 before the all-reduce adds them, and bf16
/// keeps 8 bits (2^-8 = 4e-3 relative), so gradients agree within kBf16Rel of their largest
/// element and the loss within kBf16Loss relative.
inline constexpr double kBf16Rel = 3e-2;
inline constexpr double kBf16Loss = 2e-3;

/// The tp group of every test: the whole world (1, 2 or 4 ranks).
inline comm::Communicator& group() { return labtest::world(); }
inline int rank() { return group().rank(); }
inline int size() { return group().size(); }

/// Heads (4), MLP width (128) and vocabulary (256) divide by 1, 2 and 4.
inline ModelConfig test_config() { return ModelConfig{"tp-test", 256, 16, 2, 4, 32}; }

/// Values in [-1, 1) from (seed, index): the same on every rank.
inline Tensor random_tensor(std::vector<int64_t> shape, uint64_t seed, DType dt = DType::f64) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (double& e : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    e = static_cast<double>(x >> 11) / 9007199254740992.0 * 2 - 1;
  }
  return Tensor::from_vector(v, shape, dt);
}

/// Token ids in [0, V) from seed, (B, T) i32, the same on every rank.
inline Tensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::vector<double> v(B * T);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  for (double& e : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    e = static_cast<double>((x >> 33) % V);
  }
  return Tensor::from_vector(v, {B, T}, DType::i32);
}

/// The part of a full tensor (1-d or 2-d) that `s` keeps, as a flat vector.
inline std::vector<double> cut(const Tensor& full, const nn::Shard& s) {
  const std::vector<double> all = full.to_vector();
  if (s.whole()) return all;
  const int64_t R = full.size(0), C = full.dim() > 1 ? full.size(1) : 1;
  std::vector<double> out;
  if (s.dim == 0) {
    for (auto [b, e] : s.ranges)
      for (int64_t r = b; r < e; ++r)
        for (int64_t c = 0; c < C; ++c) out.push_back(all[r * C + c]);
  } else {
    for (int64_t r = 0; r < R; ++r)
      for (auto [b, e] : s.ranges)
        for (int64_t c = b; c < e; ++c) out.push_back(all[r * C + c]);
  }
  return out;
}

/// Columns [b, e) of a 2-d (N, C) tensor (as a new (N, e - b) tensor).
inline Tensor columns(const Tensor& t, int64_t b, int64_t e) {
  return Tensor::from_vector(cut(t, nn::Shard{1, {{b, e}}}), {t.size(0), e - b}, t.dtype());
}

/// |got - want| <= rel * max|want| elementwise (and the same number of elements).
inline ::testing::AssertionResult near(const std::vector<double>& got,
                                       const std::vector<double>& want, double rel = kRel) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements, want " << want.size();
  double scale = 1e-300;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= rel * scale))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << " vs " << want[i] << " (tolerance "
             << rel * scale << " = " << rel << " x max |want|)";
  return ::testing::AssertionSuccess();
}
inline ::testing::AssertionResult near(const Tensor& got, const std::vector<double>& want,
                                       double rel = kRel) {
  return near(got.to_vector(), want, rel);
}
inline ::testing::AssertionResult near(const Tensor& got, const Tensor& want, double rel = kRel) {
  return near(got.to_vector(), want.to_vector(), rel);
}

/// True on every rank iff `ok` on every rank (collective; not counted inside a traffic_of).
/// A check that would stop early on one rank must agree first: the others would wait for it in
/// the next collective.
inline bool on_every_rank(bool ok) {
  Tensor flag = Tensor::from_vector({ok ? 1.0 : 0.0}, {1}, DType::f64);
  group().all_reduce(flag, comm::ReduceOp::min);
  return flag.item() == 1.0;
}

/// Collects the first failure of a check and lets it go on, so every rank runs every collective
/// of the check whatever it finds (a rank that returned early would leave the others waiting).
struct Verdict {
  ::testing::AssertionResult first = ::testing::AssertionSuccess();
  void operator()(::testing::AssertionResult r, const std::string& what) {
    if (first && !r) first = ::testing::AssertionFailure() << r.message() << what;
  }
  explicit operator bool() const { return static_cast<bool>(first); }
};

/// What a call sent (the library's ledger: every communicator, every op, its reduction) and
/// computed (the tensor ops' work counters) on this rank: a rank that computes the whole layer
/// gives the right numbers too, not the right work; an all-reduce on a communicator of its own,
/// or a max where the technique sums, gives the right bytes on the tp group, not the right
/// traffic.
struct Traffic {
  comm::Traffic moved;
  ops::WorkCount work;
  std::string str() const { return labtest::traffic_str(moved); }
};
inline Traffic traffic_of(const std::function<void()>& fn) {
  const ops::WorkCount work_before = ops::work_stats();
  Traffic t;
  t.moved = labtest::traffic_of(fn);
  t.work = ops::work_stats() - work_before;
  return t;
}

/// This rank did exactly 1/tp of `whole`'s GEMM FLOPs (the shards divide evenly).
inline ::testing::AssertionResult a_share_of_the_work(const Traffic& t,
                                                      const ops::WorkCount& whole, int tp) {
  if (t.work.matmul_flops * tp == whole.matmul_flops) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "this rank's matmuls did " << t.work.matmul_flops << " FLOPs, want 1/" << tp
         << " of the single device's " << whole.matmul_flops << " (the tensor ops' counters)";
}

/// Exactly `budget` on every communicator (tests/support/traffic_budget.hpp), this rank named,
/// the offending rows and then everything sent on one line.
inline ::testing::AssertionResult exactly(const Traffic& t, const labtest::TrafficBudget& budget) {
  return labtest::exact_traffic(t.moved, budget);
}

/// Exactly `calls` sum all-reduces of `bytes` in total on the tp group, and nothing else on any
/// communicator.
inline ::testing::AssertionResult only_all_reduces(const Traffic& t, int64_t calls,
                                                   int64_t bytes) {
  return exactly(t, labtest::TrafficBudget{}.all_reduce(group(), calls, bytes));
}

/// Mixed precision: three steps (forward, backward; AdamW) of make_tp_gpt's model with a bf16 compute copy
/// beside the single-device nn::GPT in the same precision, same seed and batches: the losses
/// within kBf16Loss, every gradient of the first step within kBf16Rel, the activations bf16
/// (their statistics fp32) and the compute copy refreshed by AdamW (equal to bf16(master)).
inline void expect_mixed_precision_follows_single_device(bool sequence_parallel, uint64_t seed) {
  const ModelConfig c = test_config();
  nn::GPT single(c, nn::GPTOptions{.seed = seed, .compute_dtype = DType::bf16});
  auto part_model = lab07::make_tp_gpt(c, group(), {.compute_dtype = DType::bf16, .seed = seed,
                                                    .sequence_parallel = sequence_parallel});
  nn::GPT& part = *part_model;
  optim::AdamW a1(optim::groups(single.parameters())), a2(optim::groups(part.parameters()));
  for (int step = 0; step < 3; ++step) {
    const Tensor x = random_tokens(2, 8, c.vocab_size, seed + 10 + step),
                 y = random_tokens(2, 8, c.vocab_size, seed + 20 + step);
    single.zero_grad();
    const double want = single.forward(x, y);
    single.backward();
    part.zero_grad();
    nn::GPTActivations acts;
    const double got = part.forward(x, y, acts);
    ASSERT_EQ(acts.head.probs.dtype(), DType::bf16) << "the head's probabilities on rank " << rank();
    ASSERT_EQ(acts.head.lnf_mean.dtype(), DType::f32) << "ln_f's statistics on rank " << rank();
    part.backward(acts);
    EXPECT_NEAR(got, want, kBf16Loss * std::abs(want)) << "loss of step " << step + 1;
    if (step == 0)
      for (nn::Parameter* p : part.parameters()) {
        ASSERT_EQ(p->grad.dtype(), DType::f32) << p->name << ": fp32 gradients";
        EXPECT_TRUE(near(p->grad, cut(single.params().get(p->name).grad, p->shard), kBf16Rel))
            << p->name << "'s gradient on rank " << rank();
      }
    a1.step(1e-2);
    a2.step(1e-2);
    for (nn::Parameter* p : part.parameters()) {
      Tensor want_copy = Tensor::empty(p->value.shape(), DType::bf16);
      ops::cast(want_copy, p->value);
      ASSERT_EQ(p->compute_value().to_vector(), want_copy.to_vector())
          << p->name << ": the compute copy is bf16(master) after AdamW, rank " << rank();
    }
  }
}

/// Block 0 of `c` as lab07::make_block cuts it for this rank (its shard of `whole`'s values,
/// f64) with `mappings`, forward and backward on `x` and `dout`, on the host and again with
/// everything on the simulated GPU (tests/support/on_sim.hpp): the output, dx and the
/// gradients bit for bit. `seq_len`: the sequence length when x holds this rank's token rows
/// (sequence parallel), else 0. A stop there (a tensor made without its device, a loop over
/// elements) ends the job with its line (collective_run_on_sim); "" or the problems found.
inline std::string block_runs_on_sim_as_on_host(const ModelConfig& c, const nn::ParameterSet& whole,
                                                const nn::Mappings& mappings, const Tensor& x,
                                                const Tensor& dout, int64_t seq_len = 0) {
  const auto cut_block = [&](Device device, nn::ParameterSet& set) {
    auto part = lab07::make_block(0, c, rank(), size());
    part->mappings = &mappings;
    set.bind(part->parameters(), DType::f64, device, 3);
    for (nn::Parameter* p : part->parameters())
      p->value.copy_from(
          Tensor::from_vector(cut(whole.get(p->name).value, p->shard), p->shape(), DType::f64));
    return part;
  };
  nn::ParameterSet host_set, sim_set;
  const auto host = cut_block(Device::cpu(), host_set);
  nn::BlockActivations host_acts;
  const Tensor y = host->forward(x, host_acts, seq_len);
  const Tensor dx = host->backward(dout, x, host_acts, nullptr, seq_len);
  std::vector<std::string> problems;
  labtest::collective_run_on_sim([&] {
    const Device sim = Device::sim();
    const auto part = cut_block(sim, sim_set);
    const Tensor x_s = x.to(sim);
    nn::BlockActivations acts;
    problems.push_back(labtest::same_on_sim("the block's output", y, part->forward(x_s, acts, seq_len)));
    problems.push_back(labtest::same_on_sim(
        "the block's dx", dx, part->backward(dout.to(sim), x_s, acts, nullptr, seq_len)));
    problems.push_back(labtest::same_on_sim("the block's gradients", host_set.grads(), sim_set.grads()));
  });
  return labtest::joined(problems);
}

}  // namespace lab07test
