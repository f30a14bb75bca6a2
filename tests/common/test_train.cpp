// End to end on the host: `tiny` learns a small synthetic corpus, and runs are repeatable; and
// what the training programs share: the twin check and sizing a run before it allocates.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/data/sampler.hpp"
#include "common/data/tokenizer.hpp"
#include "common/nn/gpt.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/global_loss.hpp"
#include "common/train/sizing.hpp"

using namespace scalelab;

namespace {
// A hermetic corpus with structure to learn: a few sentences in a seeded random order.
std::vector<uint16_t> corpus() {
  const char* sentences[] = {"the cat sat on the mat. ", "a dog ran in the park. ",
                             "we like to eat bread. ", "birds fly over the sea. "};
  std::string text;
  uint64_t x = 12345;
  for (int i = 0; i < 800; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    text += sentences[(x >> 33) % 4];
  }
  return data::encode(text);
}

// Trains tiny for `steps` on `device` and returns the training losses and the final validation
// loss.
std::pair<std::vector<double>, double> train_tiny(int steps, uint64_t seed,
                                                  Device device = Device::cpu()) {
  static const std::vector<uint16_t> tokens = corpus();
  const std::size_t n_train = tokens.size() * 9 / 10;
  static const std::vector<uint16_t> train_tokens(tokens.begin(), tokens.begin() + n_train),
      val_tokens(tokens.begin() + n_train, tokens.end());
  nn::GPT model(model_config("tiny"), {.device = device, .seed = seed});
  optim::AdamW opt(optim::groups(model.parameters()), {0.9, 0.95, 1e-8, 0.0});
  data::Sampler sampler(train_tokens, 8, 16, seed);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    data::Batch b = sampler.batch(step);
    model.zero_grad();
    losses.push_back(model.forward(b.x.to(device), b.y.to(device)));
    model.backward();
    optim::clip_grad_norm(optim::groups(model.parameters()), 1.0);
    opt.step(3e-3);
  }
  data::Sampler val(val_tokens, 16, 16, 777);
  double v = 0;
  for (int i = 0; i < 4; ++i) {
    data::Batch b = val.batch(i);
    v += model.loss(b.x.to(device), b.y.to(device)) / 4;
  }
  return {losses, v};
}
}  // namespace

TEST(Train, TinyLearnsASmallCorpus) {
  // ln(256) = 5.55 at init; the corpus is four fixed sentences in random order, so almost every
  // byte is predictable. Bound: val < 0.8 after 300 steps (measured 0.31 on this build; a model
  // that only learned byte frequencies would sit near 2.8).
  auto [losses, val] = train_tiny(300, 1);
  std::printf("tiny after 300 steps: train loss %.3f, val loss %.3f\n", losses.back(), val);
  EXPECT_GT(losses.front(), 5.0);
  EXPECT_LT(val, 0.8);
}

TEST(Train, SameSeedSameLosses) {
  // bitwise: the host kernels are deterministic with a fixed number of BLAS threads
  auto a = train_tiny(15, 3), b = train_tiny(15, 3);
  EXPECT_EQ(a.first, b.first);
  auto c = train_tiny(15, 4);
  EXPECT_NE(a.first, c.first);
}

// The simulated GPU runs the host's kernels on memory host code cannot read: a training step
// there (forward, backward, clipping, AdamW) reads no element outside an op, and gives the host's
// losses bit for bit.
TEST(Train, TheSimulatedGpuTrainsAsTheHostBitForBit) {
  auto host = train_tiny(5, 3), sim = train_tiny(5, 3, Device::sim());
  EXPECT_EQ(host.first, sim.first);
  EXPECT_EQ(host.second, sim.second);
}

// ---- what the training programs share: the twin check, sizing a run (issue 22) -------------------

// A diverged run (the loss nan or inf) fails the twin check and says so, even when the twin
// diverged the same way; the largest difference is that of the finite steps.
TEST(TwinCheck, ANonFiniteLossFailsAndSaysTrainingDiverged) {
  train::TwinCheck ok(DType::f32);
  EXPECT_TRUE(ok.add(2.0, 2.0 + 1e-6));
  EXPECT_TRUE(ok.ok);
  EXPECT_EQ(ok.verdict(), "within 1e-05 relative");
  train::TwinCheck nan(DType::f32);
  EXPECT_TRUE(nan.add(2.0, 2.0));
  EXPECT_FALSE(nan.add(std::nan(""), std::nan("")));
  EXPECT_FALSE(nan.ok);
  EXPECT_NE(nan.verdict().find("NOT FINITE"), std::string::npos) << nan.verdict();
  train::TwinCheck inf(DType::bf16);
  EXPECT_FALSE(inf.add(INFINITY, 3.0));
  EXPECT_TRUE(inf.diverged);
}

