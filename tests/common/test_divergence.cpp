// The divergence report (common/train/divergence.hpp) on 2 ranks: clean layouts (tensor
// parallel, data parallel with micro-batches, a 2-stage pipeline, ZeRO-2 shards) report none,
// and each planted fault is named where it first shows, the same verdict on every rank:
//  - g forgets its all-reduce: blocks.0.res2 (the attention output added), forward, ranks 0, 1;
//  - wrong head shards (k and v of the other rank's heads): blocks.0.attn.att, forward;
//  - a micro-batch loss not scaled by 1/micro-batches: the first gradient (ln_f.bias), backward;
//  - a ZeRO-2 shard reduced to the wrong owner: ln_f.bias's gradient on rank 1, its owner.
// Tolerance: DivergenceTolerance::for_precision(f32) (rtol 1e-4, atol 1e-5 x max|twin|).
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "common/comm/communicator.hpp"
#include "common/nn/gpt.hpp"
#include "common/train/divergence.hpp"
#include "common/train/reference.hpp"
#include "tests/support/reduce_mappings.hpp"

using namespace scalelab;

namespace {

comm::Communicator& world() {
  static comm::Communicator c = comm::Communicator::world("mpi");
  return c;
}

constexpr uint64_t kSeed = 4242;
constexpr int64_t kBatch = 4;  // global rows

const ModelConfig& config() {
  static const ModelConfig c = train::test_config(2);
  return c;
}

data::Batch global_batch() {
  static const std::vector<uint16_t> corpus = train::synthetic_corpus(4096, 11);
  return data::Sampler(corpus, kBatch, config().block_size, kSeed).batch(0);
}

const train::DivergenceRecorder& twin() {
  static const train::DivergenceRecorder t =
      train::record_twin(config(), {.seed = kSeed}, global_batch());
  return t;
}

// Every rank must reach the same verdict: its first line is compared with rank 0's.
bool same_everywhere(const std::string& line) {
  Tensor h = Tensor::from_vector({static_cast<double>(std::hash<std::string>{}(line) % 1000003)},
                                 {1}, DType::f64);
  Tensor lo = h.clone(), hi = h.clone();
  world().all_reduce(lo, comm::ReduceOp::min);
  world().all_reduce(hi, comm::ReduceOp::max);
  return lo.item() == hi.item();
}

train::Divergence verdict(const train::DivergenceRecorder& rec) {
  train::Divergence d = train::find_divergence(rec, twin(), DType::f32, world());
  EXPECT_TRUE(same_everywhere(d.first_line())) << d.first_line();
  if (world().rank() == 0) std::printf("%s\n", d.first_line().c_str());
  return d;
}

// Tensor parallel over the world's 2 ranks with hand-made mappings (no vocabulary split): g
// sums the partial outputs unless `forget_g`; `cut` may change which heads a rank keeps.
train::Divergence tensor_parallel(bool forget_g, std::function<void(nn::Block&)> cut = {}) {
  const int r = world().rank(), tp = world().size();
  nn::GPT model(config(), {.seed = kSeed, .tp_rank = r, .tp_size = tp, .cut_block = cut});
  auto all_reduce = [](Tensor& t) { world().all_reduce(t); };
  model.set_mappings(std::make_shared<labtest::ReduceMappings>(
      forget_g ? std::function<void(Tensor&)>{} : all_reduce, all_reduce));
  auto rec = std::make_shared<train::DivergenceRecorder>();
  train::watch(model, rec);
  const data::Batch b = global_batch();
  nn::GPTActivations acts;
  model.forward(b.x, b.y, acts);
  model.backward(acts);
  rec->record_gradients(model);
  return verdict(*rec);
}

// Data parallel: rank r takes rows [r b, (r + 1) b) in `micro` micro-batches, each backward
// scaled by `scale`, the gradients summed over the ranks.
train::Divergence data_parallel(int micro, double scale) {
  const int r = world().rank(), n = world().size();
  const int64_t b = kBatch / n, mb = b / micro;
  nn::GPT model(config(), {.seed = kSeed});
  auto rec = std::make_shared<train::DivergenceRecorder>(train::RowLayout{.first_row = r * b});
  train::watch(model, rec);
  const data::Batch mine = global_batch().rows(r * b, (r + 1) * b);
  for (int m = 0; m < micro; ++m) {
    const data::Batch part = mine.rows(m * mb, (m + 1) * mb);
    nn::GPTActivations acts;
    model.forward(part.x, part.y, acts);
    model.backward(acts, scale);
  }
  world().all_reduce(model.params().grads());
  rec->record_gradients(model);
  return verdict(*rec);
}

}  // namespace

TEST(Divergence, NoneWhenTensorParallelIsRight) {
  const train::Divergence d = tensor_parallel(false);
  EXPECT_FALSE(d.found) << d.str();
  EXPECT_GT(d.compared, 40);
}

TEST(Divergence, NoneWhenDataParallelMicroBatchesAreRight) {
  const int n = world().size(), micro = 2;
  const train::Divergence d = data_parallel(micro, 1.0 / (n * micro));
  EXPECT_FALSE(d.found) << d.str();
}

TEST(Divergence, ForgottenAllReduceInGIsBlock0sAttentionOutput) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 tensor-parallel ranks";
  const train::Divergence d = tensor_parallel(true);
  ASSERT_TRUE(d.found);
  EXPECT_EQ(d.tensor, "blocks.0.res2 (x + attention output)");
  EXPECT_FALSE(d.backward);
  EXPECT_EQ(d.layer, 0);
  EXPECT_EQ(d.micro_batch, 0);
  EXPECT_EQ(d.ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(d.index.size(), 3u);
  EXPECT_NE(d.got, d.want);
  EXPECT_GE(d.matched, 9);  // the input, ln1 and its statistics, q, k, v, att, y on both ranks
}

