// The GPT as a whole: float64 gradient check of every parameter, the flat parameter layout,
// pipeline-stage splits, activations per forward call (several micro-batches in flight),
// activation recomputation and backward hooks.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/nn/gpt.hpp"
#include "common/ops/ops.hpp"
#include "tests/common/gradcheck.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
// Smaller than `tiny` so that finite differences over every parameter stay fast.
ModelConfig micro() { return ModelConfig{"micro", 11, 6, 2, 2, 8}; }

nn::GPTOptions f64_options(uint64_t seed = 5) {
  nn::GPTOptions o;
  o.dtype = DType::f64;
  o.seed = seed;
  return o;
}

// Per-element equality of two tensors' values.
void expect_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.item(i), b.item(i)) << what << " at " << i;
}
}  // namespace

TEST(GPT, GradCheckEveryParameter) {
  // tolerance: kGradTol (1e-6 relative), float64 central differences
  nn::GPT model(micro(), f64_options());
  // larger-than-default weights so every path carries signal
  fill_uniform(model.params().values(), 7, -0.3, 0.3);
  Tensor x = random_tokens({2, 5}, 11, 8), y = random_tokens({2, 5}, 11, 9);
  model.zero_grad();
  model.forward(x, y);
  model.backward();
  auto loss = [&] { return model.loss(x, y); };
  for (nn::Parameter* p : model.parameters())
    EXPECT_GRAD_OK(gradcheck(p->value, p->grad, loss, 40), p->name);
}

TEST(GPT, LossAtInitIsNearLogVocab) {
  nn::GPT model(model_config("tiny"));
  Tensor x = random_tokens({4, 16}, 256, 1), y = random_tokens({4, 16}, 256, 2);
  EXPECT_NEAR(model.forward(x, y), std::log(256.0), 0.1);  // small init: nearly uniform logits
}

TEST(GPT, ParametersAreViewsIntoOneFlatBufferInStableOrder) {
  nn::GPT model(model_config("tiny"));
  EXPECT_EQ(model.num_parameters(), parameter_count(model_config("tiny")));
  const auto& ps = model.parameters();
  ASSERT_GE(ps.size(), 4u);
  EXPECT_EQ(ps.front()->name, "wte.weight");
  EXPECT_EQ(ps[1]->name, "wpe.weight");
  EXPECT_EQ(ps[2]->name, "blocks.0.ln1.weight");
  EXPECT_EQ(ps.back()->name, "ln_f.bias");
  int64_t offset = 0;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(ps[i]->value.shares_storage_with(model.params().values())) << ps[i]->name;
    EXPECT_TRUE(ps[i]->grad.shares_storage_with(model.params().grads())) << ps[i]->name;
    EXPECT_EQ(ps[i]->value.offset(), offset) << ps[i]->name;
    EXPECT_EQ(model.params().offset(i), offset);
    offset += ps[i]->numel();
  }
  EXPECT_EQ(offset, model.params().values().numel());
  // the same seed gives the same values; another seed other values
  nn::GPT same(model_config("tiny")), other(model_config("tiny"), {.seed = 99});
  expect_equal(model.params().values(), same.params().values(), "same seed");
  EXPECT_NE(model.params().values().item(0), other.params().values().item(0));
}

TEST(GPT, ShardedLinearHoldsTheSliceOfTheFullWeight) {
  // tensor parallel init: rank 1 of 2 holds rows of heads 1 of q, k and v of the full model
  nn::GPT full(micro(), f64_options());
  nn::GPTOptions o = f64_options();
  o.tp_rank = 1;
  o.tp_size = 2;
  nn::GPT half(micro(), o);
  const Tensor& w = full.block(0).attn.qkv.weight.value;     // (24, 8)
  const Tensor& h = half.block(0).attn.qkv.weight.value;     // (12, 8)
  ASSERT_EQ(h.shape(), (std::vector<int64_t>{12, 8}));
  // local rows: q rows 4..8, k rows 12..16, v rows 20..24
  const int64_t rows[] = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23};
  for (int r = 0; r < 12; ++r)
    for (int c = 0; c < 8; ++c) ASSERT_EQ(h.item(r * 8 + c), w.item(rows[r] * 8 + c));
  const Tensor& pw = full.block(1).attn.proj.weight.value;  // (8, 8), columns 4..8 on rank 1
  const Tensor& ph = half.block(1).attn.proj.weight.value;  // (8, 4)
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 4; ++c) ASSERT_EQ(ph.item(r * 4 + c), pw.item(r * 8 + 4 + c));
}