// A mismatch names its worst element by the tensor's index as well as its flat one (a reader
// should not have to divide by the shape), and says max |want| is the scale, not a value.
TEST(Diff, NamesTheWorstElementByItsIndex) {
  const Tensor want = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3}, DType::f32);
  const Tensor got = Tensor::from_vector({0, 1, 2, 3, 4.5, 5}, {2, 3}, DType::f32);
  EXPECT_EQ(train::compare(got, want).str(),
            "max |diff| 0.5 at element 4 = [1, 1] of (2, 3) (got 4.5, want 4), 0.1 of max |want|");
  const Tensor flat_want = want.view({6}), flat_got = got.view({6});
  EXPECT_EQ(train::compare(flat_got, flat_want).str(),
            "max |diff| 0.5 at element 4 (got 4.5, want 4), 0.1 of max |want|");
  EXPECT_EQ(train::compare(want, want).str(), "bitwise equal (6 elements)");
}

// The lower bound, by hand for tiny (T 16, C 32, 2 heads, V 256) at 2 rows of 2 blocks with the
// head, a global batch of 8: the batch's x and y 2 x 4 x 8 x 16 = 1024 bytes; per block 32
// tokens x (C + 8C + 2 heads x T) = 10240 elements, the head 32 x 256 = 8192; activations
// 4 x (2 x 10240 + 8192) bytes.
TEST(Sizing, StepBytesAtLeastByHand) {
  const ModelConfig tiny = model_config("tiny");
  const train::StepShape shape{.global_batch = 8, .rows = 2, .layers = 2};
  EXPECT_EQ(train::step_bytes_at_least(tiny, shape, DType::f32), 1024u + 4u * (2 * 10240 + 8192));
  EXPECT_EQ(train::step_bytes_at_least(tiny, shape, DType::bf16), 1024u + 2u * (2 * 10240 + 8192));
  train::StepShape flash = shape;  // flash attention keeps no (T, T) probabilities
  flash.attention_probabilities = false;
  EXPECT_EQ(train::step_bytes_at_least(tiny, flash, DType::f32), 1024u + 4u * (2 * 9216 + 8192));
  train::StepShape split = shape;  // tp 2 halves the MLP, the heads and the vocabulary;
  split.tp = 2;                    // checkpointing keeps only the blocks' inputs
  EXPECT_EQ(train::step_bytes_at_least(tiny, split, DType::f32),
            1024u + 4u * (2 * 32 * (32 + 4 * 32 + 16) + 4096));
  split.checkpoint = true;
  split.head = false;
  split.in_flight = 3;
  EXPECT_EQ(train::step_bytes_at_least(tiny, split, DType::f32), 1024u + 3u * 4u * (2 * 32 * 32));
  // a batch beyond any machine saturates instead of wrapping around to a small number
  const train::StepShape huge{.global_batch = INT64_MAX, .rows = INT64_MAX, .layers = 2};
  EXPECT_EQ(train::step_bytes_at_least(tiny, huge, DType::f32),
            std::numeric_limits<std::size_t>::max());
}

// Collective: every rank throws the same usage error naming the option when any rank is short;
// nobody throws when everyone fits.
TEST(Sizing, RequireHostMemoryRefusesOnEveryRank) {
  EXPECT_NO_THROW(train::require_host_memory(1, "--batch 1", "a training step"));
  const train::HostMemory mine = train::host_memory();
  EXPECT_GT(mine.node_available, 0u);
  EXPECT_GE(mine.ranks_on_node, 1);
  // only the last rank needs more than any machine has: still every rank refuses
  const std::size_t need = world_rank() == world_size() - 1
                               ? std::numeric_limits<std::size_t>::max() : 1;
  try {
    train::require_host_memory(need, "--batch 99", "a training step");
    ADD_FAILURE() << "no error on rank " << world_rank();
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("--batch 99: a training step needs at least", 0), 0u) << what;
    EXPECT_NE(what.find(fmt::format("on rank {}", world_size() - 1)), std::string::npos) << what;
    EXPECT_NE(what.find("; the node has "), std::string::npos) << what;
  }
}

// The ranks of a node share its memory: rank 0 needing 60% of what the node has and every other
// rank 10% fits on 2-4 ranks (a per-rank share, 1/n each, refused rank 0); every rank needing
// 60% does not, and the line gives the node's sum.
TEST(Sizing, RequireHostMemorySumsTheNodesRanks) {
  const train::HostMemory node = train::host_memory();
  const std::size_t have = node.node_available;
  const int n = world_size();
  if (node.ranks_on_node != n) GTEST_SKIP() << "the ranks are not all on one node";
  const std::size_t tenth = have / 10;
  if (n > 1 && n <= 4) {
    EXPECT_NO_THROW(train::require_host_memory(world_rank() == 0 ? 6 * tenth : tenth, "--batch 7",
                                               "a training step"));
    try {
      train::require_host_memory(6 * tenth, "--batch 8", "a training step");
      ADD_FAILURE() << "no error on rank " << world_rank();
    } catch (const UsageError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("of host memory on rank 0, "), std::string::npos) << what;
      EXPECT_NE(what.find(fmt::format("with the other {} rank", n - 1)), std::string::npos)
          << what;
    }
  }
}