TEST(Divergence, WrongHeadShardsAreBlock0sAttentionProbabilities) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 tensor-parallel ranks";
  // q of this rank's heads, but k and v of the next rank's: each is right for the heads it
  // holds, their product is not
  const int r = world().rank(), tp = world().size();
  const int64_t C = config().n_embd, per = C / tp, o = ((r + 1) % tp) * per;
  auto cut = [&](nn::Block& b) {
    for (nn::Parameter* p : {&b.attn.qkv.weight, &b.attn.qkv.bias}) {
      p->shard.ranges.at(1) = {C + o, C + o + per};
      p->shard.ranges.at(2) = {2 * C + o, 2 * C + o + per};
    }
  };
  const train::Divergence d = tensor_parallel(false, cut);
  ASSERT_TRUE(d.found);
  EXPECT_EQ(d.tensor, "blocks.0.attn.att");
  EXPECT_FALSE(d.backward);
  EXPECT_EQ(d.rank, 0);
}

TEST(Divergence, UnscaledMicroBatchLossIsTheFirstGradient) {
  const int n = world().size(), micro = 2;
  const train::Divergence d = data_parallel(micro, 1.0 / n);  // forgot 1 / micro
  ASSERT_TRUE(d.found);
  EXPECT_EQ(d.tensor, "ln_f.bias");
  EXPECT_TRUE(d.backward);
  EXPECT_EQ(d.micro_batch, -1);
  EXPECT_NEAR(d.got, 2 * d.want, 1e-6 * std::abs(d.want));
  // every activation of both micro-batches on both ranks matched before it: per block its
  // input, ln1 (3), q, k, v, att, y, res2, ln2 (3), h, g; the head's x, ln_f (3), probabilities
  EXPECT_EQ(d.matched, n * micro * (config().n_layer * 15 + 5));
}

namespace {

// ZeRO-2 over the world: each rank's gradient (its rows, scaled by 1/n) is summed into the
// owner of each shard of the padded flat layout; the planted fault sends shard k to rank k + 1.
train::Divergence zero2(bool wrong_owner) {
  const int r = world().rank(), n = world().size();
  const int64_t b = kBatch / n;
  nn::GPT model(config(), {.seed = kSeed, .storage = {.pad_to = n}});
  auto rec = std::make_shared<train::DivergenceRecorder>(train::RowLayout{.first_row = r * b});
  train::watch(model, rec);
  const data::Batch mine = global_batch().rows(r * b, (r + 1) * b);
  nn::GPTActivations acts;
  model.forward(mine.x, mine.y, acts);
  model.backward(acts, 1.0 / n);
  const int64_t numel = model.params().numel();
  const nn::ShardRange s = nn::shard_range(numel, r, n);
  Tensor padded = model.params().padded_grads();
  Tensor shard = Tensor::zeros({s.size}, padded.dtype());
  for (int k = 0; k < n; ++k) {
    Tensor part = padded.flat(k * s.size, s.size).clone();
    const int owner = wrong_owner ? (k + 1) % n : k;
    world().reduce(part, owner);
    if (r == owner) shard = part;
  }
  rec->record_gradient_shard(model, shard, s.lo, s.hi);
  return verdict(*rec);
}

}  // namespace

TEST(Divergence, NoneWhenZero2ShardsAreRight) {
  const train::Divergence d = zero2(false);
  EXPECT_FALSE(d.found) << d.str();
}

TEST(Divergence, Zero2ShardReducedToTheWrongOwner) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ZeRO ranks";
  const train::Divergence d = zero2(true);
  ASSERT_TRUE(d.found);
  // the head's gradients end the flat layout: the last rank owns them, and holds rank 0's
  EXPECT_EQ(d.tensor, "ln_f.bias");
  EXPECT_TRUE(d.backward);
  EXPECT_EQ(d.rank, world().size() - 1);
  EXPECT_EQ(d.ranks, (std::vector<int>{world().size() - 1}));
}

TEST(Divergence, NoneOnA2StagePipeline) {
  if (world().size() != 2) GTEST_SKIP() << "a 2-stage pipeline";
  // stage 0 holds the embedding and block 0, stage 1 block 1 and the head (with its own copy of
  // the tied wte): the ranks record different tensors, and still agree on the verdict
  const int r = world().rank(), L = static_cast<int>(config().n_layer);
  nn::GPT model(config(), {.seed = kSeed, .first_block = r == 0 ? 0 : L / 2,
                           .last_block = r == 0 ? L / 2 : L});
  auto rec = std::make_shared<train::DivergenceRecorder>();
  train::watch(model, rec);
  const data::Batch b = global_batch();
  const int64_t T = b.x.size(1), C = config().n_embd;
  nn::GPTActivations acts;
  if (r == 0) {
    Tensor h = model.forward_blocks(model.embed(b.x, acts), acts);
    world().send(h, 1);
    Tensor d = Tensor::empty({kBatch, T, C}, h.dtype());
    world().recv(d, 1);
    model.embed_backward(model.backward_blocks(d, acts), acts);
    world().all_reduce(model.embedding->wte.grad);  // the tied weight's two halves
  } else {
    Tensor h = Tensor::empty({kBatch, T, C}, model.params().values().dtype());
    world().recv(h, 0);
    model.head_forward(model.forward_blocks(h, acts), b.y, acts);
    Tensor d = model.backward_blocks(model.head_backward(acts, 1.0), acts);
    world().send(d, 0);
    world().all_reduce(model.lm_head->grad);
  }
  rec->record_gradients(model);
  const train::Divergence d = verdict(*rec);
  EXPECT_FALSE(d.found) << d.str();
}
