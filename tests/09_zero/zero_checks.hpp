#pragma once
// What lab 09's graders share: the setup, how a trainer is driven for a few steps, and the
// memory and traffic measurements (allocator and byte counters) that the planted faults must
// fail too. Everything here is collective where it steps a trainer.
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "common/allocator.hpp"
#include "common/comm/stats.hpp"
#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/heap.hpp"
#include "tests/support/lab_fixture.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"
#include "tests/support/traffic_budget.hpp"
#include "zero.hpp"

namespace scalelab::lab09test {

inline constexpr labtest::Setup kLab{.seed = 909, .global_batch = 8, .corpus_seed = 9, .n_layer = 4};
inline constexpr double kLr = 1e-2;

/// Stages against each other over several AdamW steps, in float64: the stages reduce the
/// gradients in another order (all-reduce, reduce to owners, reduce-scatter), and AdamW divides
/// by small second moments, which amplifies the last bits; in float64 the drift stays far below
/// this tolerance after 5 steps.
inline constexpr double kStageRtol = 1e-9, kStageAtol = 1e-12;

inline nn::GPTOptions f32() { return {.seed = kLab.seed}; }
inline nn::GPTOptions f64() { return {.dtype = DType::f64, .seed = kLab.seed}; }
/// Mixed precision: fp32 master values, gradients and AdamW state, a bf16 compute copy.
inline nn::GPTOptions mixed_bf16() { return {.seed = kLab.seed, .compute_dtype = DType::bf16}; }

/// Every rank's bf16 compute copy is cast(its fp32 values), bit for bit (padding included),
/// compared in fp32 (bf16 -> fp32 is exact). Collective.
inline testing::AssertionResult compute_is_cast(nn::ParameterSet& ps) {
  const int64_t n = ps.padded_numel();
  Tensor want = Tensor::empty({n}, DType::bf16, ps.device());
  ops::cast(want, ps.padded_values());
  Tensor want32 = Tensor::empty({n}, DType::f32, ps.device());
  ops::cast(want32, want);
  Tensor got32 = Tensor::zeros({n}, DType::f32, ps.device());
  const bool has_copy = ps.compute_values().defined();
  if (has_copy) ops::cast(got32, ps.compute_values());
  auto r = labtest::close_on_every_rank(got32, want32, 0, 0);  // collective whatever has_copy
  if (!has_copy) return testing::AssertionFailure() << "the set has no bf16 compute copy";
  if (!r) return r << " (the bf16 compute copy is not cast(values))";
  return r;
}

/// The fp32 values on every rank again after each rank stepped its own shard: one all_gather
/// into the padded flat values, NOTHING else (the planted faults build their wrong trainers on
/// it; the bf16 copy is deliberately left alone). Collective.
inline void gather_fp32_values(nn::ParameterSet& ps, const nn::ShardRange& s) {
  Tensor& all = ps.padded_values();
  labtest::world().all_gather(all.flat(labtest::world().rank() * s.size, s.size).clone(), all);
}

inline std::size_t now_bytes() { return memory_stats(Device::cpu()).current; }

/// The trainer of `stage`, built by the grader from the classes themselves (issue 34: one object,
/// the grader's own): never through make_trainer, which lives in the attendee's file and could
/// hand the memory or traffic checks another object than the one the numbers were checked on.
inline std::unique_ptr<lab09::Trainer> grader_trainer(int stage, const ModelConfig& config,
                                                      const nn::GPTOptions& options) {
  comm::Communicator& w = labtest::world();
  switch (stage) {
    case 0: return std::make_unique<lab09::Ddp>(config, options, w);
    case 1: return std::make_unique<lab09::Zero1>(config, options, w);
    case 2: return std::make_unique<lab09::Zero2>(config, options, w);
    default: return std::make_unique<lab09::Zero3>(config, options, w);
  }
}

/// A model whose sizes n does not divide at n = 2 or 4: tiny's shape with a vocabulary of 257 and
/// a width of 33 (3 heads of 11). kLab's model (width 32) has every unit a multiple of 4, so at
/// n = 1, 2, 4 its layouts need no padding and code that ignores the padding (a gather into
/// values(), a reduce-scatter of an unpadded unit) passes every check run on it. Here the flat
/// layout (36069 elements), the embedding (9009) and each block (13497) are odd, and the head
/// (ln_f, 66) is not a multiple of 4. The same block size (16), so kLab's batches feed it.
inline const ModelConfig& odd_model() {
  static const ModelConfig c = [] {
    ModelConfig m = kLab.config();
    m.name = "tiny-odd";
    m.vocab_size = 257;
    m.n_embd = 33;
    m.n_head = 3;
    m.n_layer = 2;
    return m;
  }();
  return c;
}

/// The trainer's own name in a report ("Zero2"; stage 0 is the given "Ddp").
inline std::string trainer_name(const lab09::Trainer& t) {
  const int k = t.stage();
  return k == 0 ? "Ddp (given)" : "Zero" + std::to_string(k);
}

/// `call()`, a call into `what` ("Zero1::step"): a library check that fails inside it (a
/// CheckFailed thrown in common/: a collective's shapes, a released unit read) is thrown again
/// with the lab's function named first, so the report says which of the attendee's functions
/// was running and not only which line of common/ checked.
template <class F>
decltype(auto) calling(const std::string& what, F&& call) {
  try {
    return call();
  } catch (const CheckFailed& e) {
    throw CheckFailed(fmt::format("in {} (zero.cpp), a library check failed: {}", what, e.what()));
  }
}

/// t.forward_backward(b) and t.step(kLr), named in a library check's failure (calling).
inline double forward_backward_of(lab09::Trainer& t, const data::Batch& b) {
  return calling(trainer_name(t) + "::forward_backward", [&] { return t.forward_backward(b); });
}
inline void step_of(lab09::Trainer& t) {
  calling(trainer_name(t) + "::step", [&] { t.step(kLr); });
}

/// Runs `steps` forward_backward + step on the global batches 0, 1, ...; returns the losses.
inline std::vector<double> run_steps(lab09::Trainer& t, int steps) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    losses.push_back(forward_backward_of(t, kLab.batch(s)));
    step_of(t);
  }
  return losses;
}