// ---- the loss stays where the model computed it (common/scalar.hpp) ---------------------------

// A forward and a backward copy nothing to the host: the loss is a Scalar on the model's device
// (on the CPU a host tensor; host_reads() counts its reads, and ops::sum's, all the same, so
// this runs here). Read once, it is the mean of the rows' cross-entropies, to the bit.
TEST(Loss, AForwardAndBackwardReadNothingAndGiveTheMeanLoss) {
  nn::GPT model(model_config("tiny"), {.seed = 7});
  static const std::vector<uint16_t> tokens = corpus();  // a Sampler keeps a reference
  data::Sampler sampler(tokens, 4, 16, 3);
  const data::Batch b = sampler.batch(0);
  model.zero_grad();
  const int64_t reads = host_reads();
  const Scalar loss = model.forward(b.x, b.y);
  model.backward();
  EXPECT_EQ(host_reads(), reads) << "the forward or the backward read the loss";
  ASSERT_TRUE(loss.tensor().defined());
  EXPECT_EQ(loss.device(), model.device());
  // written out: the logits' cross-entropies, summed and divided
  const int64_t N = b.x.numel(), V = model.config().vocab_size;
  const Tensor logits = model.logits(b.x).view({N, V});
  Tensor losses = Tensor::empty({N}, DType::f32), probs = Tensor::empty({N, V}, DType::f32);
  ops::cross_entropy_forward(losses, probs, logits, b.y.view({N}));
  const double want = ops::sum(losses) / static_cast<double>(N);
  const int64_t before = host_reads();
  EXPECT_EQ(loss.value(), want);
  EXPECT_EQ(host_reads(), before + 1);
}

// A step of 4 micro-batches: their losses add as Scalars and average over the ranks with
// train::global_loss without a read; the step reads its loss once, and it has the bits of the
// same sums in doubles. A copy of a Scalar is not changed by arithmetic on the other.
TEST(Loss, MicroBatchLossesAddOnTheDeviceAndTheStepReadsOnce) {
  comm::Communicator world = comm::Communicator::world("mpi");
  nn::GPT model(model_config("tiny"), {.seed = 7});
  static const std::vector<uint16_t> tokens = corpus();  // a Sampler keeps a reference
  data::Sampler sampler(tokens, 8, 16, 11 + static_cast<uint64_t>(world.rank()));
  const data::Batch batch = sampler.batch(0);
  model.zero_grad();
  const int64_t reads = host_reads();
  std::vector<Scalar> each;
  Scalar sum;
  for (int i = 0; i < 4; ++i) {
    each.push_back(model.forward(batch.x.rows(2 * i, 2 * i + 2), batch.y.rows(2 * i, 2 * i + 2)));
    model.backward(0.25);
    sum += each.back();
  }
  const Scalar step_loss = train::global_loss(sum / 4, world);
  EXPECT_EQ(host_reads(), reads) << "adding, dividing or all-reducing read the loss";
  const double printed = step_loss.value();
  EXPECT_EQ(host_reads(), reads + 1);
  double d = 0;
  for (const Scalar& l : each) d += l.value();
  EXPECT_EQ(printed, train::global_loss(d / 4, world));
  const Scalar copy = each[0];
  Scalar changed = copy;
  changed += 1.0;
  EXPECT_EQ(changed.value(), copy.value() + 1.0);
  EXPECT_EQ(copy.value(), each[0].value());
}

// Every arithmetic a loss can meet stays a Scalar, on its device, without a read, and has the
// bits of the same double arithmetic: with a number on either side (+, -, *, /), negated, and
// between two Scalars (+, -, *, /), tensor-held or host numbers. Were one missing, `a * b` would
// still compile, through the implicit double on both sides: a silent read (a wait on a GPU).
TEST(Loss, ArithmeticStaysAScalarWithTheBitsOfDoubles) {
  const double x = 2.0 / 3.0, y = -7.0 / 9.0;
  for (bool held : {true, false}) {
    const auto make = [&](double v) {
      return held ? Scalar(Tensor::from_vector({v}, {1}, DType::f64)) : Scalar(v);
    };
    const Scalar a = make(x), b = make(y);
    const int64_t reads = host_reads();
    const std::vector<std::pair<Scalar, double>> cases = {
        {a + 0.1, x + 0.1}, {a - 0.1, x - 0.1}, {a * 3, x * 3},     {a / 3, x / 3},
        {0.1 + a, 0.1 + x}, {0.1 - a, 0.1 - x}, {3 * a, 3 * x},     {3 / a, 3 / x},
        {-a, -x},           {a + b, x + y},     {a - b, x - y},     {a * b, x * y},
        {a / b, x / y},     {(a - b) * (a + b) / 3, (x - y) * (x + y) / 3}};
    EXPECT_EQ(host_reads(), reads) << (held ? "tensor-held" : "host numbers");
    for (std::size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(cases[i].first.value(), cases[i].second) << "case " << i;
      EXPECT_EQ(cases[i].first.tensor().defined(), held) << "case " << i;
    }
  }
}