TEST(GPT, TwoStagesMatchTheWholeModel) {
  // blocks [0, 1) then [1, 2): same loss and gradients, bitwise (same ops in the same order)
  nn::GPT whole(micro(), f64_options());
  nn::GPTOptions a = f64_options(), b = f64_options();
  a.last_block = 1;
  b.first_block = 1;
  nn::GPT first(micro(), a), second(micro(), b);
  EXPECT_TRUE(first.has_embedding() && !first.has_head());
  EXPECT_TRUE(!second.has_embedding() && second.has_head());
  EXPECT_EQ(first.num_parameters() + second.num_parameters(),
            whole.num_parameters() + 11 * 8);  // the head's copy of wte
  Tensor x = random_tokens({2, 6}, 11, 10), y = random_tokens({2, 6}, 11, 11);
  const double loss = whole.forward(x, y);
  whole.backward();
  nn::GPTActivations acts1, acts2;  // one per stage
  Tensor h = first.forward_blocks(first.embed(x, acts1), acts1);
  EXPECT_EQ(second.head_forward(second.forward_blocks(h, acts2), y, acts2), loss);
  Tensor dh = second.backward_blocks(second.head_backward(acts2), acts2);
  first.embed_backward(first.backward_blocks(dh, acts1), acts1);
  EXPECT_EQ(acts1.nbytes() + acts2.nbytes(), 0u) << "backward consumes the activations";
  for (nn::Parameter* p : whole.parameters()) {
    if (p->name == "wte.weight") {
      // tied: the whole model's wte gradient = embedding part + head part
      Tensor sum = first.params().get("wte.weight").grad.clone();
      ops::axpy(sum, 1.0, second.params().get("lm_head.weight").grad);
      for (int64_t i = 0; i < sum.numel(); ++i) ASSERT_NEAR(sum.item(i), p->grad.item(i), 1e-15);
      continue;
    }
    const nn::GPT& owner = p->name.rfind("blocks.0", 0) == 0 || p->name == "wpe.weight" ? first : second;
    expect_equal(const_cast<nn::GPT&>(owner).params().get(p->name).grad, p->grad, p->name);
  }
}

TEST(GPT, RecomputedActivationsGiveIdenticalGradients) {
  // activation checkpointing's premise: free a block's activations, recompute from its input
  nn::GPT model(model_config("tiny"));
  Tensor x = random_tokens({2, 16}, 256, 12), y = random_tokens({2, 16}, 256, 13);
  model.zero_grad();
  model.forward(x, y);
  model.backward();
  Tensor reference = model.params().grads().clone();
  model.zero_grad();
  nn::GPTActivations acts;
  model.forward(x, y, acts);
  const std::size_t before = memory_stats(Device::cpu()).current;
  acts.blocks[0].reset();
  acts.blocks[1].reset();
  EXPECT_LT(memory_stats(Device::cpu()).current, before);  // the memory really went back
  EXPECT_FALSE(acts.blocks[0].defined());
  model.block(0).forward(acts.inputs[0], acts.blocks[0]);
  model.block(1).forward(acts.inputs[1], acts.blocks[1]);
  model.backward(acts);
  expect_equal(model.params().grads(), reference, "grads");
}

TEST(GPT, BackwardWithoutActivationsIsAnError) {
  nn::GPT model(model_config("tiny"));
  Tensor x = random_tokens({1, 8}, 256, 14);
  nn::GPTActivations acts;
  model.forward(x, x, acts);
  acts.blocks[1].reset();
  EXPECT_THROW(model.backward(acts), CheckFailed);
  nn::GPTActivations never_filled;
  EXPECT_THROW(model.backward(never_filled), CheckFailed);
}

// Sequential reference: forward + backward of each micro-batch in turn, gradients accumulated.
Tensor sequential_grads(nn::GPT& model, const std::vector<Tensor>& xs,
                        const std::vector<Tensor>& ys, std::vector<double>& losses) {
  model.zero_grad();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    losses.push_back(model.forward(xs[i], ys[i]));
    model.backward(1.0 / static_cast<double>(xs.size()));
  }
  return model.params().grads().clone();
}