/// Stage `stage`'s trainer (the grader's object, grader_trainer) run twice for two steps from the
/// same start, its model on the host and on the simulated GPU (tests/support/on_sim.hpp), fp32
/// and mixed bf16: the same losses and parameters bit for bit (the same kernels and sums run).
/// A shard, a staging buffer or a cast made without the model's device, or a loop over a shard's
/// elements, stops on the simulated GPU with the op's or the tensor's own line, as on a GPU: ""
/// or the problems found. Collective.
inline std::string runs_on_sim_as_on_host(int stage) {
  std::vector<std::string> problems;
  for (const nn::GPTOptions& host_options : {f32(), mixed_bf16()}) {
    const std::string kind = host_options.compute_dtype == DType::bf16 ? "bf16" : "fp32";
    const auto host = grader_trainer(stage, kLab.config(), host_options);
    const std::vector<double> want = run_steps(*host, 2);
    const Tensor want_params = host->full_parameters();
    labtest::collective_run_on_sim([&] {
      nn::GPTOptions options = host_options;
      options.device = Device::sim();
      const auto sim = grader_trainer(stage, kLab.config(), options);
      // the optimizer steps and the gathers copy nothing between the host and the device (a
      // shard stepped or gathered through a host copy: right numbers, PCIe twice a step on a GPU)
      std::vector<double> got;
      HostDeviceCopies in_steps;
      for (int s = 0; s < 2; ++s) {
        got.push_back(forward_backward_of(*sim, kLab.batch(s)));
        const HostDeviceCopies moved = labtest::copies_of([&] { step_of(*sim); });
        in_steps.to_host += moved.to_host;
        in_steps.to_device += moved.to_device;
      }
      const std::string copied = labtest::copies_problem(
          fmt::format("{}: two calls of {}::step", kind, trainer_name(*sim)), in_steps,
          static_cast<std::size_t>(sim->model().num_parameters()) * 4);
      if (!copied.empty()) problems.push_back(copied);
      if (got != want)
        problems.push_back(fmt::format("{}: the losses on the simulated GPU are {} (the host's {})",
                                       kind, fmt::join(got, ", "), fmt::join(want, ", ")));
      problems.push_back(labtest::same_on_sim(kind + ": the parameters after two steps",
                                              want_params, sim->full_parameters()));
    });
  }
  return labtest::joined(problems);
}

