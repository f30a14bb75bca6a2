// Lab 07 step 4: vocabulary parallel, float64, against the library's single-device ops.
//  - embedding: bitwise the single-device lookup (each row comes from one rank, the others add
//    exact zeros); gradients within kRel; one all-reduce of B*T*C forward (bf16 numbers with
//    bf16 activations), nothing backward; the forward allocates its output only, the backward
//    nothing (the gradient goes into the shard it is given, never a whole-vocabulary buffer);
//  - cross-entropy: loss, probabilities and dlogits within kRel (the softmax's sums run in
//    another order), also with one row of logits near 800 (near 100 in bf16: exp overflows
//    without the max shift); exactly three all-reduces of N numbers (a max, two sums) on the
//    tp group and nothing else on any communicator; besides its input, it allocates O(N) (the
//    allocator's peak) and the process heap grows by O(N) (a counting malloc: std::vector,
//    new[], statics), never the (N, V) logits;
//  - the GPT of make_tp_gpt (tied head on the vocabulary shard) follows the single-device GPT over 5 AdamW
//    steps within kAdamRel = 1e-9; its head holds (B*T, V/tp) probabilities, and its peak
//    memory during the head stays below the size of the full logits (tp >= 2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <mpi.h>

#include "common/allocator.hpp"
#include "common/nn/gpt.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "tensor_parallel.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/heap.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"
#include "tp_formulas.hpp"
#include "tp_test_support.hpp"

using namespace scalelab;
using namespace lab07test;