// Runs a schedule of actions: 'F' i fills acts[i], 'B' i consumes it. Checks the activations of
// every micro-batch in flight are held at once (and freed by its backward).
Tensor scheduled_grads(nn::GPT& model, const std::vector<Tensor>& xs,
                       const std::vector<Tensor>& ys, const std::vector<std::pair<char, int>>& plan,
                       std::vector<double>& losses, int expect_in_flight) {
  model.zero_grad();
  std::vector<nn::GPTActivations> acts(xs.size());
  losses.assign(xs.size(), 0.0);
  int in_flight = 0, most = 0;
  for (auto [action, i] : plan) {
    if (action == 'F') {
      EXPECT_EQ(acts[i].nbytes(), 0u) << "F(" << i << ") twice";
      losses[i] = model.forward(xs[i], ys[i], acts[i]);
      most = std::max(most, ++in_flight);
    } else {
      model.backward(acts[i], 1.0 / static_cast<double>(xs.size()));
      EXPECT_EQ(acts[i].nbytes(), 0u) << "B(" << i << ") leaves its activations";
      --in_flight;
    }
  }
  EXPECT_EQ(most, expect_in_flight);
  return model.params().grads().clone();
}

TEST(GPT, MicroBatchesInFlightGiveTheSequentialGradients) {
  // A pipeline stage's premise: activations belong to the forward call, so F(0) F(1) F(2) may all
  // be in flight before B(0). Four micro-batches, float32 on the CPU.
  nn::GPT model(model_config("tiny"));
  std::vector<Tensor> xs, ys;
  for (int i = 0; i < 4; ++i) {
    xs.push_back(random_tokens({2, 16}, 256, 40 + i));
    ys.push_back(random_tokens({2, 16}, 256, 50 + i));
  }
  std::vector<double> seq_losses, losses;
  const Tensor want = sequential_grads(model, xs, ys, seq_losses);
  // 1F1B's order on a first stage of 3: backward in micro-batch order, so the gradients add up
  // in the same order: bitwise.
  const Tensor got = scheduled_grads(
      model, xs, ys, {{'F', 0}, {'F', 1}, {'F', 2}, {'B', 0}, {'F', 3}, {'B', 1}, {'B', 2}, {'B', 3}},
      losses, 3);
  EXPECT_EQ(losses, seq_losses);
  expect_equal(got, want, "grads, 1F1B order");
  // B(1) before B(0): the same gradients summed in another order. Each micro-batch's gradient is
  // bitwise the same, but (g1 + g0) + g2 may round differently from (g0 + g1) + g2 where a row
  // of wte gets several tokens: 1e-6 relative to the largest gradient (float32).
  const Tensor swapped = scheduled_grads(
      model, xs, ys, {{'F', 0}, {'F', 1}, {'F', 2}, {'B', 1}, {'B', 0}, {'F', 3}, {'B', 2}, {'B', 3}},
      losses, 3);
  EXPECT_EQ(losses, seq_losses);
  double scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::abs(want.item(i)));
  for (int64_t i = 0; i < want.numel(); ++i)
    ASSERT_NEAR(swapped.item(i), want.item(i), 1e-6 * scale) << "grads, B(1) before B(0), at " << i;
}

TEST(GPT, MicroBatchesShareNothingThroughTheModel) {
  // The planted fault the test above must catch: a model that kept one set of activations would
  // run B(0) on F(2)'s. Emulated here by backward of micro-batch 0 with micro-batch 2's
  // activations: the gradients must differ from the sequential run's.
  nn::GPT model(model_config("tiny"));
  Tensor x0 = random_tokens({2, 16}, 256, 40), y0 = random_tokens({2, 16}, 256, 50);
  Tensor x2 = random_tokens({2, 16}, 256, 42), y2 = random_tokens({2, 16}, 256, 52);
  model.zero_grad();
  model.forward(x0, y0);
  model.backward();
  const Tensor want = model.params().grads().clone();
  model.zero_grad();
  nn::GPTActivations a0, a2;
  model.forward(x0, y0, a0);
  model.forward(x2, y2, a2);
  model.backward(a2);  // "B(0)" on the wrong activations
  bool differs = false;
  for (int64_t i = 0; i < want.numel() && !differs; ++i) differs = want.item(i) != model.params().grads().item(i);
  EXPECT_TRUE(differs);
}