/// Two backwards of this rank's rows of `global`, every unit reduced after each by `reduce(u)`:
/// lab 10's accumulation (one reduction per micro-batch into the same shard). A reduction that
/// overwrites its shard instead of adding leaves one backward's gradient there, not two.
template <class Reduce>
void two_backwards_each_reduced(nn::GPT& model, const data::Batch& global, Reduce reduce) {
  const data::Batch mine = labtest::my_rows(global);
  for (int k = 0; k < 2; ++k) {
    model.forward(mine.x, mine.y);
    model.backward();
    for (std::size_t u = 0; u < model.params().units().size(); ++u) reduce(u);
  }
}

/// What a trainer costs, from the allocator: `held` the bytes alive after one whole step (what
/// the rank keeps between steps), `peak` the highest bytes alive during the second step's
/// forward_backward, both above what was alive before the trainer was built; `heap_held` and
/// `heap_peak` the same from the rank's whole heap (tests/support/heap.hpp: the tensors' host
/// memory and whatever else is held, a std::vector, a cache or a static's buffer).
struct Footprint {
  std::size_t held = 0, peak = 0;
  int64_t heap_held = 0, heap_peak = 0;
};

/// The heap beyond the tensors, between steps and at the peak, is no more than `bookkeeping`
/// (the trainer's own records: names, unit tables, shapes): a copy kept outside the allocator
/// fails as a tensor would.
inline testing::AssertionResult nothing_beside_tensors(const Footprint& f, int64_t bookkeeping) {
  const int64_t held = f.heap_held - static_cast<int64_t>(f.held),
                peak = f.heap_peak - static_cast<int64_t>(f.peak);
  if (held <= bookkeeping && peak <= bookkeeping) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << "the heap holds " << held << " bytes beside the tensors between steps and " << peak
         << " at the peak (a std::vector, new[], a cache or a static): more than " << bookkeeping
         << " of bookkeeping";
}

/// `make` builds a trainer-like object and returns two actions: a forward_backward and a step.
struct Steps {
  std::function<void(const data::Batch&)> forward_backward;
  std::function<void()> step;
};
inline Footprint footprint(const std::function<Steps()>& make) {
  Footprint f;
  labtest::world().barrier();  // drop what the communicator still holds from earlier work
  const std::size_t base = now_bytes();
  const int64_t heap_base = labtest::heap_stats().current;
  {
    Steps s = make();
    s.forward_backward(kLab.batch(0));
    s.step();
    // The communicator keeps the last operation's tensors (the step's all-gather input) until its
    // next operation: a barrier (no tensors) lets them go, so `held` is what the trainer holds.
    labtest::world().barrier();
    f.held = now_bytes() - base;
    f.heap_held = labtest::heap_stats().current - heap_base;
    reset_peak_memory(Device::cpu());
    labtest::reset_heap_peak();
    s.forward_backward(kLab.batch(1));
    f.peak = memory_stats(Device::cpu()).peak - base;
    f.heap_peak = labtest::heap_stats().peak - heap_base;
    s.step();
  }
  return f;
}
inline Footprint footprint(int stage, const nn::GPTOptions& options = f32(),
                           const ModelConfig* config = nullptr) {
  std::shared_ptr<lab09::Trainer> t;
  return footprint([&]() {
    t = grader_trainer(stage, config ? *config : kLab.config(), options);
    return Steps{[t](const data::Batch& b) { forward_backward_of(*t, b); }, [t]() { step_of(*t); }};
  });
}

