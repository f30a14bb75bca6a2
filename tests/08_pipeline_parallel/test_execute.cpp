// Lab 08 step 4 (and step 6's execution) graders: the schedules run with the stage models on
// p = 1, 2, 4 ranks (one stage per rank) give the single-device step: the loss, and every
// stage's gradients by parameter name (tolerances in pp_test.hpp: 1e-5 / 1e-6, and bitwise
// for m = 1 but the tied wte). What the technique must look like is checked too: each rank
// sends exactly one (B/m, T, C) activation and one gradient per
// micro-batch to its neighbours and nothing else but the mean loss (the library's traffic
// ledger, every communicator, tests/support/traffic_budget.hpp), runs its schedule's actions in
// the schedule's order and holds as many micro-batches as the simulator says for it (both from
// the library's execution log, common/exec_log.hpp: the GPT pieces' calls and the messages as
// the library saw them, never the attendee's ExecStats; with interleaved chunks each message is
// named by its tag, so a chunk's messages sent late, early or to another chunk's neighbour fail
// even when the numbers are right: solutions/08_pipeline_parallel/planted/cheats.plant's
// sends_deferred), and the tied copies
// stay equal over optimizer steps. The stage models are built by the
// test (pp_test.cpp), so this step is graded apart from step 1's build_stage.
// The planted faults run the test's own one-process pipeline (pp_test.cpp) through the same
// gradient check.
#include <gtest/gtest.h>

#include "common/allocator.hpp"
#include "common/comm/stats.hpp"
#include "common/exec_log.hpp"
#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "pipeline_parallel.hpp"
#include "pp_test.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"
#include "tests/support/traffic_budget.hpp"

using namespace scalelab;
using namespace scalelab::lab08;
using pptest::kLab;

