// Lab 08 step 1 graders: the stage split, each stage's model, the tied embedding's gradients.
// A stage must hold exactly its blocks with the single-device values (bitwise: every parameter
// is drawn from (seed, name)); the tied copies' gradients are checked after the exchange
// (a + b on both ends: bitwise equal to each other), with the bytes the exchange moved.
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "common/comm/stats.hpp"
#include "common/errors.hpp"
#include "common/exec_log.hpp"
#include "common/ops/ops.hpp"
#include "pipeline_parallel.hpp"
#include "pp_test.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"
#include "tests/support/traffic_budget.hpp"

using namespace scalelab;
using pptest::kLab;

TEST(Step1_StageLayers, BalancedByLayerCount) {
  struct Case {
    int L, p;
    std::vector<int> sizes;
  };
  for (const Case& c : {Case{10, 4, {3, 3, 2, 2}}, Case{4, 4, {1, 1, 1, 1}}, Case{4, 1, {4}},
                        Case{5, 2, {3, 2}}, Case{12, 5, {3, 3, 2, 2, 2}}, Case{3, 3, {1, 1, 1}}}) {
    int next = 0;
    for (int s = 0; s < c.p; ++s) {
      const lab08::LayerRange r = lab08::stage_layers(c.L, c.p, s);
      EXPECT_EQ(r.first, next) << c.L << " layers, " << c.p << " stages: stage " << s
                               << " starts where the previous one ended";
      EXPECT_EQ(r.size(), c.sizes[s]) << c.L << " layers, " << c.p << " stages: stage " << s;
      next = r.last;
    }
    EXPECT_EQ(next, c.L) << "the stages cover every layer";
  }
}

TEST(Step1_StageLayers, BadSplitsAreUsageErrors) {
  EXPECT_THROW(lab08::stage_layers(4, 5, 0), UsageError) << "more stages than layers";
  EXPECT_THROW(lab08::stage_layers(4, 0, 0), UsageError) << "no stage";
  EXPECT_THROW(lab08::stage_layers(4, 2, 2), UsageError) << "stage out of range";
  EXPECT_THROW(lab08::stage_layers(4, 2, -1), UsageError) << "stage out of range";
}

TEST(Step1_BuildStage, HoldsItsBlocksWithTheSingleDeviceValues) {
  const ModelConfig& cfg = kLab.config();
  nn::GPT whole(cfg, {.seed = kLab.seed});
  for (int p : {1, 2, 4}) {
    int64_t total = 0;
    for (int s = 0; s < p; ++s) {
      auto stage = lab08::build_stage(cfg, p, s, {.seed = kLab.seed});
      const auto [first, last] = pptest::blocks_of(static_cast<int>(cfg.n_layer), p, s);
      EXPECT_EQ(stage->first_block(), first) << "p " << p << " stage " << s;
      EXPECT_EQ(stage->last_block(), last) << "p " << p << " stage " << s;
      EXPECT_EQ(stage->has_embedding(), s == 0) << "the embedding lives on the first stage only";
      EXPECT_EQ(stage->has_head(), s == p - 1) << "ln_f and the head live on the last stage only";
      total += stage->num_parameters();
      for (nn::Parameter* x : stage->parameters()) {
        const std::string name = x->name == "lm_head.weight" ? "wte.weight" : x->name;
        EXPECT_TRUE(labtest::bitwise(x->value, whole.params().get(name).value))
            << "p " << p << " stage " << s << ": " << x->name << " is not the single-device "
            << name;
      }
    }
    const int64_t head_copy = p > 1 ? cfg.vocab_size * cfg.n_embd : 0;
    EXPECT_EQ(total, whole.num_parameters() + head_copy)
        << "p " << p << ": the stages hold the model once (plus the last stage's copy of wte)";
  }
}