/// The ledger of one step (forward_backward + step): every communicator, op, reduction and root.
inline comm::Traffic one_step_ledger(lab09::Trainer& t, int64_t step = 0) {
  return labtest::traffic_of([&] {
    forward_backward_of(t, kLab.batch(step));
    step_of(t);
  });
}
/// The same ledger per (group, operation kind): the counters of comm::comm_stats().
inline comm::CommStats by_kind(const comm::Traffic& t) {
  comm::CommStats s;
  for (const auto& [key, count] : t) {
    comm::CommCount& c = s[comm::CommKey{key.group, key.op}];
    c.calls += count.calls;
    c.bytes += count.bytes;
  }
  return s;
}
/// The payload bytes one step (forward_backward + step) submits, by operation kind.
inline comm::CommStats one_step_traffic(lab09::Trainer& t, int64_t step = 0) {
  return by_kind(one_step_ledger(t, step));
}
inline int64_t bytes_of(const comm::CommStats& s, const std::string& op) {
  return comm::comm_total(s, "", op).bytes;
}

// ---- Issue 25, class 1: one step's traffic as an exact budget ------------------------------------
// labtest::exact_traffic (tests/support/traffic_budget.hpp): per group and members, operation,
// reduction op and root, on every communicator.
using labtest::exact_traffic;

/// Stage `stage`'s budget on the world for `model` (fp32, the world's size n), reduction ops as
/// the reference's: ZeRO-0 one sum all-reduce of the gradients (4 Psi; the 1/n is a scale after
/// it) and one of the loss (8 bytes, f64); ZeRO-1 that and one all-gather of the padded
/// parameters; ZeRO-2 every gradient element sum-reduced once to its owner (to each rank q the
/// real elements of q's shard, 4 bytes each, in one reduce per unit that overlaps it: the calls
/// are not pinned), the loss, the all-gather; ZeRO-3, with per-unit shards (each unit padded to
/// n): the given policy's gathers, every unit for its forward, every unit but the embedding for
/// its backward (the embedding's backward reads the tokens), and the embedding once more for
/// each use by the tied head (its forward and its backward); every unit's gradients
/// sum-reduce-scattered once; the loss. Calls of the all-gathers and reduce-scatters: any.
inline labtest::TrafficBudget zero_budget(int stage, nn::GPT& model) {
  nn::ParameterSet& ps = model.params();
  const comm::Communicator& w = labtest::world();
  const int n = w.size();
  const int64_t numel = ps.numel();
  using labtest::kAnyCalls;
  labtest::TrafficBudget b;
  b.all_reduce(w, 1, 8);  // the loss, every stage
  if (stage <= 1) {
    b.all_reduce(w, kAnyCalls, numel * 4);  // one buffer or one per unit: the same bytes
    if (stage == 1) b.all_gather(w, 1, ps.padded_numel() * 4);
    return b;
  }
  if (stage == 2) {
    for (int q = 0; q < n; ++q) {
      const int64_t real = nn::shard_range(numel, q, n).real();
      if (real > 0) b.reduce(w, q, kAnyCalls, real * 4);
    }
    return b.all_gather(w, 1, ps.padded_numel() * 4);
  }
  int64_t sum = 0, embedding = 0;
  for (std::size_t u = 0; u < ps.units().size(); ++u) {
    const int64_t padded = nn::shard_range(ps.units()[u].numel(), 0, n).size * n;
    sum += padded;
    if (model.has_embedding() && u == model.embedding_unit()) embedding = padded;
  }
  const bool tied_head = model.has_head() && model.has_embedding() && !model.lm_head;
  const int64_t gathered = 2 * sum - embedding + (tied_head ? 2 * embedding : 0);
  return b.all_gather(w, kAnyCalls, gathered * 4).reduce_scatter(w, kAnyCalls, sum * 4);
}

