// Lab 06 graders. The heart: under every policy the gradients are BITWISE those of plain
// forward + backward (recomputation runs the same deterministic CPU kernels on the same inputs,
// so nothing may change), checked here against the model's own forward/backward.
// Memory is seen two ways, both exact: held_activation_bytes (what saved.acts's blocks hold: step
// 4's estimate must equal it) and the allocator (every live tensor and the peak: what the process
// really holds, so activations freed late or parked outside Saved show). No test measures time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "common/allocator.hpp"
#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/reference.hpp"
#include "activation_checkpointing.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/lab_fixture.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"
#include "tests/support/what_it_did.hpp"

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

// One block's activations (what checkpointing it saves), in bytes: the unit of the peak checks.
std::size_t one_block_bytes(const data::Batch& b) {
  return (held_after_forward(full_plan({false, false, false, false}), b) -
          held_after_forward(full_plan({true, true, true, true}), b)) / kLayers;
}

// The allocator around a call: its peak above the bytes held before the call, and the bytes the
// call leaves held (negative when it frees more than it keeps).
struct AllocatorUse {
  std::size_t peak;
  std::ptrdiff_t held;
};
template <class F>
AllocatorUse allocator_use(F call) {
  const std::size_t before = memory_stats(Device::cpu()).current;
  reset_peak_memory(Device::cpu());
  call();
  const MemoryStats after = memory_stats(Device::cpu());
  return {after.peak - before,
          static_cast<std::ptrdiff_t>(after.current) - static_cast<std::ptrdiff_t>(before)};
}

// `bytes` in blocks of `block` bytes, two decimals ("0.62": a truncated count read "0 block(s)").
std::string blocks_of(std::size_t bytes, std::size_t block) {
  return fmt::format("{:.2f}", static_cast<double>(bytes) /
                                   static_cast<double>(std::max<std::size_t>(block, 1)));
}