namespace {

struct PipelineRun {
  double loss = 0;
  comm::Traffic moved;       // the library's ledger: every communicator
  pptest::Executed executed;  // the library's execution log, never the attendee's ExecStats
};

// One (B/m, T, C) tensor per micro-batch and direction, in the compute dtype (`elem` bytes an
// element: 4 for float32, 2 for bf16 activations in mixed precision).
int64_t message_bytes(int m, int64_t elem = 4) {
  const ModelConfig& c = kLab.config();
  return kLab.global_batch / m * c.block_size * c.n_embd * elem;
}

// What each tag of the run stands for, from the attendee's message_tag (step 2 graded it; a tag
// given to two messages fails here too): with v chunks the log's peers alone do not tell which
// chunk a message is for.
pptest::TagTable tag_table(int m, int v) {
  pptest::TagTable tags;
  for (const bool gradient : {false, true})
    for (int chunk = 0; chunk < v; ++chunk)
      for (int mb = 0; mb < m; ++mb) {
        const int tag = message_tag(gradient ? Flow::gradient : Flow::activation, mb, chunk);
        SCALELAB_CHECK(tags.emplace(tag, pptest::Tagged{gradient, mb, chunk}).second,
                       "message_tag gives {} to two messages", tag);
      }
  return tags;
}

PipelineRun run_pipeline(const std::vector<nn::GPT*>& pieces, const Schedule& schedule, int m,
                         const data::Batch& batch, int64_t elem = 4) {
  comm::Communicator& pp = labtest::world();
  const int v = static_cast<int>(pieces.size());
  PipelineRun r;
  exec_log::Recording recording;
  r.moved = labtest::traffic_of([&] { r.loss = pipeline_step(pieces, schedule, batch, m, pp); });
  r.executed = pptest::executed(recording.events(), pieces, pp, message_bytes(m, elem),
                                v > 1 ? tag_table(m, v) : pptest::TagTable{});
  return r;
}

// Per piece of this rank: m activations to the next piece and m gradients from it, m activations
// from the previous piece and m gradients to it (a piece on this same rank too: interleaving on
// one rank sends to itself); the two ends also exchange one copy of wte (p > 1). Besides these,
// only the mean loss (one collective of at most 8 bytes) may move. Messages carry `elem` bytes an
// element (the compute dtype's); the tied gradients are float32 whatever it is.
testing::AssertionResult exact_pipeline_traffic(const comm::Traffic& moved, int p, int s, int m,
                                                int v, int64_t elem = 4) {
  comm::Communicator& pp = labtest::world();
  const ModelConfig& c = kLab.config();
  const int64_t msg = message_bytes(m, elem), wte = c.vocab_size * c.n_embd * 4;
  labtest::TrafficBudget budget;
  for (int chunk = 0; chunk < v; ++chunk) {
    const Piece n = next_piece(p, v, s, chunk), q = prev_piece(p, v, s, chunk);
    budget.pipeline_piece(pp, n.exists ? n.stage : -1, q.exists ? q.stage : -1, m, msg);
  }
  if (p > 1 && (s == 0 || s == p - 1)) {
    const int other = s == 0 ? p - 1 : 0;
    budget.send(pp, other, 1, wte).recv(pp, other, 1, wte);
  }
  comm::Traffic p2p, loss;
  for (const auto& [key, count] : moved)
    (key.op == "send" || key.op == "recv" ? p2p : loss)[key] = count;
  testing::AssertionResult ok = labtest::exact_traffic(p2p, budget);
  if (!ok)  // named for run_schedule: a message to this rank's own piece goes over pp too
    return testing::AssertionFailure()
           << "run_schedule: each send and receive action of the schedule is one message over "
           << "pp, to and from a piece on this same rank too (p = 1 with v chunks); "
           << ok.message();
  int64_t calls = 0, bytes = 0;
  for (const auto& [key, count] : loss) calls += count.calls, bytes += count.bytes;
  if (calls > 1 || bytes > 8)
    return testing::AssertionFailure()
           << "rank " << s << ": " << calls << " collective call(s) of " << bytes << " bytes "
           << "besides the messages, where only the mean loss moves (one call, at most 8 bytes); "
           << "the collectives: " << labtest::traffic_str(loss);
  return testing::AssertionSuccess();
}

void check_against_single_device(Kind kind, int m, int v) {
  comm::Communicator& pp = labtest::world();
  const int p = pp.size(), s = pp.rank();
  const data::Batch batch = kLab.batch(0);
  double want_loss = 0;
  auto ref = pptest::reference_model(batch, &want_loss);
  auto pieces = pptest::pieces_of(p, v, s);
  const std::vector<nn::GPT*> mine = pptest::raw(pieces);
  // a failure names the first tensor off the twin (of this stage's first chunk: every row)
  labtest::Explain why(*mine.front(), {.seed = kLab.seed});
  // AFAB and 1F1B: the test's own schedules (pp_test.cpp), so step 4 does not need step 3
  const auto schedule_of = [&](int stage) {
    return kind == Kind::interleaved ? schedule_interleaved(p, m, v, stage)
                                     : pptest::test_schedule(kind == Kind::afab, p, m, stage);
  };
  const Schedule schedule = schedule_of(s);
  // Gradients left over from an earlier step in every piece: pipeline_step starts from zero in
  // every chunk it is given, not only the first (fresh pieces would hide a chunk never zeroed:
  // planted zero_grad_first_chunk_only, which trains wrong from the second step on).
  for (nn::GPT* piece : mine) ops::fill(piece->params().grads(), 1.0);
  const PipelineRun r = run_pipeline(mine, schedule, m, batch);
  why.step_done(batch);  // the tied copies summed
  const std::string what = fmt::format("{} p {} m {} v {}", kind_name(kind), p, m, v);
  EXPECT_NEAR(r.loss, want_loss, 1e-6 * want_loss) << what << ": the loss, on every rank";
  EXPECT_TRUE(labtest::on_every_rank(pptest::grads_match(mine, *ref, m == 1), why)) << what;
  EXPECT_TRUE(exact_pipeline_traffic(r.moved, p, s, m, v))
      << what << ", stage " << s << " (the library's traffic ledger)";
  // What ran, from the library's own log: the schedule's actions, messages included, in its
  // order (with chunks: each message named by its tag and its peer, the chunk's neighbour), and
  // as many micro-batches in flight as the simulator says for it.
  EXPECT_TRUE(pptest::ran(r.executed, schedule, /*with_messages=*/true)) << what;
  std::vector<Schedule> all;
  for (int x = 0; x < p; ++x) all.push_back(schedule_of(x));
  const SimResult sim = simulate(all, m, v);  // its figures exist only for a run that finished
  if (!sim.errors.empty() || sim.deadlock)
    ADD_FAILURE() << what << ": the schedules do not run in the simulator: "
                  << (sim.errors.empty() ? sim.report : sim.errors.front());
  else
    EXPECT_EQ(r.executed.max_in_flight, sim.max_in_flight[s])
        << what << " stage " << s << ": micro-batches in flight (the library's execution log)";
}

}  // namespace