namespace {

constexpr int64_t kV = 256, kC = 8, kB = 3, kT = 5, kN = kB * kT;
// What the heap may grow by besides a step's tensors: the communicator's records of its
// operations and the matching check's buffers (measured: 1.8 to 2.6 KiB for the cross-entropy's
// three all-reduces, 1.8 to 2.4 KiB over the head's tensors, on 1, 2 and 4 ranks). Below this
// rank's (N, V/tp) logits even at tp 4 (7680 bytes) and far below the full (N, V) (30720).
constexpr std::size_t kHeapSlack = 6144;

using CrossEntropy =
    std::function<Scalar(Tensor& logits, const Tensor& targets, int64_t lo, comm::Communicator&)>;

struct CEResult {
  Scalar loss;
  int64_t reads = 0;           // numbers copied back to the host during the call (host_reads())
  Tensor probs;
  std::size_t extra_peak = 0;  // allocator bytes above the start, during the call
  labtest::HeapGrowth heap;    // the whole heap (std::vector, new[], statics, Tensors)
  Traffic moved;
};

// Runs `ce` on this rank's columns of fixed (N, V) logits.
CEResult run_ce(const CrossEntropy& ce, const Tensor& full, const Tensor& targets) {
  const int64_t n = kV / size(), lo = rank() * n;
  CEResult r;
  r.probs = columns(full, lo, lo + n);
  reset_peak_memory(Device::cpu());
  const std::size_t start = memory_stats(Device::cpu()).current;
  const int64_t reads = host_reads();
  r.heap = labtest::heap_growth_of(
      [&] { r.moved = traffic_of([&] { r.loss = ce(r.probs, targets, lo, group()); }); });
  r.extra_peak = memory_stats(Device::cpu()).peak - start;
  r.reads = host_reads() - reads;
  return r;
}

// The test's logits in [-1, 1), `offset` added to row 0 (a row whose exp overflows unless the
// softmax shifts by the row's max first).
Tensor ce_logits(double offset = 0) {
  std::vector<double> v = random_tensor({kN, kV}, 41).to_vector();
  for (int64_t i = 0; i < kV; ++i) v[i] += offset;
  return Tensor::from_vector(v, {kN, kV}, DType::f64);
}
Tensor ce_targets() { return random_tokens(kN, 1, kV, 42).view({kN}); }

::testing::AssertionResult check_ce(const CrossEntropy& ce, double offset = 0) {
  const Tensor full = ce_logits(offset), targets = ce_targets();
  Tensor losses = Tensor::empty({kN}, DType::f64), probs = Tensor::empty({kN, kV}, DType::f64);
  ops::cross_entropy_forward(losses, probs, full, targets);
  const double want = ops::sum(losses) / kN;
  const CEResult r = run_ce(ce, full, targets);
  if (auto ok = exactly(r.moved, labtest::TrafficBudget{}
                                     .all_reduce(group(), 1, kN * 8, comm::ReduceOp::max)
                                     .all_reduce(group(), 2, 2 * kN * 8));
      !ok)
    return ok << " (a max all-reduce of the rows' maxima, sum all-reduces of the target logits and of the sums of exponentials: N numbers each)";
  const std::size_t budget = 4 * kN * 8;
  if (r.extra_peak > budget)
    return ::testing::AssertionFailure()
           << "the cross-entropy allocated " << r.extra_peak << " bytes at its peak; O(N) = "
           << budget << " allowed, the full logits are " << kN * kV * 8;
  // However held (a std::vector, new[], a static): the heap may grow by the O(N) vectors and the
  // communicator's bookkeeping (kHeapSlack), never by a copy of the logits.
  if (r.heap.peak > static_cast<int64_t>(budget + kHeapSlack))
    return ::testing::AssertionFailure()
           << "the process heap grew by " << r.heap.peak << " bytes at its peak during the "
           << "cross-entropy (counting malloc: std::vector, new[] and statics too); O(N) = "
           << budget << " + " << kHeapSlack << " of bookkeeping allowed, this rank's logits are "
           << kN * kV / size() * 8 << " bytes";
  // On a GPU each read waits for every kernel before it: the loss stays where the logits are
  if (r.reads != 0)
    return ::testing::AssertionFailure()
           << "the cross-entropy read " << r.reads << " number(s) back to the host (ops::sum "
           << "does); keep the mean loss on the logits' device: ops::sum_into, returned as a Scalar";
  if (!std::isfinite(r.loss.value()))
    return ::testing::AssertionFailure()
           << "the mean loss is " << r.loss.value() << " where one row's logits are near "
           << offset << " (the single device's loss is " << want << ")";
  if (auto ok = near({r.loss.value()}, {want}); !ok) return ok << " (mean loss)";
  const int64_t n = kV / size(), lo = rank() * n;
  if (auto ok = near(r.probs, cut(probs, nn::Shard{1, {{lo, lo + n}}})); !ok)
    return ok << " (this rank's columns of the softmax)";
  return ::testing::AssertionSuccess();
}

// near(), and when every element is the same multiple of the wanted one (a factor forgotten or
// applied twice), that factor: the message says what is off, not how to compute it.
::testing::AssertionResult near_or_scaled(const Tensor& got, const std::vector<double>& want) {
  ::testing::AssertionResult ok = near(got, want);
  if (ok) return ok;
  const std::vector<double> g = got.to_vector();
  std::size_t at = 0;  // the largest wanted element
  for (std::size_t i = 0; i < want.size() && g.size() == want.size(); ++i)
    if (std::abs(want[i]) > std::abs(want[at])) at = i;
  if (g.size() != want.size() || want[at] == 0) return ok;
  const double ratio = g[at] / want[at];
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::abs(g[i] - ratio * want[i]) > 1e-9 * std::abs(ratio * want[at])) return ok;
  return ::testing::AssertionFailure()
         << "every element is " << fmt::format("{:.6g}", ratio) << " times the single-device "
         << "gradient's ("
         << ok.message() << ")";
}

nn::GPTOptions single_f64() {
  nn::GPTOptions o;
  o.dtype = DType::f64;
  o.seed = 23;
  return o;
}

}  // namespace