std::string plan_text(const std::vector<bool>& full) {
  std::string text = "{";
  for (std::size_t i = 0; i < full.size(); ++i) text += (i ? "," : "") + std::to_string(full[i]);
  return text + "}";
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

// What checkpointing is for: the memory of forward. A checkpointed block's activations are freed
// right after its own forward (one block's are alive at a time) and kept nowhere else. Saved alone
// cannot show it (a forward that frees them after the loop, or parks them in a store of its own,
// leaves Saved the same), so the allocator is read around the attendee's forward and the test's,
// every block checkpointed: the bytes left held must be equal, and the peak within half a block
// (both run the same kernels on the same tensors: measured equal).
TEST(Step1_Forward, FreesEachCheckpointedBlockRightAfterItsForward) {
  const data::Batch b = batch();
  const Plan every = full_plan({true, true, true, true});
  const std::size_t block = one_block_bytes(b);
  nn::GPT r(config(), {.seed = kSeed}), m(config(), {.seed = kSeed});
  lab06::Saved rs, ms;
  const AllocatorUse ref = allocator_use([&] { reference_forward(r, b, every, rs); });
  const AllocatorUse mine = allocator_use([&] { lab06::forward(m, b, every, ms); });
  if (mine.held != ref.held)
    LABTEST_FAIL() << "with every block checkpointed, the allocator holds " << mine.held
                   << " bytes after your forward, where a forward that keeps only the blocks' "
                   << "inputs (and the head's activations) holds " << ref.held
                   << ": a checkpointed block's activations are still alive somewhere (a copy "
                   << "or a container outside saved.acts); free them";
  if (mine.peak > ref.peak + block / 2)
    LABTEST_FAIL() << "with every block checkpointed, your forward's peak was " << mine.peak
                   << " bytes above the start, "
                   << blocks_of(mine.peak - ref.peak, block) << " block(s) of activations ("
                   << block << " bytes each) more than a forward "
                   << "that frees each checkpointed block's activations right after its forward ("
                   << ref.peak << "): free them before the next block runs";
}

// Nothing the forward made outlives its model and Saved: the forward runs on 2 rows, then on 3,
// each model and Saved destroyed after; the allocator holds the same after both. A container
// outside saved.acts that keeps the checkpointed blocks' activations (a static one too, which
// an earlier test of the same shape can hide from a before/after count) holds the last
// forward's, and 3 rows' are not 2 rows'.
TEST(Step1_Forward, NothingOutlivesTheModelAndItsSaved) {
  const data::Batch b = batch();
  const Plan every = full_plan({true, true, true, true});
  std::vector<std::size_t> after;
  for (const int64_t rows : {int64_t{2}, int64_t{3}}) {
    {
      nn::GPT m(config(), {.seed = kSeed});
      lab06::Saved s;
      lab06::forward(m, b.rows(0, rows), every, s);
    }
    after.push_back(memory_stats(Device::cpu()).current);
  }
  if (after[1] != after[0])
    LABTEST_FAIL() << "after a forward of 3 rows, its model and its Saved destroyed, the allocator "
                   << "holds " << static_cast<std::ptrdiff_t>(after[1] - after[0])
                   << " bytes more than after the same for 2 rows: tensors outlive them (a "
                   << "container outside saved.acts, a static one?); keep nothing but saved";
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

// Memory falls as backward proceeds (the README's goal): every block's activations, checkpointed
// or not, are freed right after its backward. A backward that frees them all at the end (or only
// the recomputed ones) has the right gradients and leaves nothing after it, but holds several
// blocks' activations at once. The allocator's peak during the attendee's backward, against the
// freeing backward written above, for no block, every other block and every block checkpointed:
// no higher (both run the same kernels on the same tensors: measured equal, to the byte).
TEST(Step2_Backward, FreesEachBlockAfterItsBackward) {
  const data::Batch b = batch();
  const std::size_t block = one_block_bytes(b);
  for (const auto& full : std::vector<std::vector<bool>>{{false, false, false, false},
                                                         {true, false, true, false},
                                                         {true, true, true, true}}) {
    const std::size_t mine = backward_peak(full_plan(full), b, [](nn::GPT& m, lab06::Saved& s) {
      lab06::backward(m, s);
    });
    const std::size_t freeing = backward_peak(full_plan(full), b, freeing_backward);
    if (mine > freeing)
      LABTEST_FAIL() << "with blocks " << plan_text(full) << " checkpointed, backward's peak was "
                     << mine << " bytes above what the forward left, " << mine - freeing
                     << " bytes (" << blocks_of(mine - freeing, block)
                     << " block(s) of activations of " << block << " bytes) more than a backward "
                     << "that frees each block's activations right after its backward ("
                     << freeing << "): activations were held at once; free each block's, "
                     << "checkpointed or not, as soon as its backward has used them";
  }
}

// A block that kept its activations is not run again: its backward uses what forward kept. A
// recomputation gives the same bits, so the gradients cannot tell; a changed activation can. After
// the test's forward with blocks {1,0,1,0} checkpointed, the GELU output g of the kept blocks 1
// and 3 is doubled: the attendee's gradients must be bitwise those of the test's backward on the
// same changed activations (a backward that recomputes blocks 1 and 3 restores the true g).
TEST(Step2_Backward, UsesKeptActivationsWithoutRecomputingThem) {
  const data::Batch b = batch();
  auto gradients = [&](bool mine) {
    nn::GPT m(config(), {.seed = kSeed});
    m.zero_grad();
    lab06::Saved s;
    reference_forward(m, b, full_plan({true, false, true, false}), s);
    for (int i : {1, 3}) ops::scale(s.acts.blocks[i].mlp.g, 2.0);
    if (mine)
      lab06::backward(m, s);
    else
      freeing_backward(m, s);
    return m.params().grads().clone();
  };
  if (!bitwise(gradients(true), gradients(false)))
    LABTEST_FAIL() << "blocks 1 and 3 are not checkpointed (plan {1,0,1,0}): their backward must "
                   << "use the activations forward kept (the test changed them after forward, and "
                   << "your gradients do not follow the change): a block that kept its "
                   << "activations was run again; recompute only the blocks that kept nothing";
}

// Each block that kept nothing is recomputed once (the work counters: matmul FLOPs and LayerNorm
// rows of the attendee's backward equal those of the test's, which recomputes each once): a
// second recomputation gives the same bits and the same memory, and a third more forward work.
TEST(Step2_Backward, RecomputesEachCheckpointedBlockOnce) {
  const data::Batch b = batch();
  for (const auto& full : std::vector<std::vector<bool>>{{true, false, true, false},
                                                         {true, true, true, true}}) {
    const auto work = [&](auto backward) {
      nn::GPT m(config(), {.seed = kSeed});
      m.zero_grad();
      lab06::Saved s;
      reference_forward(m, b, full_plan(full), s);
      return labtest::work_of([&] { backward(m, s); });
    };
    const ops::WorkCount mine = work([](nn::GPT& m, lab06::Saved& s) { lab06::backward(m, s); });
    const ops::WorkCount want = work(freeing_backward);
    if (!(mine == want))
      LABTEST_FAIL() << "with blocks " << plan_text(full) << " checkpointed, your backward did "
                     << mine.matmul_flops << " matmul FLOPs and " << mine.layernorm_rows
                     << " LayerNorm rows; recomputing each checkpointed block once does "
                     << want.matmul_flops << " and " << want.layernorm_rows
                     << ": recompute a block once, just before its backward";
  }
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
  for (const char* name : {"every", "every:1", "every:2", "every:3", "every:4"})
    if (lab06::make_plan(lab06::parse_policy(name), 4).selective != V(4, false))
      LABTEST_FAIL() << name << " on 4 layers: a plan with selective blocks; under " << name
                     << " a block is checkpointed whole or keeps all its activations (only the "
                     << "policy selective drops pieces)";
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

// Dropping frees memory and recomputing allocates it: the allocator's bytes fall by att's and g's
// across drop_selective and rise by as much across recompute_selective (a drop that hands the two
// tensors to a store of its own, and a recompute that hands them back, pass the bitwise check).
TEST(Step3_Policies, SelectiveDropFreesAndRecomputeAllocates) {
  const data::Batch b = batch();
  nn::GPT model(config(), {.seed = kSeed});
  model.forward(b.x, b.y);
  nn::BlockActivations& acts = model.activations().blocks[1];
  const auto pieces = static_cast<std::ptrdiff_t>(acts.attn.att.nbytes() + acts.mlp.g.nbytes());
  const AllocatorUse drop = allocator_use([&] { lab06::drop_selective(acts); });
  if (drop.held != -pieces)
    LABTEST_FAIL() << "drop_selective changed the allocator's bytes by " << drop.held
                   << ", not by -" << pieces << " (att and g): the two tensors must be freed, "
                   << "not kept elsewhere";
  const AllocatorUse recompute = allocator_use([&] { lab06::recompute_selective(acts); });
  if (recompute.held != pieces)
    LABTEST_FAIL() << "recompute_selective changed the allocator's bytes by " << recompute.held
                   << ", not by " << pieces << " (new att and g): compute them again into new "
                   << "tensors, and keep no temporary";
}

// A selective block gets back only its dropped pieces, not a whole forward (that would undo what
// selective recomputation saves in compute). After the test's forward, blocks 1 and 3 are made
// selective by hand (att and g dropped) and their GELU input h is doubled: the attendee's gradients
// must be bitwise those of the test's backward after recompute_selective on the same changed
// activations (a whole forward recomputes h from the block's input).
TEST(Step3_Policies, SelectiveBlocksAreNotRecomputedWhole) {
  const data::Batch b = batch();
  auto gradients = [&](bool mine) {
    nn::GPT m(config(), {.seed = kSeed});
    m.zero_grad();
    lab06::Saved s;
    reference_forward(m, b, full_plan({false, false, false, false}), s);
    s.plan.selective = {false, true, false, true};
    for (int i : {1, 3}) {
      s.acts.blocks[i].attn.att = Tensor();
      s.acts.blocks[i].mlp.g = Tensor();
      ops::scale(s.acts.blocks[i].mlp.h, 2.0);
    }
    if (mine) {
      lab06::backward(m, s);
    } else {
      for (int i : {1, 3}) lab06::recompute_selective(s.acts.blocks[i]);
      freeing_backward(m, s);
    }
    return m.params().grads().clone();
  };
  if (!bitwise(gradients(true), gradients(false)))
    LABTEST_FAIL() << "blocks 1 and 3 are selective: their backward must use what forward kept "
                   << "and only att and g recomputed (the test changed the kept GELU input after "
                   << "forward, and your gradients do not follow the change): a selective block "
                   << "was recomputed by more than recompute_selective";
}

// Mixed precision: the recomputed pieces are of the block's dtype (q's, and its device), bitwise
// the forward's, in a bf16 model too.
TEST(Step3_Policies, SelectiveRecomputesInTheBlocksDtype) {
  const data::Batch b = batch();
  nn::GPT model(config(), {.seed = kSeed, .compute_dtype = DType::bf16});
  model.forward(b.x, b.y);
  nn::BlockActivations& acts = model.activations().blocks[1];
  const Tensor att = acts.attn.att.clone(), g = acts.mlp.g.clone();
  lab06::drop_selective(acts);
  try {
    lab06::recompute_selective(acts);
  } catch (const CheckFailed& e) {  // e.g. an f32 output given to a kernel with a bf16 input
    LABTEST_FAIL() << "in a bf16 model, recompute_selective stopped: " << e.what()
                   << ": new tensors take q's dtype and device";
    return;
  }
  if (acts.attn.att.dtype() != att.dtype() || acts.mlp.g.dtype() != g.dtype()) {
    LABTEST_FAIL() << "in a bf16 model, recompute_selective made att of "
                   << dtype_name(acts.attn.att.dtype()) << " and g of "
                   << dtype_name(acts.mlp.g.dtype()) << ", the forward's are "
                   << dtype_name(att.dtype()) << ": new tensors take q's dtype and device";
    return;
  }
  EXPECT_TRUE(bitwise(acts.attn.att, att)) << "bf16 model: att recomputed";
  EXPECT_TRUE(bitwise(acts.mlp.g, g)) << "bf16 model: g recomputed";
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

// Steps 1-3 on the simulated GPU (tests/support/on_sim.hpp): every:2 and selective with the model
// and the batch there give the host's loss and gradients bit for bit; a tensor made
// without q's device in the recomputation, or a loop over elements, stops with the op's or the
// tensor's own line, as on a GPU.
TEST(Step3_Policies, RunsOnTheSimulatedGpuAsOnTheHost) {
  const data::Batch b = batch(1);
  std::vector<std::string> problems;
  for (const char* name : {"every:2", "selective"}) {
    const Plan plan = lab06::make_plan(lab06::parse_policy(name), kLayers);
    nn::GPT host(config(), {.seed = kSeed}), sim(config(), {.device = Device::sim(), .seed = kSeed});
    const double want = checkpointed(host, plan, b);
    labtest::collective_run_on_sim([&] {
      const data::Batch on = b.to(sim.device());
      double got = 0;
      // the forward and backward copy nothing but the loss back (8 bytes)
      const HostDeviceCopies moved =
          labtest::copies_of([&] { got = checkpointed(sim, plan, on); });
      problems.push_back(labtest::step_same_on_sim(fmt::format("{}: ", name), want, got,
                                                   "the gradients", host.params().grads(),
                                                   sim.params().grads()));
      if (moved.to_host > 8 || moved.to_device > 0)
        problems.push_back(labtest::copies_problem(
            fmt::format("{}: a checkpointed step (its loss is 8 of those bytes)", name), moved,
            sim.params().grads().nbytes()));
    });
  }
  const std::string all = labtest::joined(problems);
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

// ---- Step 4: the estimate ------------------------------------------------------------------

TEST(Step4_Estimate, LectureFormula) {
  // GPT-3 175B shapes from the paper: a = 96, h = 12288, s = 2048, b = 1, L = 96
  const double per_layer = 2048.0 * 12288 * (34 + 5.0 * 96 * 2048 / 12288);
  EXPECT_DOUBLE_EQ(lab06::lecture_activation_bytes(96, 2048, 1, 12288, 96), 96 * per_layer);
  EXPECT_DOUBLE_EQ(lab06::lecture_activation_bytes(1, 1, 1, 1, 0), 34);
  EXPECT_DOUBLE_EQ(lab06::lecture_activation_bytes(2, 64, 8, 128, 4), 2.0 * 64 * 8 * 128 * (34 + 5.0 * 4 * 64 / 128));
  // a·s/h = 12·100/768 is no whole number: the formula is real-valued
  const double gpt2_like = lab06::lecture_activation_bytes(1, 100, 1, 768, 12);
  if (gpt2_like != 3211200.0)
    LABTEST_FAIL() << "L=1, s=100, b=1, h=768, a=12 gave " << gpt2_like << " bytes, not 3211200: "
                   << "a·s/h = 1.5625 here, and the formula takes it as it is (doubles throughout)";
}

// The count is arithmetic on the shapes, for the sequence it is given (a batch may be shorter
// than the model's context): it allocates nothing (it builds and runs no model), and at half the
// context it equals the bytes the blocks hold after a forward of that many tokens.
TEST(Step4_Estimate, CountUsesTheSequenceAndAllocatesNothing) {
  const int64_t T = config().block_size / 2;
  for (const char* name : {"none", "every:2", "selective"}) {
    const Plan plan = lab06::make_plan(lab06::parse_policy(name), kLayers);
    std::size_t estimate = 0;
    const AllocatorUse count = allocator_use(
        [&] { estimate = lab06::model_activation_bytes(config(), kBatch, T, plan); });
    if (count.peak != 0) {
      LABTEST_FAIL() << name << ": model_activation_bytes allocated " << count.peak
                     << " bytes: the count is arithmetic on the shapes, it builds and runs nothing";
      return;
    }
    nn::GPT model(config(), {.seed = kSeed});
    lab06::Saved saved;
    const data::Batch half{Tensor::zeros({kBatch, T}, DType::i32),
                           Tensor::zeros({kBatch, T}, DType::i32)};
    lab06::forward(model, half, plan, saved);
    const std::size_t held = lab06::held_activation_bytes(saved);
    if (estimate != held)
      LABTEST_FAIL() << name << ", batches of " << T << " tokens (half the model's context of "
                     << config().block_size << "): your count is " << estimate
                     << " bytes, the blocks hold " << held << ": count with the sequence length "
                     << "you are given";
  }
}

// A GPT-3-size model (96 layers, 96 heads, h = 12288, s = 2048, batch 8, no checkpointing) holds
// about 2.5 TB of activations: the count must not wrap around (32-bit products overflow).
TEST(Step4_Estimate, CountsAGpt3SizeModelWithoutOverflow) {
  ModelConfig c = config();
  c.n_layer = 96;
  c.n_head = 96;
  c.n_embd = 12288;
  c.block_size = 2048;
  const Plan none = lab06::make_plan({Policy::none}, 96);
  const double count = static_cast<double>(lab06::model_activation_bytes(c, 8, 2048, none));
  if (count != 2473926328320.0)
    LABTEST_FAIL() << "96 layers, 96 heads, h = 12288, s = 2048, batch 8, no checkpointing: your "
                   << "count is " << count << " bytes, not 2473926328320 (about 2.5 TB): a "
                   << "product of the shapes overflowed; compute in 64 bits";
  // batch 16 x s 16384: b·s·h alone is 3.2e9, past 32 bits (a product left in int wraps there)
  c.block_size = 16384;
  const double longer = static_cast<double>(lab06::model_activation_bytes(c, 16, 16384, none));
  if (longer != 178121286352896.0)
    LABTEST_FAIL() << "the same model at batch 16, s = 16384: your count is " << longer
                   << " bytes, not 178121286352896: b·s·h = 3.2e9 does not fit in 32 bits; "
                   << "compute every product in 64 bits";
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
