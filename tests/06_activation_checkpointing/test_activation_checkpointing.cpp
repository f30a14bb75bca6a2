// Lab 06 graders. The heart: under every policy the gradients are BITWISE those of plain
// forward + backward (recomputation runs the same deterministic CPU kernels on the same inputs,
// so nothing may change), checked here against the model's own forward/backward.
// Memory is counted by the allocator and the blocks' activation sizes, which are exact: the
// estimate of step 4 must equal the measured bytes, and no test measures time.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/allocator.hpp"
#include "common/errors.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/reference.hpp"
#include "activation_checkpointing.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/lab_fixture.hpp"

using namespace scalelab;
using lab06::Plan;
using lab06::Policy;

namespace {

constexpr int kLayers = 4;
constexpr int64_t kBatch = 4;
constexpr labtest::Setup kLab{.seed = 606, .global_batch = kBatch, .corpus_seed = 6,
                              .n_layer = kLayers};
constexpr uint64_t kSeed = kLab.seed;

const ModelConfig& config() { return kLab.config(); }
data::Batch batch(int64_t step = 0) { return kLab.batch(step); }
using labtest::bitwise;

Plan full_plan(std::vector<bool> full) {
  return Plan{full, std::vector<bool>(full.size(), false)};
}

// Loss and gradients of the model's own forward + backward: what checkpointing must reproduce.
train::Reference plain(const data::Batch& b) { return kLab.reference(b); }

// One step of your checkpointed forward and backward on `model`: its loss (the gradients stay in
// the model).
double checkpointed(nn::GPT& model, const Plan& plan, const data::Batch& b) {
  model.zero_grad();
  lab06::Saved saved;
  const double loss = lab06::forward(model, b, plan, saved);
  lab06::backward(model, saved);
  return loss;
}

// A checkpointed forward written here (full checkpoints only), so step 2 is graded on its own.
double reference_forward(nn::GPT& model, const data::Batch& b, const Plan& plan,
                         lab06::Saved& saved) {
  saved.plan = plan;
  nn::GPTActivations& acts = saved.acts;
  acts.inputs.assign(kLayers, Tensor());
  acts.blocks.assign(kLayers, nn::BlockActivations());
  Tensor x = model.embed(b.x, acts);
  for (int i = 0; i < kLayers; ++i) {
    acts.inputs[i] = x;
    x = model.block(i).forward(x, acts.blocks[i]);
    if (plan.full[i]) acts.blocks[i].reset();
  }
  return model.head_forward(x, b.y, acts);
}

// Step 2 alone: the forward above, then the attendee's backward; the loss (the gradients stay in
// the model).
double checkpointed_backward(nn::GPT& model, const Plan& plan, const data::Batch& b) {
  model.zero_grad();
  lab06::Saved saved;
  const double loss = reference_forward(model, b, plan, saved);
  lab06::backward(model, saved);
  return loss;
}

// Planted faults of step 2, written here: a backward that does not recompute, and one that
// recomputes from the wrong tensor (the block's output instead of its input).
enum class Fault { no_recompute, wrong_input };
void faulty_backward(nn::GPT& model, lab06::Saved& saved, Fault fault) {
  nn::GPTActivations& acts = saved.acts;
  Tensor d = model.head_backward(acts);
  for (int i = kLayers - 1; i >= 0; --i) {
    nn::Block& block = model.block(i);
    if (!acts.blocks[i].defined() && fault == Fault::wrong_input)
      block.forward(i + 1 < kLayers ? acts.inputs[i + 1] : acts.inputs[i], acts.blocks[i]);
    // no_recompute: the block has nothing to use
    d = block.backward(d, acts.inputs[i], acts.blocks[i]);
  }
  model.embed_backward(d, acts);
}

// A checkpointed backward written here that frees each block's activations (and its input) as
// soon as its backward has used them: what the attendee's backward's peak is held to.
void freeing_backward(nn::GPT& model, lab06::Saved& saved) {
  nn::GPTActivations& acts = saved.acts;
  Tensor d = model.head_backward(acts);
  for (int i = kLayers - 1; i >= 0; --i) {
    nn::Block& block = model.block(i);
    if (!acts.blocks[i].defined()) block.forward(acts.inputs[i], acts.blocks[i]);
    d = block.backward(d, acts.inputs[i], acts.blocks[i]);
    acts.blocks[i].reset();
    acts.inputs[i] = Tensor();
  }
  model.embed_backward(d, acts);
  acts.reset();
}

// The allocator's peak during `backward` above what the test's forward (every block of `plan`)
// left held: the bytes a backward adds at its busiest.
template <class Backward>
std::size_t backward_peak(const Plan& plan, const data::Batch& b, Backward backward) {
  nn::GPT model(config(), {.seed = kSeed});
  model.zero_grad();
  lab06::Saved saved;
  reference_forward(model, b, plan, saved);
  const std::size_t before = memory_stats(Device::cpu()).current;
  reset_peak_memory(Device::cpu());
  backward(model, saved);
  return memory_stats(Device::cpu()).peak - before;
}

// What the test's forward leaves held under `plan` (the allocator's bytes, model excluded).
std::size_t held_after_forward(const Plan& plan, const data::Batch& b) {
  nn::GPT model(config(), {.seed = kSeed});
  lab06::Saved saved;
  const std::size_t before = memory_stats(Device::cpu()).current;
  reference_forward(model, b, plan, saved);
  return memory_stats(Device::cpu()).current - before;
}

}  // namespace