// First in the file, so first in step 4's run (tools.memory_first checks it): a buffer the code
// keeps in a function-local static is allocated inside this window, not by an earlier test. A
// suite of its own: GoogleTest runs a suite's tests together, at the place of its first test, so
// in Step4_GPT it would pull the GPT twin checks ahead of the unit tests (a cross-entropy fault
// would then be reported as a divergence of the model instead of by its own test).
TEST(Step4_Memory, TheFullLogitsNeverExistOnOneRank) {
  const ModelConfig c = test_config();
  auto owner = lab07::make_tp_gpt(c, group(), {.dtype = DType::f32, .seed = 5});
  nn::GPT& model = *owner;
  const int64_t B = 4, T = 16, BT = B * T;
  const Tensor x = random_tokens(B, T, c.vocab_size, 61), y = random_tokens(B, T, c.vocab_size, 62);
  nn::GPTActivations acts;
  const Tensor h = model.forward_blocks(model.embed(x, acts), acts);
  reset_peak_memory(Device::cpu());
  const std::size_t start = memory_stats(Device::cpu()).current;
  const labtest::HeapGrowth heap = labtest::heap_growth_of([&] { model.head_forward(h, y, acts); });
  const std::size_t peak = memory_stats(Device::cpu()).peak - start;
  EXPECT_EQ(acts.head.probs.shape(), (std::vector<int64_t>{BT, c.vocab_size / size()}));
  // the head's own tensors: lnf (B*T*C), its statistics (2 B*T), probs (B*T*V/tp); the
  // cross-entropy's three B*T vectors and its mean (one f64)
  const std::size_t want = (BT * c.n_embd + 2 * BT + BT * c.vocab_size / size() + 3 * BT) * 4 + 8;
  EXPECT_LE(peak, want) << "the head's peak: ln_f's output, (B*T, V/tp) and O(B*T) besides";
  // nor in a static array of the attendee's file (its .bss and .data, from the object's symbols)
  EXPECT_TRUE(labtest::static_storage_at_most(labtest::kStaticStorageBytes, "lab 07 step 4"));
  if (size() > 1) {
    EXPECT_LT(peak, static_cast<std::size_t>(BT * c.vocab_size * 4))
        << "below the full (B*T, V) logits";
    // the whole heap, however held: the head's tensors and bookkeeping, never the full logits
    EXPECT_LE(heap.peak, static_cast<int64_t>(want + kHeapSlack))
        << "the heap grew by " << heap.peak << " bytes during the head (std::vector, new[], "
        << "statics and Tensors): more than its tensors and " << kHeapSlack << " of bookkeeping";
  }
}

TEST(Step4_Vocab, RangesAreContiguousAndEven) {
  // the lab's vocabulary, then sizes drawn at grading time (tests/support/drawn.hpp: the seed,
  // the same on every rank, printed with every failure)
  labtest::Drawn draw;
  SCOPED_TRACE("vocabularies " + draw.trace());
  for (int64_t V : drawn_sizes(draw, size(), kV, 8)) {
    const lab07::VocabRange r = lab07::vocab_range(V, rank(), size());
    const std::string p = even_piece_problem(
        fmt::format("vocab_range({}, rank {}, tp {}) gave [{}, {})", V, rank(), size(), r.lo, r.hi),
        r.lo, r.hi, V, rank(), size());
    if (!p.empty()) ADD_FAILURE() << "rank " << rank() << ": " << p;
  }
  EXPECT_THROW(lab07::vocab_range(250, 0, 4), UsageError);
}

TEST(Step4_Usage, TpNotDividingTheVocabularyIsAUsageError) {
  EXPECT_THROW(lab07::check_tp(ModelConfig{"x", 250, 16, 2, 4, 32}, 4), UsageError);
  EXPECT_THROW(lab07::vocab_range(250, 0, 4), UsageError);
}