// ---- Step 4 -------------------------------------------------------------------------------------

TEST(Step4_Execute, AfabEqualsSingleDevice) {
  for (int m : {1, 2, 8}) check_against_single_device(Kind::afab, m, 1);
}

TEST(Step4_Execute, OneFOneBEqualsSingleDevice) {
  for (int m : {1, 2, 8}) check_against_single_device(Kind::one_f_one_b, m, 1);
}

// Mixed precision (bf16 compute, f32 master weights and gradients): the activations and their
// gradients are bf16, so each message is the compute dtype's, half an f32 one's bytes, and a
// receive of another dtype fails on the message's size (planted: receives_f32; the program's
// bf16 run, tests/common/bf16.cmake, runs the reference only). The loss against the bf16 twin
// on the whole batch: bf16 rounding in another grouping of the rows, within 1e-3 relative.
TEST(Step4_Execute, Bf16ComputeSendsBf16Messages) {
  comm::Communicator& pp = labtest::world();
  const int p = pp.size(), s = pp.rank();
  constexpr int kM = 2;
  const data::Batch batch = kLab.batch(0);
  nn::GPT twin(kLab.config(), {.seed = kLab.seed, .compute_dtype = DType::bf16});
  nn::GPTActivations acts;
  const double want_loss = twin.forward(batch.x, batch.y, acts);
  const auto [first, last] = pptest::blocks_of(static_cast<int>(kLab.config().n_layer), p, s);
  nn::GPT piece(kLab.config(), {.seed = kLab.seed, .first_block = first, .last_block = last,
                                .compute_dtype = DType::bf16});
  const Schedule schedule = pptest::test_schedule(false, p, kM, s);
  const PipelineRun r = run_pipeline({&piece}, schedule, kM, batch, /*elem=*/2);
  const std::string what = fmt::format("1f1b, bf16 compute, p {} m {}", p, kM);
  EXPECT_NEAR(r.loss, want_loss, 1e-3 * want_loss) << what << ": the loss, on every rank";
  EXPECT_TRUE(exact_pipeline_traffic(r.moved, p, s, kM, 1, 2))
      << what << ", stage " << s << " (the library's traffic ledger): a message is in the "
      << "dtype the pieces compute in";
}

// 1F1B at m = 2 with this stage's piece on the simulated GPU (tests/support/on_sim.hpp) and the
// batch on the host, as the sampler leaves it: the host's loss and gradients bit for bit. A
// micro-batch's tokens not moved to the piece's device, or a loop over a tensor's elements, stop
// there as they would on a GPU.
TEST(Step4_Execute, RunsOnTheSimulatedGpuAsOnTheHost) {
  comm::Communicator& pp = labtest::world();
  const int p = pp.size(), s = pp.rank();
  constexpr int kM = 2;
  const data::Batch batch = kLab.batch(0);
  const Schedule schedule = pptest::test_schedule(false, p, kM, s);
  const auto host = pptest::pieces_of(p, 1, s);
  const double want = pipeline_step(pptest::raw(host), schedule, batch, kM, pp);
  const auto sim = pptest::pieces_of(p, 1, s, Device::sim());
  std::vector<std::string> problems;
  labtest::collective_run_on_sim([&] {
    const double got = pipeline_step(pptest::raw(sim), schedule, batch, kM, pp);
    problems.push_back(labtest::step_same_on_sim("", want, got, "this stage's gradients",
                                                 host.front()->params().grads(),
                                                 sim.front()->params().grads()));
  });
  const std::string all = labtest::joined(problems);
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}