// ---- Issue 25, class 8: one object, graded on numbers, memory and traffic together --------------
/// What one trainer, built here by grader_trainer (the grader's construction), shows over two steps
/// on the global batches 0 and 1: the first step's traffic (forward_backward + step, without the
/// grader's own checks in between), its Footprint as footprint() measures it (held after the
/// first step, the peak of the second forward_backward), its losses, and the parameters after
/// the two steps. `after_backward` runs between the first forward_backward and its step (e.g. a
/// gradient check; collective, its traffic not counted). A submission that behaves one way when
/// its numbers are checked and another when its memory or traffic is (another instance, a call
/// count) is graded on the one object.
struct Observed {
  Footprint footprint;
  comm::Traffic first_step;
  std::vector<double> losses;
  Tensor parameters;
};
inline Observed observe_one(int stage, const std::function<void(lab09::Trainer&)>& after_backward,
                            const nn::GPTOptions& options = f32(),
                            const ModelConfig& config = kLab.config()) {
  Observed o;
  labtest::world().barrier();
  const std::size_t base = now_bytes();
  {
    std::shared_ptr<lab09::Trainer> t = grader_trainer(stage, config, options);
    const comm::Traffic backward =
        labtest::traffic_of([&] { o.losses.push_back(forward_backward_of(*t, kLab.batch(0))); });
    after_backward(*t);
    o.first_step = labtest::traffic_of([&] { step_of(*t); });
    for (const auto& [key, count] : backward) {
      o.first_step[key].calls += count.calls;
      o.first_step[key].bytes += count.bytes;
    }
    labtest::world().barrier();  // as footprint(): the communicator lets go of the last tensors
    o.footprint.held = now_bytes() - base;
    reset_peak_memory(Device::cpu());
    o.losses.push_back(forward_backward_of(*t, kLab.batch(1)));
    o.footprint.peak = memory_stats(Device::cpu()).peak - base;
    step_of(*t);
    o.parameters = t->full_parameters().clone();
  }
  return o;
}

// ---- Mixed precision (--precision bf16) ---------------------------------------------------------
// Each step's bf16 tests come after its fp32 tests in the step's file (test_zero1/2/3.cpp), so a
// fault in the stage itself is reported by an fp32 test first, the most telling one. A ZeRO-1
// and a ZeRO-2 step take the bf16 DDP step (the given stage 0, same seed, same global batches):
// losses and the fp32 parameters within the tolerances below, and after every step each rank's
// compute copy is EXACTLY cast(values) (the all-gather moves fp32 values; a rank that forgets to
// recast its copy computes the next step with stale weights). ZeRO-3 in bf16 (the paper's way)
// takes the same step within its tolerance, gathers bf16 weights and holds the fp32 shards only.

// Tolerances against the bf16 DDP over kBf16Steps steps. ZeRO-1 all-reduces the same fp32 gradients
// and updates each element as DDP does, and AdamW's fused cast and refresh_compute round alike:
// it is bitwise DDP (tolerance 0, as in fp32). ZeRO-2 reduces to the owners in another order:
// the fp32 gradients differ in their last bits, so the masters do, and a master near a bf16
// rounding boundary can give a copy one bf16 ulp (2^-8 relative) away, which moves the next
// losses. Measured (kLab, 3 steps at lr 1e-2): 1 and 2 ranks bitwise; 4 ranks losses bitwise and
// parameters within 7.7e-7 (|p| up to ~1). 1e-5 relative + 1e-5 absolute leaves a margin of
// ~13 and still fails a stale copy by far (it moves the second loss by 8%, the parameters by
// 3.5e-2).
inline constexpr int kBf16Steps = 3;
inline constexpr double kZero1Rtol = 0, kZero1Atol = 0;
inline constexpr double kZero2Rtol = 1e-5, kZero2Atol = 1e-5;
// ZeRO-3 computes each rank's gradient from the same bf16 weights as DDP (the gathered
// cast(shard) is cast(master), element by element), bitwise; the fp32 gradients are then
// reduce-scattered per unit, which the communicator may sum in another order than DDP's
// all-reduce (it does not promise the same order), and then, as ZeRO-2, a master may differ in
// its last bits and its copy by one bf16 ulp. Measured (kLab, 3 steps at lr 1e-2, MPI backend):
// losses and parameters bitwise DDP's on 1, 2 and 4 ranks. ZeRO-2's bound keeps room for the
// other order; a real fault (fp32 weights computed with, a stale unit) moves far more.
inline constexpr double kZero3Rtol = 1e-5, kZero3Atol = 1e-5;