namespace {

// Known gradients for the two tied copies: the embedding's use gets 1 + i * 1e-3, the head's
// 2 - i (i cycling over 97 values), and want = their sum, as the single device accumulates it.
struct TiedParts {
  Tensor emb, head, want;
};
TiedParts tied_parts() {
  const ModelConfig& cfg = kLab.config();
  auto pattern = [](int64_t n, double a, double b) {
    std::vector<double> v(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = a + b * static_cast<double>(i % 97);
    return v;
  };
  const int64_t n = cfg.vocab_size * cfg.n_embd;
  const std::vector<int64_t> shape = {cfg.vocab_size, cfg.n_embd};
  TiedParts t{Tensor::from_vector(pattern(n, 1.0, 1e-3), shape),
              Tensor::from_vector(pattern(n, 2.0, -1.0), shape), Tensor()};
  t.want = t.emb.clone();
  ops::axpy(t.want, 1.0, t.head);
  return t;
}

int64_t wte_bytes() { return kLab.config().vocab_size * kLab.config().n_embd * 4; }

}  // namespace

TEST(Step1_TiedEmbedding, BothCopiesGetTheSumOfBothGradients) {
  comm::Communicator& pp = labtest::world();
  const int p = pp.size(), s = pp.rank();
  auto stage = lab08::build_stage(kLab.config(), p, s, {.seed = kLab.seed});
  const TiedParts parts = tied_parts();
  stage->zero_grad();
  if (p > 1 && s == 0) stage->params().get("wte.weight").grad.copy_from(parts.emb);
  if (p > 1 && s == p - 1) stage->params().get("lm_head.weight").grad.copy_from(parts.head);
  if (p == 1)  // one model: wte is one tensor, summed already
    stage->params().get("wte.weight").grad.copy_from(parts.want);
  const Tensor before = stage->params().grads().clone();
  const comm::Traffic moved = labtest::traffic_of([&] { lab08::sync_tied_gradients({stage.get()}, pp); });
  testing::AssertionResult ok = testing::AssertionSuccess();
  if (s == 0 || s == p - 1) {
    const char* name = s == 0 ? "wte.weight" : "lm_head.weight";
    ok = labtest::bitwise(stage->params().get(name).grad, parts.want);
    if (!ok) ok << " (" << name << " on stage " << s << " must hold the sum of both uses)";
  } else {
    ok = labtest::bitwise(stage->params().grads(), before);
    if (!ok) ok << " (a middle stage holds no tied copy: its gradients stay as they were)";
  }
  EXPECT_TRUE(pptest::on_every_rank(ok));
  labtest::TrafficBudget budget;  // only the two ends exchange, one copy of wte each way
  if (p > 1 && (s == 0 || s == p - 1)) {
    const int other = s == 0 ? p - 1 : 0;
    budget.send(pp, other, 1, wte_bytes()).recv(pp, other, 1, wte_bytes());
  }
  EXPECT_TRUE(labtest::exact_traffic(moved, budget)) << "stage " << s << " of " << p;
}

// The same exchange with the stage built on the simulated GPU (tests/support/on_sim.hpp): the
// host's tied gradients bit for bit. A receive buffer made without the gradient's device, or an
// add by a loop over elements, stops there (the first such line ends the job: the ends and the
// middle stages run different code).
TEST(Step1_TiedEmbedding, RunsOnTheSimulatedGpuAsOnTheHost) {
  comm::Communicator& pp = labtest::world();
  const int p = pp.size(), s = pp.rank();
  const TiedParts parts = tied_parts();
  const auto exchange = [&](Device device) {
    auto stage = lab08::build_stage(kLab.config(), p, s, {.device = device, .seed = kLab.seed});
    stage->zero_grad();
    if (p > 1 && s == 0) stage->params().get("wte.weight").grad.copy_from(parts.emb);
    if (p > 1 && s == p - 1) stage->params().get("lm_head.weight").grad.copy_from(parts.head);
    if (p == 1) stage->params().get("wte.weight").grad.copy_from(parts.want);
    lab08::sync_tied_gradients({stage.get()}, pp);
    return stage->params().grads().clone();
  };
  const Tensor want = exchange(Device::cpu());
  std::string same;
  labtest::collective_run_on_sim(
      [&] { same = labtest::same_on_sim("this stage's gradients", want, exchange(Device::sim())); });
  if (!same.empty()) LABTEST_FAIL() << same;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

// A send reads its buffer until it is done: an end that adds the other's copy into its own
// gradient before its own send has completed sends the sum (or part of it) instead of its own.
// The race shows only when the message leaves after the add: the test plays one end itself, with
// a wte of 256 KiB (above MPI's eager limit: the bytes stay in the sender's buffer until the
// receive is posted), sends its copy at once and posts its receive 300 ms after its send is
// done; the attendee's end must send its own gradient. The test's end uses the tags the
// attendee's exchange used (learned from the library's log of a first exchange). An end that
// sends before it receives (blocking, ordered) is right too: the test's end then receives after
// 1 s instead (planted: tied_add_before_send_done).
TEST(Step1_TiedEmbedding, EachEndSendsItsOwnGradientNotTheSum) {
  comm::Communicator& pp = labtest::world();
  const int p = pp.size(), s = pp.rank();
  if (p == 1) return;  // one model: nothing to exchange
  ModelConfig big = kLab.config();
  big.vocab_size = 2048;  // wte (2048, 32) floats: 256 KiB
  const auto [first, last] = pptest::blocks_of(static_cast<int>(big.n_layer), p, s);
  nn::GPT piece(big, {.seed = kLab.seed, .first_block = first, .last_block = last});
  const bool end = s == 0 || s == p - 1;
  const int other = s == 0 ? p - 1 : 0;
  const char* name = s == 0 ? "wte.weight" : "lm_head.weight";
  const double own = s == 0 ? 1.0 : 2.0;  // the two ends' gradients; their sum is 3
  const auto set_own = [&] {
    piece.zero_grad();
    if (end) ops::fill(piece.params().get(name).grad, own);
  };
  // The attendee's tags, both ways (this end's send and receive), from a first exchange.
  set_own();
  int send_tag = -1, recv_tag = -1;
  {
    exec_log::Recording recording;
    lab08::sync_tied_gradients({&piece}, pp);
    for (const exec_log::Event& ev : recording.events()) {
      if (ev.group != pp.name() || ev.object != nullptr) continue;
      if (ev.what == "send") send_tag = ev.tag;
      if (ev.what == "recv") recv_tag = ev.tag;
    }
  }
  testing::AssertionResult ok = testing::AssertionSuccess();
  if (end && (send_tag < 0 || recv_tag < 0))
    ok = testing::AssertionFailure() << "stage " << s << " did not both send and receive its "
                                     << "copy of the tied embedding's gradient";
  const int tags_ok = pptest::on_every_rank(ok) ? 1 : 0;
  for (const int played : {p - 1, 0}) {  // the end the test plays; the other is the attendee's
    if (!tags_ok) break;
    set_own();
    if (s == played) {
      const Tensor mine = piece.params().get(name).grad.clone();
      Tensor theirs = Tensor::empty(mine.shape());
      comm::Work sent = pp.send_async(mine, other, send_tag);
      const auto t0 = std::chrono::steady_clock::now();
      while (!sent.test() &&
             std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      pp.recv(theirs, other, recv_tag);
      sent.wait();
      Tensor want = Tensor::empty(mine.shape());
      ops::fill(want, other == 0 ? 1.0 : 2.0);
      testing::AssertionResult got = labtest::bitwise(theirs, want);
      if (!got && ok)
        ok = testing::AssertionFailure()
             << "stage " << other << " sent a copy of its tied gradient that is not its own ("
             << got.message() << "): it changed the tensor it was sending before that send was "
             << "done (the receiving end posted its receive late); a send reads its buffer "
             << "until its Work completes";
    } else if (end) {
      lab08::sync_tied_gradients({&piece}, pp);
      Tensor want = Tensor::empty(piece.params().get(name).grad.shape());
      ops::fill(want, 3.0);
      testing::AssertionResult got = labtest::bitwise(piece.params().get(name).grad, want);
      if (!got && ok) ok = got << " (" << name << " on stage " << s << ": the sum of both uses)";
    }
  }
  EXPECT_TRUE(pptest::on_every_rank(ok));
}

TEST(Step1_TiedEmbedding, OneRankHoldingBothEndsSumsThemWithoutMessages) {
  // Interleaving on one rank (step 6 with p = 1, v = 2): the rank's two pieces are the
  // embedding's (blocks 0-1, chunk 0) and the head's (blocks 2-3, chunk 1), each with its copy
  // of wte. Both copies must end with a + b, bitwise equal, and nothing goes over the wire. Each
  // rank checks this alone, in a group of one.
  comm::Communicator alone = labtest::world().split(labtest::world().rank(), 0, "alone");
  const int L = static_cast<int>(kLab.config().n_layer);
  nn::GPT emb(kLab.config(), {.seed = kLab.seed, .first_block = 0, .last_block = L / 2});
  nn::GPT head(kLab.config(), {.seed = kLab.seed, .first_block = L / 2, .last_block = L});
  ASSERT_TRUE(emb.has_embedding() && !emb.has_head());
  ASSERT_TRUE(head.has_head() && !head.has_embedding());
  const TiedParts parts = tied_parts();
  emb.zero_grad();
  head.zero_grad();
  emb.params().get("wte.weight").grad.copy_from(parts.emb);
  head.params().get("lm_head.weight").grad.copy_from(parts.head);
  const comm::Traffic moved = labtest::traffic_of([&] { lab08::sync_tied_gradients({&emb, &head}, alone); });
  testing::AssertionResult ok = labtest::bitwise(emb.params().get("wte.weight").grad, parts.want);
  if (!ok) ok << " (wte.weight of the rank's embedding piece must hold the sum of both uses)";
  testing::AssertionResult ok_head =
      labtest::bitwise(head.params().get("lm_head.weight").grad, parts.want);
  if (!ok_head) ok_head << " (lm_head.weight of the rank's head piece must hold the same sum)";
  EXPECT_TRUE(pptest::on_every_rank(ok));
  EXPECT_TRUE(pptest::on_every_rank(ok_head));
  EXPECT_TRUE(labtest::exact_traffic(moved, labtest::TrafficBudget{}))
      << "both ends on one rank: the sum needs no message";
}