TEST(Step4_Embedding, EqualsTheSingleDeviceEmbedding) {
  const int64_t n = kV / size(), lo = rank() * n;
  const Tensor wte = random_tensor({kV, kC}, 51), wpe = random_tensor({kT, kC}, 52);
  const Tensor tokens = random_tokens(kB, kT, kV, 53);
  Tensor want = Tensor::empty({kB, kT, kC}, DType::f64);
  ops::embedding_forward(want, tokens, wte, wpe);
  const Tensor wte_local =
      Tensor::from_vector(cut(wte, nn::Shard{0, {{lo, lo + n}}}), {n, kC}, DType::f64);
  Tensor out;
  reset_peak_memory(Device::cpu());
  std::size_t start = memory_stats(Device::cpu()).current;
  const Traffic fwd = traffic_of(
      [&] { out = lab07::vocab_parallel_embedding_forward(wte_local, lo, wpe, tokens, group()); });
  const std::size_t fwd_peak = memory_stats(Device::cpu()).peak - start;
  EXPECT_TRUE(only_all_reduces(fwd, 1, kB * kT * kC * 8)) << "g: one all-reduce of (B, T, C)";
  // The lookup and g's sum land in the returned (B, T, C) itself: a scratch of the same size
  // and a copy would double what the embedding holds at B*T tokens.
  EXPECT_LE(fwd_peak, static_cast<std::size_t>(kB * kT * kC * 8))
      << "the embedding's forward allocated " << fwd_peak << " bytes at its peak; the output it "
      << "returns is " << kB * kT * kC * 8 << " and it needs nothing besides";
  EXPECT_TRUE(labtest::bitwise(out, want)) << "one rank adds the row, the others exact zeros";

  const Tensor dout = random_tensor({kB, kT, kC}, 54);
  Tensor dwte = Tensor::zeros({kV, kC}, DType::f64), dwpe = Tensor::zeros({kT, kC}, DType::f64);
  ops::embedding_backward(dwte, dwpe, dout, tokens);
  Tensor dwte_local = Tensor::zeros({n, kC}, DType::f64),
         dwpe_got = Tensor::zeros({kT, kC}, DType::f64);
  reset_peak_memory(Device::cpu());
  start = memory_stats(Device::cpu()).current;
  const Traffic bwd = traffic_of([&] {
    lab07::vocab_parallel_embedding_backward(dwte_local, lo, dwpe_got, dout, tokens);
  });
  const std::size_t bwd_peak = memory_stats(Device::cpu()).peak - start;
  EXPECT_TRUE(only_all_reduces(bwd, 0, 0));
  // Step 4 shards the vocabulary so that no rank holds a (V, C) matrix, its gradient included:
  // the rows' gradients accumulate into the given (V/tp, C) shard (the reference allocates
  // nothing here, measured on 1, 2 and 4 ranks).
  EXPECT_EQ(bwd_peak, 0u) << "the embedding's backward allocated " << bwd_peak << " bytes at "
                          << "its peak; this rank's gradient shard is " << n * kC * 8
                          << " bytes, the whole vocabulary's " << kV * kC * 8;
  EXPECT_TRUE(near(dwte_local, cut(dwte, nn::Shard{0, {{lo, lo + n}}}))) << "dwte rows";
  EXPECT_TRUE(near(dwpe_got, dwpe)) << "dwpe";
}

// With bf16 activations the embedding's all-reduce moves bf16: 2 bytes a number, the budget
// step 6's formulas count (the sum is exact whatever the width: one rank adds each row).
TEST(Step4_Embedding, Bf16ActivationsSendBf16) {
  const int64_t n = kV / size(), lo = rank() * n;
  const Tensor wte = random_tensor({kV, kC}, 51), wpe = random_tensor({kT, kC}, 52, DType::bf16);
  const Tensor tokens = random_tokens(kB, kT, kV, 53);
  const Tensor wte_local =
      Tensor::from_vector(cut(wte, nn::Shard{0, {{lo, lo + n}}}), {n, kC}, DType::bf16);
  Tensor out;
  const Traffic fwd = traffic_of(
      [&] { out = lab07::vocab_parallel_embedding_forward(wte_local, lo, wpe, tokens, group()); });
  EXPECT_EQ(out.dtype(), DType::bf16);
  EXPECT_TRUE(only_all_reduces(fwd, 1, kB * kT * kC * 2))
      << "g: one all-reduce of the (B, T, C) bf16 output";
}

TEST(Step4_CrossEntropy, EqualsTheFullCrossEntropyWithoutTheFullLogits) {
  EXPECT_TRUE(check_ce(lab07::vocab_parallel_cross_entropy));
}

// Logits of a trained model are not confined to [-1, 1]: one row near 800, where exp overflows
// a double (above 709), must give the single device's loss, not inf or NaN.
TEST(Step4_CrossEntropy, LargeLogitsGiveAFiniteLoss) {
  EXPECT_TRUE(check_ce(lab07::vocab_parallel_cross_entropy, 800)) << "row 0's logits + 800";
}

// The same with bf16 logits and fp32 per-row numbers: one row near 100, where exp overflows a
// float (above 88); the loss within kBf16Loss of the single device's on the same bf16 logits.
TEST(Step4_CrossEntropy, LargeBf16LogitsGiveAFiniteLoss) {
  const Tensor wide = ce_logits(100), targets = ce_targets();
  Tensor full = Tensor::empty({kN, kV}, DType::bf16);
  ops::cast(full, wide);
  Tensor losses = Tensor::empty({kN}, DType::f32), probs = Tensor::empty({kN, kV}, DType::bf16);
  ops::cross_entropy_forward(losses, probs, full, targets);
  const double want = ops::sum(losses) / kN;
  const int64_t n = kV / size(), lo = rank() * n;
  Tensor mine = columns(full, lo, lo + n);
  const double got = lab07::vocab_parallel_cross_entropy(mine, targets, lo, group()).value();
  EXPECT_TRUE(std::isfinite(got)) << "the mean loss is " << got << " where one row's bf16 logits "
                                  << "are near 100 (the single device's loss is " << want << ")";
  EXPECT_NEAR(got, want, kBf16Loss * std::abs(want)) << "mean loss, row 0's logits + 100";
}