// kBf16Steps steps of `t` against the bf16 DDP: the losses and the fp32 parameters (full_parameters)
// within rtol/atol. `after` runs on `t` after the steps (collective checks). Collective.
inline testing::AssertionResult steps_like_the_bf16_ddp(
    lab09::Trainer& t, double rtol, double atol,
    const std::function<testing::AssertionResult()>& after = testing::AssertionSuccess) {
  lab09::Ddp ddp(kLab.config(), mixed_bf16(), labtest::world());
  const std::vector<double> want = run_steps(ddp, kBf16Steps), got = run_steps(t, kBf16Steps);
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
inline testing::AssertionResult takes_the_bf16_ddp_step(lab09::Trainer& t, double rtol, double atol) {
  return steps_like_the_bf16_ddp(t, rtol, atol,
                                 [&t] { return compute_is_cast(t.model().params()); });
}

/// The shards of a hand-written ZeRO-3 (the planted faults): per unit, this rank's fp32 value
/// shard (kept from on_init), its gradient shard, AdamW over them; the fp32 all-gather of a unit
/// and the reduce-scatter of its gradients. Built in place: on_init keeps `this`.
struct HandZero3 {
  std::vector<nn::ShardRange> shards;
  std::vector<Tensor> values, grads;
  std::unique_ptr<optim::AdamW> adamw;
  HandZero3() = default;
  HandZero3(const HandZero3&) = delete;
  HandZero3& operator=(const HandZero3&) = delete;

  /// `o` with per-unit values and gradients, keeping this rank's shard of each unit at init.
  nn::GPTOptions options(nn::GPTOptions o) {
    o.storage.values = o.storage.grads = nn::Storage::per_unit;
    o.on_init = [this](const nn::Unit& u, const Tensor& v) {
      const nn::ShardRange s = nn::shard_range(u.numel(), labtest::world().rank(),
                                               labtest::world().size());
      Tensor mine = Tensor::zeros({s.size});
      if (s.real() > 0) mine.flat(0, s.real()).copy_from(v.flat(s.lo, s.real()));
      shards.push_back(s);
      values.push_back(mine);
      grads.push_back(Tensor::zeros({s.size}));
    };
    return o;
  }
  /// AdamW over every unit's shards (once the model is built with options()).
  void make_optimizer(nn::ParameterSet& ps) {
    std::vector<optim::Group> groups;
    for (std::size_t u = 0; u < ps.units().size(); ++u)
      for (auto& g : optim::groups_in_range(ps, ps.units()[u].lo + shards[u].lo,
                                            ps.units()[u].lo + shards[u].hi, values[u], grads[u]))
        groups.push_back(g);
    adamw = std::make_unique<optim::AdamW>(groups);
  }
  /// Unit u's fp32 values: the all-gather of the shards, its real elements.
  Tensor gather_fp32(const nn::ParameterSet& ps, std::size_t u) {
    Tensor all = Tensor::empty({shards[u].size * labtest::world().size()});
    labtest::world().all_gather(values[u], all);
    return all.flat(0, ps.units()[u].numel());
  }
  /// Unit u's gradients reduce-scattered (averaged) into its shard, then released.
  void reduce_scatter(nn::ParameterSet& ps, std::size_t u) {
    const int n = labtest::world().size();
    Tensor padded = Tensor::zeros({shards[u].size * n});
    padded.flat(0, ps.units()[u].numel()).copy_from(ps.unit_grads(u));
    labtest::world().reduce_scatter(padded, grads[u]);
    ops::scale(grads[u], 1.0 / n);
    ps.release_grads(u);
  }
};

/// Elements of the model's flat layout (no padding) and its fp32 bytes.
inline int64_t psi(const ModelConfig& c = kLab.config()) {
  nn::GPT m(c, f32());
  return m.num_parameters();
}

}  // namespace scalelab::lab09test