// ---- Step 1: forward ---------------------------------------------------------------------------

TEST(Step1_Forward, KeepsOnlyInputsOfCheckpointedBlocks) {
  const data::Batch b = batch();
  nn::GPT model(config(), {.seed = kSeed});
  lab06::Saved saved;
  const Plan plan = full_plan({true, false, true, false});
  const double loss = lab06::forward(model, b, plan, saved);
  ASSERT_EQ(saved.acts.inputs.size(), static_cast<std::size_t>(kLayers));
  ASSERT_EQ(saved.acts.blocks.size(), static_cast<std::size_t>(kLayers));
  for (int i = 0; i < kLayers; ++i)
    if (saved.acts.blocks[i].defined() == plan.full[i])
      LABTEST_FAIL() << "block " << i
                     << (plan.full[i] ? " is checkpointed: after its forward it keeps nothing but "
                                        "its input (its activations freed)"
                                      : " is not checkpointed: it keeps its activations for "
                                        "backward");
  // the saved inputs are the plain forward's block inputs, and the loss is the plain loss
  nn::GPT twin(config(), {.seed = kSeed});
  EXPECT_EQ(loss, twin.forward(b.x, b.y)) << "bitwise the loss of model.forward";
  for (int i = 0; i < kLayers; ++i)
    EXPECT_TRUE(bitwise(saved.acts.inputs[i], twin.activations().inputs[i]))
        << "input of block " << i;
}

TEST(Step1_Forward, CheckpointingHoldsLess) {
  const data::Batch b = batch();
  nn::GPT a(config(), {.seed = kSeed}), c(config(), {.seed = kSeed});
  lab06::Saved keep, ckpt;
  lab06::forward(a, b, full_plan({false, false, false, false}), keep);
  lab06::forward(c, b, full_plan({true, true, true, true}), ckpt);
  const std::size_t held_keep = lab06::held_activation_bytes(keep);
  const std::size_t held_ckpt = lab06::held_activation_bytes(ckpt);
  // every checkpointed block holds exactly its input (B, T, C) floats
  EXPECT_EQ(held_ckpt, static_cast<std::size_t>(kLayers * kBatch * config().block_size *
                                                config().n_embd * 4));
  EXPECT_LT(held_ckpt * 5, held_keep) << "inputs only: a small part of the activations";
}