TEST(Step4_CrossEntropy, BackwardIsProbsMinusOneHotOnOurColumns) {
  const Tensor full = ce_logits(), targets = ce_targets();
  Tensor losses = Tensor::empty({kN}, DType::f64), probs = Tensor::empty({kN, kV}, DType::f64),
         dlogits = Tensor::empty({kN, kV}, DType::f64);
  ops::cross_entropy_forward(losses, probs, full, targets);
  ops::cross_entropy_backward(dlogits, probs, targets, 0.5 / kN);
  const int64_t n = kV / size(), lo = rank() * n;
  Tensor mine = columns(probs, lo, lo + n);
  const Traffic moved =
      traffic_of([&] { lab07::vocab_parallel_cross_entropy_backward(mine, targets, lo, 0.5); });
  EXPECT_TRUE(only_all_reduces(moved, 0, 0));
  EXPECT_TRUE(near_or_scaled(mine, cut(dlogits, nn::Shard{1, {{lo, lo + n}}})))
      << "this rank's columns of the gradient of 0.5 x the mean loss over N = " << kN << " rows";
}

// The four vocabulary-parallel functions again with their tensors on the simulated GPU
// (tests/support/on_sim.hpp): the host's numbers bit for bit. A loop over the logits' rows or
// the tokens, or a tensor made without the device argument, stops there with the tensor's or
// the op's own line, as it would on a GPU.
TEST(Step4_VocabParallel, RunsOnTheSimulatedGpuAsOnTheHost) {
  const Device sim = Device::sim();
  const int64_t n = kV / size(), lo = rank() * n;
  const Tensor wte_local = random_tensor({n, kC}, 51 + rank()), wpe = random_tensor({kT, kC}, 52);
  const Tensor tokens = random_tokens(kB, kT, kV, 53), dout = random_tensor({kB, kT, kC}, 54);
  const Tensor targets = ce_targets();
  const Tensor out = lab07::vocab_parallel_embedding_forward(wte_local, lo, wpe, tokens, group());
  Tensor dwte = Tensor::zeros({n, kC}, DType::f64), dwpe = Tensor::zeros({kT, kC}, DType::f64);
  lab07::vocab_parallel_embedding_backward(dwte, lo, dwpe, dout, tokens);
  Tensor probs = columns(ce_logits(), lo, lo + n);
  const Tensor logits_s = probs.to(sim);
  const double loss = lab07::vocab_parallel_cross_entropy(probs, targets, lo, group()).value();
  Tensor dlogits = probs.clone();
  lab07::vocab_parallel_cross_entropy_backward(dlogits, targets, lo, 0.5);
  std::vector<std::string> problems;
  const auto same = [&](const char* what, const Tensor& want, const Tensor& got) {
    problems.push_back(labtest::same_on_sim(what, want, got));
  };
  labtest::collective_run_on_sim([&] {
    const Tensor tokens_s = tokens.to(sim), targets_s = targets.to(sim);
    same("the embedding's output",
         out, lab07::vocab_parallel_embedding_forward(wte_local.to(sim), lo, wpe.to(sim), tokens_s, group()));
    Tensor dwte_s = Tensor::zeros({n, kC}, DType::f64, sim), dwpe_s = Tensor::zeros({kT, kC}, DType::f64, sim);
    lab07::vocab_parallel_embedding_backward(dwte_s, lo, dwpe_s, dout.to(sim), tokens_s);
    same("the embedding's dwte rows", dwte, dwte_s);
    same("the embedding's dwpe", dwpe, dwpe_s);
    Tensor probs_s = logits_s;
    const Scalar loss_s = lab07::vocab_parallel_cross_entropy(probs_s, targets_s, lo, group());
    if (loss_s.device() != sim)
      problems.push_back(fmt::format("the cross-entropy's loss came back on {}, not on the "
                                     "simulated GPU its logits are on", loss_s.device().str()));
    else if (loss_s.value() != loss)
      problems.push_back(fmt::format("the cross-entropy's loss on the simulated GPU is {} (the "
                                     "host's {})", loss_s.value(), loss));
    same("the cross-entropy's probabilities", probs, probs_s);
    lab07::vocab_parallel_cross_entropy_backward(probs_s, targets_s, lo, 0.5);
    same("the cross-entropy backward's dlogits", dlogits, probs_s);
  });
  const std::string all = labtest::joined(problems);
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

TEST(Step4_GPT, TrainsLikeTheSingleDeviceGPTForFiveAdamWSteps) {
  const ModelConfig c = test_config();
  nn::GPT single(c, single_f64());
  auto part_model = lab07::make_tp_gpt(c, group(), {.dtype = DType::f64, .seed = 23});
  nn::GPT& part = *part_model;
  EXPECT_EQ(part.embedding->wte.shape(),
            (std::vector<int64_t>{c.vocab_size / size(), c.n_embd}))
      << "wte (and the tied head) sharded by vocabulary rows";
  optim::AdamW a1(optim::groups(single.parameters())), a2(optim::groups(part.parameters()));
  labtest::Explain why(part, single_f64());  // a failure names the first tensor off the twin
  for (int step = 0; step < 5; ++step) {
    const Tensor x = random_tokens(2, 8, c.vocab_size, 300 + step),
                 y = random_tokens(2, 8, c.vocab_size, 400 + step);
    single.zero_grad();
    const double want = single.forward(x, y);
    single.backward();
    a1.step(1e-2);
    part.zero_grad();
    nn::GPTActivations acts;
    const double got = part.forward(x, y, acts);
    part.backward(acts);
    if (step == 0) why.step_done({x, y});
    a2.step(1e-2);
    EXPECT_TRUE(labtest::on_every_rank(near(std::vector<double>{got}, {want}, 1e-10), why))
        << "loss of step " << step + 1;
    for (nn::Parameter* p : part.parameters())
      ASSERT_TRUE(labtest::on_every_rank(
          near(p->value, cut(single.params().get(p->name).value, p->shard), kAdamRel)
              << "; " << p->name << " after AdamW step " << step + 1, why));
  }
}

// bf16 compute copy, fp32 master and gradients: the vocabulary-parallel ends read bf16 weights
// and compute in float from bf16 storage (tolerances: tp_test_support.hpp).
TEST(Step4_GPT, MixedPrecisionFollowsTheBf16SingleDeviceGPT) {
  expect_mixed_precision_follows_single_device(/*sequence_parallel=*/false, 41);
}

// ---- planted faults (written here; they never call the attendee's code) ----------------------

namespace {

// The base of the faults below: a correct vocabulary-parallel cross-entropy.
double planted_base(Tensor& z, const Tensor& targets, int64_t lo, comm::Communicator& c,
                    bool reduce) {
  const int64_t N = z.size(0), Vl = z.size(1);
  double* p = z.data<double>();
  const int32_t* t = targets.data<int32_t>();
  Tensor m = Tensor::empty({N}, DType::f64), zt = Tensor::zeros({N}, DType::f64),
         s = Tensor::zeros({N}, DType::f64);
  for (int64_t i = 0; i < N; ++i) m.data<double>()[i] = *std::max_element(p + i * Vl, p + (i + 1) * Vl);
  if (reduce) c.all_reduce(m, comm::ReduceOp::max);
  for (int64_t i = 0; i < N; ++i)
    if (t[i] - lo >= 0 && t[i] - lo < Vl) zt.data<double>()[i] = p[i * Vl + t[i] - lo];
  if (reduce) c.all_reduce(zt);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t v = 0; v < Vl; ++v) {
      p[i * Vl + v] = std::exp(p[i * Vl + v] - m.data<double>()[i]);
      s.data<double>()[i] += p[i * Vl + v];
    }
  if (reduce) c.all_reduce(s);
  double loss = 0;
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t v = 0; v < Vl; ++v) p[i * Vl + v] /= s.data<double>()[i];
    loss += std::log(s.data<double>()[i]) + m.data<double>()[i] - zt.data<double>()[i];
  }
  return loss / N;
}

}  // namespace