TEST(Step4_Execute, SgdStepsKeepTheTiedCopiesEqualAndFollowTheTwin) {
  // Three SGD steps (lr 0.5: rounding differences stay as small as they start, unlike AdamW's):
  // every stage's parameters equal the single-device model's (1e-5 / 1e-6), and the first
  // stage's wte equals the last stage's lm_head.weight bitwise (same sums, same updates).
  comm::Communicator& pp = labtest::world();
  const int p = pp.size(), s = pp.rank();
  constexpr double kLr = 0.5;
  auto pieces = pptest::pieces_of(p, 1, s);
  const std::vector<nn::GPT*> mine = pptest::raw(pieces);
  nn::GPT twin(kLab.config(), {.seed = kLab.seed});
  optim::SGD sgd(optim::groups(mine[0]->parameters())), sgd1(optim::groups(twin.parameters()));
  const data::Sampler sampler = kLab.sampler();
  for (int step = 0; step < 3; ++step) {
    const data::Batch b = sampler.batch(step);
    pipeline_step(mine, pptest::test_schedule(false, p, 4, s), b, 4, pp);
    sgd.step(kLr);
    twin.zero_grad();
    twin.forward(b.x, b.y);
    twin.backward();
    sgd1.step(kLr);
  }
  testing::AssertionResult ok = testing::AssertionSuccess();
  for (nn::Parameter* x : mine[0]->parameters()) {
    const std::string name = x->name == "lm_head.weight" ? "wte.weight" : x->name;
    const train::Diff d = train::compare(x->value, twin.params().get(name).value);
    if (!d.within(pptest::kRtol, pptest::kAtol)) {
      ok = testing::AssertionFailure() << x->name << " after 3 SGD steps: " << d.str();
      break;
    }
  }
  EXPECT_TRUE(pptest::on_every_rank(ok));
  if (p > 1) {  // the last stage sends its lm_head.weight to the first stage
    const ModelConfig& c = kLab.config();
    Tensor head = Tensor::empty({c.vocab_size, c.n_embd});
    if (s == p - 1) pp.send(mine[0]->params().get("lm_head.weight").value, 0, 77);
    if (s == 0) {
      pp.recv(head, p - 1, 77);
      EXPECT_TRUE(labtest::bitwise(mine[0]->params().get("wte.weight").value, head))
          << "the two copies of the tied embedding drifted apart";
    }
  }
}

// "A micro-batch's tensors are released as soon as they are used" (the Goal): under 1F1B a
// stage holds its min(p - s, m) micro-batches whatever m. Measured by the grader around the real
// run (the allocator's peak), in the window of step 5's memory check. At m = 32 micro-batches of
// one row, a stage that keeps each received activation or gradient until the step ends holds 31
// messages more, above that window (planted: lab08.planted.received_kept); at m = 8 it would
// still fit.
TEST(Step4_Memory, OneFOneBHoldsItsMicroBatchesWhateverM) {
  comm::Communicator& pp = labtest::world();
  const int p = pp.size(), s = pp.rank();
  constexpr int kM = 32;
  constexpr labtest::Setup kRows{.seed = kLab.seed, .global_batch = kM,
                                 .corpus_seed = kLab.corpus_seed, .n_layer = kLab.n_layer};
  auto pieces = pptest::pieces_of(p, 1, s);
  const std::vector<data::Batch> micro = pptest::split(kRows.batch(0), kM);
  const Schedule schedule = pptest::test_schedule(false, p, kM, s);
  // see Step5_Memory: nothing an earlier test sent is freed during the measurement
  pp.barrier();
  const pptest::MemoryBounds b = pptest::bounds(*pieces[0], micro);
  pp.barrier();
  reset_peak_memory(Device::cpu());
  const std::size_t before = memory_stats(Device::cpu()).current;
  run_schedule(pptest::raw(pieces), schedule, micro, pp);
  const std::size_t peak = memory_stats(Device::cpu()).peak - before;
  const int k = std::min(p - s, kM);
  testing::AssertionResult ok =
      b.holds(peak, k, fmt::format("run_schedule, 1F1B stage {} of {}, m {}", s, p, kM));
  if (!ok)
    ok << "; a stage holds its micro-batches in flight and nothing else: each received, sent "
          "or kept tensor is let go once its action has used it";
  EXPECT_TRUE(pptest::on_every_rank(ok));
}

TEST(Step4_Execute, BadMicroBatchCountsAreUsageErrors) {
  comm::Communicator& pp = labtest::world();
  auto pieces = pptest::pieces_of(pp.size(), 1, pp.rank());
  const Schedule sched = pptest::test_schedule(true, pp.size(), 2, pp.rank());
  EXPECT_THROW(pipeline_step(pptest::raw(pieces), sched, kLab.batch(0), 3, pp), UsageError)
      << "8 rows into 3 micro-batches";
  EXPECT_THROW(pipeline_step(pptest::raw(pieces), sched, kLab.batch(0), 0, pp), UsageError) << "m 0";
}