// ---- Step 2: backward ------------------------------------------------------------------------

TEST(Step2_Backward, GradientsBitwiseEqualNoCheckpointing) {
  const data::Batch b = batch();
  const train::Reference ref = plain(b);
  for (const auto& full : std::vector<std::vector<bool>>{{false, false, false, false},
                                                         {true, true, true, true},
                                                         {true, false, true, false},
                                                         {false, false, false, true}}) {
    nn::GPT model(config(), {.seed = kSeed});
    labtest::Explain why(model, {.seed = kSeed});  // a failure names the first tensor off the twin
    const double loss = checkpointed_backward(model, full_plan(full), b);
    why.step_done(b);
    EXPECT_EQ(loss, ref.loss);
    EXPECT_TRUE(labtest::on_every_rank(bitwise(model.params().grads(), ref.grads), why))
        << "blocks checkpointed: " << testing::PrintToString(full);
  }
}

TEST(Step2_Backward, GradientsAccumulateAndMemoryIsReleased) {
  const data::Batch b0 = batch(0), b1 = batch(1);
  nn::GPT model(config(), {.seed = kSeed}), twin(config(), {.seed = kSeed});
  const Plan plan = full_plan({true, false, true, false});
  model.zero_grad();
  twin.zero_grad();
  for (const data::Batch* b : {&b0, &b1}) {  // two backward passes add up, as GPT::backward's
    lab06::Saved saved;
    reference_forward(model, *b, plan, saved);
    lab06::backward(model, saved);
    for (std::size_t i = 0; i < saved.acts.blocks.size(); ++i)
      EXPECT_FALSE(saved.acts.blocks[i].defined())
          << "block " << i << ": a block's activations are used up after its backward";
    EXPECT_EQ(lab06::held_activation_bytes(saved), 0u)
        << "nothing of the blocks is held after backward";
    twin.forward(b->x, b->y);
    twin.backward();
  }
  EXPECT_TRUE(bitwise(model.params().grads(), twin.params().grads()))
      << "after two backward passes: the gradients add up (+=), as GPT::backward's do; backward "
         "must not zero them";
}

// Memory falls as backward proceeds (the README's goal): with every block checkpointed, a backward
// that frees each block after its backward holds one block's recomputed activations at a time; one
// that frees them all at the end holds every block's at once, though its gradients are right and
// nothing is left after it. The allocator's peak during the attendee's backward, against the
// freeing backward written above, within half a block's activations (both run the same kernels
// on the same tensors: measured equal).
TEST(Step2_Backward, FreesEachBlockAfterItsBackward) {
  const data::Batch b = batch();
  const Plan every = full_plan({true, true, true, true});
  const std::size_t block =
      (held_after_forward(full_plan({false, false, false, false}), b) -
       held_after_forward(every, b)) / kLayers;  // one block's activations
  const std::size_t mine = backward_peak(every, b, [](nn::GPT& m, lab06::Saved& s) {
    lab06::backward(m, s);
  });
  const std::size_t freeing = backward_peak(every, b, freeing_backward);
  if (mine > freeing + block / 2)
    LABTEST_FAIL() << "with every block checkpointed, backward's peak was " << mine
                   << " bytes above what the forward left, "
                   << (mine - std::min(mine, freeing)) / std::max<std::size_t>(block, 1)
                   << " block(s) of activations (" << block << " bytes each) more than a backward "
                   << "that frees each block's activations right after its backward (" << freeing
                   << "): recomputed activations were held at once; free them as soon as the "
                   << "block's backward has used them";
}

TEST(Step2_PlantedFault, BlockNotRecomputedIsCaught) {
  const data::Batch b = batch();
  nn::GPT model(config(), {.seed = kSeed});
  lab06::Saved saved;
  reference_forward(model, b, full_plan({true, true, true, true}), saved);
  EXPECT_THROW(faulty_backward(model, saved, Fault::no_recompute), CheckFailed)
      << "a block's backward without its activations must not go unnoticed";
}