TEST(Step4_PlantedFault, TheFaultsBaseItselfPasses) {
  for (double offset : {0.0, 800.0})
    EXPECT_TRUE(check_ce([](Tensor& z, const Tensor& t, int64_t lo, comm::Communicator& c) {
      return planted_base(z, t, lo, c, true);
    }, offset)) << "offset " << offset;
}

// Each rank's softmax over its own columns only (no all-reduce): a different loss on each rank
// at tp >= 2; with one rank the numbers are right and the byte check fails.
TEST(Step4_PlantedFault, CrossEntropyFromLocalLogitsOnlyIsCaught) {
  EXPECT_FALSE(check_ce([](Tensor& z, const Tensor& t, int64_t lo, comm::Communicator& c) {
    return planted_base(z, t, lo, c, false);
  })) << "the check of Step4_CrossEntropy must fail";
}

// Gathering the logits (what picotron does): right numbers, but every rank allocates the full
// (N, V) logits and all-gathers them.
TEST(Step4_PlantedFault, GatheredLogitsAreCaught) {
  EXPECT_FALSE(check_ce([](Tensor& z, const Tensor& t, int64_t lo, comm::Communicator& c) {
    const int64_t N = z.size(0), Vl = z.size(1), V = Vl * c.size();
    Tensor gathered = Tensor::empty({c.size(), N, Vl}, DType::f64);
    c.all_gather(z, gathered);
    Tensor full = Tensor::empty({N, V}, DType::f64), probs = Tensor::empty({N, V}, DType::f64),
           losses = Tensor::empty({N}, DType::f64);
    for (int r = 0; r < c.size(); ++r)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t v = 0; v < Vl; ++v)
          full.data<double>()[i * V + r * Vl + v] = gathered.data<double>()[(r * N + i) * Vl + v];
    ops::cross_entropy_forward(losses, probs, full, t);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t v = 0; v < Vl; ++v) z.data<double>()[i * Vl + v] = probs.data<double>()[i * V + lo + v];
    return ops::sum(losses) / N;
  })) << "the check of Step4_CrossEntropy must fail";
}