TEST(GPT, HookFiresOncePerParameterWhenItsGradientIsFinal) {
  nn::GPT model(model_config("tiny"));
  std::vector<std::string> order;
  std::map<std::string, double> norm_at_hook;
  model.set_backward_hook([&](const std::vector<nn::Parameter*>& done) {
    for (nn::Parameter* p : done) {
      order.push_back(p->name);
      norm_at_hook[p->name] = ops::sum_squares(p->grad);
    }
  });
  Tensor x = random_tokens({2, 16}, 256, 15), y = random_tokens({2, 16}, 256, 16);
  model.zero_grad();
  model.forward(x, y);
  model.backward();
  EXPECT_EQ(order.size(), model.parameters().size());
  EXPECT_EQ(std::set<std::string>(order.begin(), order.end()).size(), order.size());
  EXPECT_EQ(order.front(), "ln_f.weight");  // the last layer's gradients are final first
  EXPECT_EQ(order.back(), "wpe.weight");    // the tied wte only after the embedding's backward
  for (nn::Parameter* p : model.parameters())  // nothing changed after the hook saw it
    EXPECT_EQ(norm_at_hook[p->name], ops::sum_squares(p->grad)) << p->name;
}

// The unit hooks (issue 21): the model's own pieces call them around every unit, in forward and
// backward order, the unit hooks outside the block hooks (so a gather is there for a
// recomputation); a PolicyList calls its policies in the order added; with the hooks only
// observing, the gradients are bitwise those of the model without a policy.
namespace {
class Recorder final : public nn::BlockPolicy {
 public:
  Recorder(std::vector<std::string>& log, std::string tag) : log_(log), tag_(std::move(tag)) {}
  void after_forward(const nn::Block& b, const Tensor&, nn::BlockActivations&, int64_t) override {
    add("af", static_cast<std::size_t>(b.index));
  }
  void before_backward(const nn::Block& b, const Tensor&, nn::BlockActivations&,
                       int64_t) override {
    add("bb", static_cast<std::size_t>(b.index));
  }
  // an evaluation pass (model.evaluating()) is marked "e"
  void before_unit_forward(const nn::GPT& m, std::size_t u) override {
    add(m.evaluating() ? "eF<" : "F<", u);
  }
  void after_unit_forward(const nn::GPT& m, std::size_t u) override {
    add(m.evaluating() ? "eF>" : "F>", u);
  }
  void before_unit_backward(const nn::GPT& m, std::size_t u) override {
    add(m.evaluating() ? "eB<" : "B<", u);
  }
  void after_unit_backward(const nn::GPT& m, std::size_t u) override {
    add(m.evaluating() ? "eB>" : "B>", u);
  }

 private:
  void add(const char* what, std::size_t i) { log_.push_back(tag_ + what + std::to_string(i)); }
  std::vector<std::string>& log_;
  std::string tag_;
};
}  // namespace

TEST(GPT, UnitHooksRunAroundEveryUnitInOrder) {
  nn::GPT plain(micro(), f64_options()), hooked(micro(), f64_options());
  std::vector<std::string> log;
  hooked.add_block_policy(std::make_shared<Recorder>(log, ""));
  hooked.add_block_policy(std::make_shared<Recorder>(log, "2:"));
  Tensor x = random_tokens({2, 5}, 11, 12), y = random_tokens({2, 5}, 11, 13);
  EXPECT_EQ(hooked.forward(x, y), plain.forward(x, y));
  hooked.backward();
  plain.backward();
  expect_equal(hooked.params().grads(), plain.params().grads(), "gradients");
  // units: 0 embedding, 1 blocks.0, 2 blocks.1, 3 head (block hooks name the block's index)
  const std::vector<std::string> want = {
      "F<0", "2:F<0", "F>0", "2:F>0",
      "F<1", "2:F<1", "af0", "2:af0", "F>1", "2:F>1",
      "F<2", "2:F<2", "af1", "2:af1", "F>2", "2:F>2",
      "F<3", "2:F<3", "F>3", "2:F>3",
      "B<3", "2:B<3", "B>3", "2:B>3",
      "B<2", "2:B<2", "bb1", "2:bb1", "B>2", "2:B>2",
      "B<1", "2:B<1", "bb0", "2:bb0", "B>1", "2:B>1",
      "B<0", "2:B<0", "B>0", "2:B>0"};
  EXPECT_EQ(log, want);
}