TEST(Step2_PlantedFault, RecomputeFromWrongInputIsCaught) {
  const data::Batch b = batch();
  nn::GPT model(config(), {.seed = kSeed});
  model.zero_grad();
  lab06::Saved saved;
  reference_forward(model, b, full_plan({true, true, true, true}), saved);
  faulty_backward(model, saved, Fault::wrong_input);
  EXPECT_FALSE(bitwise(model.params().grads(), plain(b).grads))
      << "the check of Step2_Backward must fail for a block recomputed from the wrong input";
}

// ---- Step 3: policies ----------------------------------------------------------------------

TEST(Step3_Policies, Plans) {
  using V = std::vector<bool>;
  EXPECT_EQ(lab06::make_plan(lab06::parse_policy("none"), 4).full, V(4, false));
  EXPECT_EQ(lab06::make_plan(lab06::parse_policy("none"), 4).selective, V(4, false));
  EXPECT_EQ(lab06::make_plan(lab06::parse_policy("every"), 4).full, V(4, true));
  EXPECT_EQ(lab06::make_plan(lab06::parse_policy("every:1"), 4).full, V(4, true));
  EXPECT_EQ(lab06::make_plan(lab06::parse_policy("every:2"), 4).full, (V{true, false, true, false}));
  EXPECT_EQ(lab06::make_plan(lab06::parse_policy("every:3"), 7).full,
            (V{true, false, false, true, false, false, true}));
  EXPECT_EQ(lab06::make_plan(lab06::parse_policy("every:4"), 4).full, (V{true, false, false, false}));
  const Plan sel = lab06::make_plan(lab06::parse_policy("selective"), 4);
  EXPECT_EQ(sel.full, V(4, false));
  EXPECT_EQ(sel.selective, V(4, true));
}

TEST(Step3_Policies, IntervalLargerThanTheModelIsAUsageError) {
  EXPECT_THROW(lab06::make_plan({Policy::every_kth, 5}, 4), UsageError);
  EXPECT_THROW(lab06::make_plan({Policy::every_kth, 0}, 4), UsageError);
  EXPECT_THROW(lab06::parse_policy("every:0"), UsageError);
  EXPECT_THROW(lab06::parse_policy("sometimes"), UsageError);
}

TEST(Step3_Policies, SelectiveDropsAndRecomputesBitwise) {
  const data::Batch b = batch();
  nn::GPT model(config(), {.seed = kSeed});
  model.forward(b.x, b.y);
  nn::BlockActivations& acts = model.activations().blocks[1];
  const Tensor att = acts.attn.att.clone(), g = acts.mlp.g.clone();
  const std::size_t before = acts.nbytes();
  lab06::drop_selective(acts);
  EXPECT_FALSE(acts.attn.att.defined());
  EXPECT_FALSE(acts.mlp.g.defined());
  EXPECT_TRUE(acts.mlp.h.defined()) << "keep the GELU input";
  EXPECT_TRUE(acts.attn.q.defined()) << "keep q, k, v";
  EXPECT_EQ(before - acts.nbytes(), att.nbytes() + g.nbytes());
  lab06::recompute_selective(acts);
  EXPECT_TRUE(bitwise(acts.attn.att, att));
  EXPECT_TRUE(bitwise(acts.mlp.g, g));
}