// The right technique's three all-reduces, but the softmax computed through a full-size
// (N, V) std::vector (a static: it outlives the call): right numbers, right traffic, and the
// allocator sees nothing. The counting malloc does.
TEST(Step4_PlantedFault, FullLogitsInAStdVectorAreCaught) {
  EXPECT_FALSE(check_ce([](Tensor& z, const Tensor& t, int64_t lo, comm::Communicator& c) {
    static std::vector<double> full;
    full.assign(static_cast<std::size_t>(z.size(0) * z.size(1) * c.size()), 0.0);
    const int64_t Vl = z.size(1), V = Vl * c.size();
    for (int64_t i = 0; i < z.size(0); ++i)
      for (int64_t v = 0; v < Vl; ++v) full[i * V + lo + v] = z.data<double>()[i * Vl + v];
    const double loss = planted_base(z, t, lo, c, true);
    full.clear();
    full.shrink_to_fit();
    return loss;
  })) << "the check of Step4_CrossEntropy must fail";
}

// The right technique, but the mean loss summed on the host (ops::sum): right numbers, traffic
// and memory; on a GPU the copy stops the queue once per forward. The read counter sees it.
TEST(Step4_PlantedFault, LossReadBackToTheHostIsCaught) {
  const ::testing::AssertionResult got =
      check_ce([](Tensor& z, const Tensor& t, int64_t lo, comm::Communicator& c) {
        const double loss = planted_base(z, t, lo, c, true);
        return Scalar(ops::sum(Tensor::from_vector({loss}, {1}, DType::f64)));
      });
  EXPECT_FALSE(got);
  EXPECT_NE(std::string(got.message()).find("read 1 number"), std::string::npos) << got.message();
}

// The full logits gathered with a raw MPI_Allgather into a static array: past the Communicator,
// the allocator and the heap, and the loss is right; MPI's profiling interface in the test
// binary counts the call (tests/support/raw_mpi.hpp) and the exact budget names it.
TEST(Step4_PlantedFault, FullLogitsGatheredWithRawMpiIntoAStaticArrayAreCaught) {
  const ::testing::AssertionResult got =
      check_ce([](Tensor& z, const Tensor& t, int64_t lo, comm::Communicator& c) {
        static double full[kN * kV];
        const int n = static_cast<int>(z.numel());
        MPI_Allgather(z.data<double>(), n, MPI_DOUBLE, full, n, MPI_DOUBLE, MPI_COMM_WORLD);
        return planted_base(z, t, lo, c, true);
      });
  EXPECT_FALSE(got);
  EXPECT_NE(std::string(got.message()).find("MPI_Allgather"), std::string::npos) << got.message();
}