// The planted faults: the same gradient check on the test's one-process pipeline of 2 stages.
namespace {

testing::AssertionResult local_check(int p, const pptest::LocalFaults& faults) {
  const data::Batch batch = kLab.batch(0);
  auto ref = pptest::reference_model(batch);
  std::vector<std::unique_ptr<nn::GPT>> stages;
  std::vector<nn::GPT*> ptrs;
  for (int s = 0; s < p; ++s) {
    const auto [first, last] = pptest::blocks_of(static_cast<int>(kLab.config().n_layer), p, s);
    stages.push_back(std::make_unique<nn::GPT>(
        kLab.config(), nn::GPTOptions{.seed = kLab.seed, .first_block = first, .last_block = last}));
    ptrs.push_back(stages.back().get());
  }
  pptest::local_pipeline(ptrs, pptest::split(batch, 4), faults);
  return pptest::grads_match(ptrs, *ref);
}

}  // namespace

TEST(Step4_PlantedFault, TheOneProcessPipelinePassesWithoutAFault) {
  EXPECT_TRUE(local_check(2, {})) << "so the failures below come from the faults";
}

TEST(Step4_PlantedFault, GradientsNotAccumulatedIsCaught) {
  EXPECT_FALSE(local_check(2, {.zero_grad_each_micro_batch = true}))
      << "the gradient check must fail when only the last micro-batch's gradient is kept";
}

TEST(Step4_PlantedFault, TiedGradientNotSummedIsCaught) {
  EXPECT_FALSE(local_check(2, {.skip_tied_sum = true}))
      << "the gradient check must fail when wte and lm_head.weight keep half the gradient each";
}

TEST(Step4_PlantedFault, WrongMicroBatchReceivedIsCaught) {
  EXPECT_FALSE(local_check(2, {.wrong_micro_batch = true}))
      << "the gradient check must fail when a stage computes on another micro-batch's input";
}

// An executor that runs AFAB whatever its schedule says (and may report what the schedule
// promises in its ExecStats): the numbers are right, the order and the memory are not. Run here
// on one stage alone (pp_test.cpp's local_stage_peak runs a schedule's forwards and backwards
// for real), the library's log shows what ran.
namespace {

testing::AssertionResult order_and_in_flight(const Schedule& run, const Schedule& promised, int p,
                                             int m, int stage, nn::GPT& piece,
                                             const std::vector<data::Batch>& micro) {
  exec_log::Recording recording;
  pptest::local_stage_peak(piece, run, micro);
  const pptest::Executed e = pptest::executed(recording.events(), {&piece}, labtest::world(), 0);
  if (auto ok = pptest::ran(e, promised, /*with_messages=*/false); !ok) return ok;
  std::vector<Schedule> all;
  for (int x = 0; x < p; ++x) all.push_back(pptest::test_schedule(false, p, m, x));
  if (e.max_in_flight != simulate(all, m).max_in_flight[stage])
    return testing::AssertionFailure() << e.max_in_flight << " micro-batches in flight";
  return testing::AssertionSuccess();
}

}  // namespace

TEST(Step4_PlantedFault, AnExecutorIgnoringItsScheduleIsCaught) {
  constexpr int kP = 4, kM = 8, kStage = 1;
  const std::vector<data::Batch> micro = pptest::split(kLab.batch(0), kM);
  const auto [first, last] = pptest::blocks_of(4, kP, kStage);
  nn::GPT stage(kLab.config(), {.seed = kLab.seed, .first_block = first, .last_block = last});
  const Schedule ofob = pptest::test_schedule(false, kP, kM, kStage),
                 afab = pptest::test_schedule(true, kP, kM, kStage);
  EXPECT_TRUE(order_and_in_flight(ofob, ofob, kP, kM, kStage, stage, micro))
      << "the base: 1F1B run as 1F1B passes";
  EXPECT_FALSE(order_and_in_flight(afab, ofob, kP, kM, kStage, stage, micro))
      << "the check of Step4_Execute must fail when AFAB runs in place of 1F1B";
}

// ---- Step 6 (interleaved, executed) -------------------------------------------------------------

TEST(Step6_Execute, InterleavedEqualsSingleDevice) {
  // 4 layers: v = 2 and 4 chunks on 1 rank, v = 2 on 2 ranks, v = 1 on 4 ranks
  const int p = labtest::world().size();
  for (int v = 2; v * p <= 4; v *= 2)
    for (int m : {p, 2 * p, 8}) check_against_single_device(Kind::interleaved, m, v);
  if (p == 4) check_against_single_device(Kind::interleaved, 4, 1);  // 4 layers: 1 chunk each
}