// A plan's selective blocks reach the forward (step 1's loop calls step 3's drop_selective): each
// keeps its activations but not att and g, which step 4's estimate does not count. Checked here,
// where the estimate would otherwise be blamed for a forward that never drops them.
TEST(Step3_Policies, TheForwardDropsTheSelectivePieces) {
  const data::Batch b = batch();
  nn::GPT model(config(), {.seed = kSeed});
  lab06::Saved saved;
  const Plan plan{std::vector<bool>(kLayers, false), {true, false, true, true}};
  lab06::forward(model, b, plan, saved);
  for (int i = 0; i < kLayers; ++i) {
    const nn::BlockActivations& a = saved.acts.blocks[i];
    const bool dropped = !a.attn.att.defined() && !a.mlp.g.defined();
    if (a.defined() && dropped != plan.selective[i])
      LABTEST_FAIL() << "block " << i
                     << (plan.selective[i] ? " is selective: after forward it holds no attention "
                                             "probabilities and no GELU output (drop_selective)"
                                           : " is not selective: it keeps att and g");
    else if (!a.defined())
      LABTEST_FAIL() << "block " << i << " kept no activations: the plan checkpoints no block";
  }
}

TEST(Step3_Policies, EveryPolicyGivesBitwiseTheSameGradients) {
  const data::Batch b = batch(2);
  const train::Reference ref = plain(b);
  for (const char* name : {"none", "every", "every:2", "every:3", "selective"}) {
    nn::GPT model(config(), {.seed = kSeed});
    labtest::Explain why(model, {.seed = kSeed});  // a failure names the first tensor off the twin
    const double loss =
        checkpointed(model, lab06::make_plan(lab06::parse_policy(name), kLayers), b);
    why.step_done(b);
    EXPECT_EQ(loss, ref.loss) << name;
    EXPECT_TRUE(labtest::on_every_rank(bitwise(model.params().grads(), ref.grads), why)) << name;
  }
}

// ---- Step 4: the estimate ------------------------------------------------------------------

TEST(Step4_Estimate, LectureFormula) {
  // GPT-3 175B shapes from the paper: a = 96, h = 12288, s = 2048, b = 1, L = 96
  const double per_layer = 2048.0 * 12288 * (34 + 5.0 * 96 * 2048 / 12288);
  EXPECT_DOUBLE_EQ(lab06::lecture_activation_bytes(96, 2048, 1, 12288, 96), 96 * per_layer);
  EXPECT_DOUBLE_EQ(lab06::lecture_activation_bytes(1, 1, 1, 1, 0), 34);
  EXPECT_DOUBLE_EQ(lab06::lecture_activation_bytes(2, 64, 8, 128, 4), 2.0 * 64 * 8 * 128 * (34 + 5.0 * 4 * 64 / 128));
}

TEST(Step4_Estimate, ModelCountEqualsMeasuredBytesForEveryPolicy) {
  const data::Batch b = batch();
  for (const char* name : {"none", "every", "every:2", "every:3", "selective"}) {
    const Plan plan = lab06::make_plan(lab06::parse_policy(name), kLayers);
    nn::GPT model(config(), {.seed = kSeed});
    lab06::Saved saved;
    lab06::forward(model, b, plan, saved);
    EXPECT_EQ(lab06::model_activation_bytes(config(), kBatch, config().block_size, plan),
              lab06::held_activation_bytes(saved))
        << name << ": the estimate must count exactly what the blocks hold";
  }
}

TEST(Step4_Estimate, MatchesTheLectureWithoutDropoutInFp32) {
  // No checkpointing: this model's count is the lecture's 16-bit count with the two dropout
  // masks (2 bytes of the 34) and the attention dropout (3 of the 5) removed, in 4-byte floats
  // (x2), plus the LayerNorm statistics (16 bytes per token and layer).
  const ModelConfig c = config();
  const double L = kLayers, s = c.block_size, b = 3, h = c.n_embd, a = c.n_head;
  const Plan none = lab06::make_plan({Policy::none}, kLayers);
  const double mapped = L * s * b * h * (2 * (34 - 2) + 2 * (5 - 3) * a * s / h) + 16 * L * s * b;
  EXPECT_DOUBLE_EQ(static_cast<double>(lab06::model_activation_bytes(c, 3, c.block_size, none)), mapped);
  EXPECT_GT(lab06::lecture_activation_bytes(L, s, b, h, a), 0);
}