// The evaluation pass (logits, loss, and so generate) runs the same unit hooks as a training
// forward, in forward order, with evaluating() true (and false again after it), and no block
// hook: it keeps no activations, so there is nothing to drop or recompute. With the hooks only
// observing, the loss and logits are bitwise those of the model without a policy.
TEST(GPT, EvaluationRunsTheUnitForwardHooks) {
  nn::GPT plain(micro(), f64_options()), hooked(micro(), f64_options());
  std::vector<std::string> log;
  hooked.add_block_policy(std::make_shared<Recorder>(log, ""));
  Tensor x = random_tokens({2, 5}, 11, 12), y = random_tokens({2, 5}, 11, 13);
  EXPECT_EQ(hooked.loss(x, y), plain.loss(x, y));
  expect_equal(hooked.logits(x), plain.logits(x), "logits");
  EXPECT_FALSE(hooked.evaluating());
  const std::vector<std::string> pass = {"eF<0", "eF>0", "eF<1", "eF>1",
                                         "eF<2", "eF>2", "eF<3", "eF>3"};
  std::vector<std::string> want = pass;
  want.insert(want.end(), pass.begin(), pass.end());  // loss, then logits
  EXPECT_EQ(log, want);
  log.clear();
  nn::generate(hooked, {1, 2}, 2, 0.0, 1);  // one pass per generated token
  EXPECT_EQ(log.size(), 2 * pass.size());
  log.clear();
  hooked.forward(x, y);  // a training forward after it is marked as training again
  EXPECT_EQ(log.front(), "F<0");
}

TEST(GPT, GenerateIsSeededAndExtendsThePrompt) {
  nn::GPT model(model_config("tiny"));
  auto a = nn::generate(model, {65, 66}, 20, 1.0, 7), b = nn::generate(model, {65, 66}, 20, 1.0, 7);
  EXPECT_EQ(a.size(), 22u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a[0], 65);
}

// The fused (flash) attention in the model: the same loss and gradients as the written-out
// attention (float64: only the order of the softmax's sums differs, 1e-10), and a forward that
// keeps one log-sum-exp per row instead of the (T, T) probabilities. Planted fault this catches: a
// flash path that drops the 1/sqrt(hs) scale or the causal mask (loss differs), or that still
// keeps att (bytes).
TEST(GPT, FlashAttentionGivesTheWrittenOutGradientsAndKeepsNoTxT) {
  const int64_t T = 70;  // more than one 64-row tile, and not a multiple of it
  const ModelConfig cfg{"micro-long", 11, T, 2, 2, 8};
  Tensor x = random_tokens({2, T}, 11, 8), y = random_tokens({2, T}, 11, 9);
  nn::GPTOptions plain = f64_options(), flash = f64_options();
  flash.flash_attention = true;
  nn::GPT a(cfg, plain), b(cfg, flash);
  nn::GPTActivations acts_a, acts_b;
  const double la = a.forward(x, y, acts_a), lb = b.forward(x, y, acts_b);
  EXPECT_NEAR(la, lb, 1e-10);
  // per block: att (B*NH, T, T) doubles replaced by lse (B*NH, T) doubles
  const std::size_t per_block = 2 * 2 * (T * T - T) * sizeof(double);
  EXPECT_EQ(acts_a.nbytes() - acts_b.nbytes(), static_cast<std::size_t>(cfg.n_layer) * per_block);
  for (const nn::BlockActivations& blk : acts_b.blocks) EXPECT_FALSE(blk.attn.att.defined());
  a.zero_grad();
  b.zero_grad();
  a.backward(acts_a);
  b.backward(acts_b);
  const Tensor& ga = a.params().grads();
  const Tensor& gb = b.params().grads();
  ASSERT_EQ(ga.numel(), gb.numel());
  for (int64_t i = 0; i < ga.numel(); ++i)
    ASSERT_NEAR(ga.item(i), gb.item(i), 1e-10 * (1 + std::abs(ga.item(i)))) << "gradient " << i;
}
