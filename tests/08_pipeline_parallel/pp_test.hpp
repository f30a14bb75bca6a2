#pragma once
// What lab 08's graders share: the setup, the single-device reference by parameter name, the
// check that a stage's gradients are the single-device ones, and a pipeline run IN ONE PROCESS
// (every stage model here, no messages) written in the test, so the planted faults can break it
// without calling the attendee's code. Nothing here uses lab08's functions except the types of
// schedule.hpp (given).
//
// Tolerances (stated once, used by every step):
//  - m micro-batches against the whole batch: the same terms summed in another grouping (each
//    matmul sums over B/m rows, then the micro-batches add up), and the tied embedding's two
//    halves added in another order: 1e-5 relative / 1e-6 absolute per element (float32).
//  - m = 1: the same kernels on the same rows in the same order, so every parameter but the tied
//    wte is bitwise the single-device one; wte is (head + embedding) vs (embedding + head)
//    accumulated token by token: 1e-5 / 1e-6.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/comm/communicator.hpp"
#include "common/data/sampler.hpp"
#include "common/exec_log.hpp"
#include "common/nn/gpt.hpp"
#include "common/train/equivalence.hpp"
#include "schedule.hpp"
#include "tests/support/lab_fixture.hpp"

namespace scalelab::pptest {

/// 4 layers (stages of 1, 2 or 4 blocks), a global batch of 8 rows of 16 tokens.
inline constexpr labtest::Setup kLab{.seed = 808, .global_batch = 8, .corpus_seed = 8,
                                     .n_layer = 4};
inline constexpr double kRtol = 1e-5, kAtol = 1e-6;

/// The single-device model after one forward + backward of `batch` (its loss in *loss).
std::unique_ptr<nn::GPT> reference_model(const data::Batch& batch, double* loss = nullptr);

/// m equal row slices of `batch` (views).
std::vector<data::Batch> split(const data::Batch& batch, int m);

/// The test's own stage rule (stage s of p over L layers: L/p each, the first L%p one more).
std::pair<int, int> blocks_of(int n_layer, int p, int stage);

/// The test's own model pieces for stage s of p: one GPT with blocks_of(...) when v == 1, else
/// the v chunk models of piece vs = chunk * p + s (L / (p v) blocks each). Built here, not by
/// the attendee's step 1 or 6, so later steps are graded on their own. On `device`.
std::vector<std::unique_ptr<nn::GPT>> pieces_of(int p, int v, int stage,
                                                Device device = Device::cpu());
std::vector<nn::GPT*> raw(const std::vector<std::unique_ptr<nn::GPT>>& pieces);

/// The test's own AFAB (warmup < 0) or 1F1B schedule with a warm-up of
/// min(p - stage - 1 + extra_warmup, m) forwards: what steps 4 and 5 run, so they are graded
/// apart from step 3; extra_warmup = 1 is the planted "warm-up one too long".
lab08::Schedule test_schedule(bool afab, int p, int m, int stage, int extra_warmup = 0);

/// Every gradient `pieces` hold equals the reference's parameter of the same name
/// (lm_head.weight is the head's copy of wte.weight); `bitwise_except_tied`: all but the tied
/// copies must be identical. This rank only.
testing::AssertionResult grads_match(const std::vector<nn::GPT*>& pieces, nn::GPT& reference,
                                     bool bitwise_except_tied = false);

/// `ok` on every rank of the world (collective); the failing ranks' own messages, on every rank
/// (labtest::on_every_rank).
testing::AssertionResult on_every_rank(const testing::AssertionResult& ok);

/// A pipeline in one process: stages[s] is stage s's model; AFAB order, every micro-batch through
/// every stage. The faults a planted test can switch on:
struct LocalFaults {
  bool zero_grad_each_micro_batch = false;  ///< gradients not accumulated over micro-batches
  bool skip_tied_sum = false;               ///< wte / lm_head gradients not summed
  bool wrong_micro_batch = false;           ///< stage 1 receives micro-batch (i + 1) % m's input
};
double local_pipeline(const std::vector<nn::GPT*>& stages, const std::vector<data::Batch>& micro,
                      const LocalFaults& faults = {});

/// One stage's share of a schedule run alone, in one process: receives are random tensors of
/// the right shape, sends are dropped; forwards and backwards are real. Returns the allocator's
/// peak above the start: what that stage holds under that schedule.
std::size_t local_stage_peak(nn::GPT& stage_model, const lab08::Schedule& schedule,
                             const std::vector<data::Batch>& micro);

/// Bytes of one micro-batch's activations on this stage (a GPTActivations after one forward).
std::size_t one_micro_batch_bytes(nn::GPT& stage_model, const data::Batch& micro);

/// The activation memory a stage holds, in micro-batches: A = one micro-batch's activations on
/// this stage (one_micro_batch_bytes), P1 = the peak of one micro-batch's forward + backward (A
/// plus backward's temporaries). A schedule that holds k micro-batches peaks near P1 + (k - 1) A;
/// holds() allows half an A either way (messages in flight).
struct MemoryBounds {
  double a = 0, p1 = 0;
  /// `peak` is between (k - 1/2) A + (P1 - A) and (k + 1/2) A + (P1 - A); else what it is.
  testing::AssertionResult holds(std::size_t peak, int k, const std::string& what) const;
  /// What the heap holds beside k micro-batches' tensors: each Tensor's shape and storage
  /// records and the allocator's rounding (measured: 0.09 A to 0.14 A per micro-batch held, on 1,
  /// 2 and 4 ranks), the execution log's records: a quarter of an A and a fifth per micro-batch.
  int64_t bookkeeping(int k) const { return static_cast<int64_t>(a / 4 + k * a / 5); }
};
/// A and P1 of `stage_model` on micro-batches shaped like micro[0] (run alone, in one process).
MemoryBounds bounds(nn::GPT& stage_model, const std::vector<data::Batch>& micro);

/// What a run REALLY executed on this rank, read from the library's execution log
/// (common/exec_log.hpp: the GPT pieces' calls and the communicators' operations, recorded
/// by the library itself), never from the attendee's ExecStats.
struct Executed {
  /// The forwards (forward_blocks) and backwards (backward_blocks) of each piece in `chunks`, in
  /// order: the k-th forward of a chunk is its micro-batch k (every schedule runs a chunk's
  /// micro-batches in order), as compute_order prints them.
  std::string compute;
  /// Every action, the messages too, as to_string(Schedule) prints them; other messages (the
  /// tied embedding's exchange) are not actions. A send or receive of one micro-batch's
  /// (B/m, T, C) message on `pp`:
  ///  - one chunk per rank (no `tags`): to or from the next stage is sA / rG, to or from the
  ///    previous one sG / rA, the k-th of each kind micro-batch k;
  ///  - with `tags` (interleaved: with v chunks the neighbours alone do not say which chunk a
  ///    message is for): the tag names the flow, the micro-batch and the receiving chunk, and the
  ///    peer must be that chunk's neighbour piece (next_piece / prev_piece): sA3.1 is this rank's
  ///    chunk 1 sending micro-batch 3's activation to the piece after it. A message with a tag
  ///    not in `tags`, or to or from a rank that is not its piece's neighbour, shows as
  ///    "send?tag 17 peer 1".
  std::string actions;
  /// Most micro-batches forwarded and not yet backwarded at once, over every chunk.
  int max_in_flight = 0;
  /// Piece calls on a model that is not one of `chunks` (the run computed elsewhere).
  int stray_calls = 0;
  /// The first forward or backward (as in `compute`) that came after a wait on a send over `pp`
  /// (the library logs each Work::wait, never a test()): "" when every send was waited for only
  /// after the last compute. A stage that waits for its sends before computing has no overlap.
  std::string after_send_wait;
};
/// What a message's tag stands for (the caller builds the table from lab 08's message_tag, for
/// every flow, micro-batch and chunk of the run): the RECEIVING piece's chunk.
struct Tagged {
  bool gradient = false;
  int mb = 0, chunk = 0;
};
using TagTable = std::map<int, Tagged>;

Executed executed(const std::vector<exec_log::Event>& log, const std::vector<nn::GPT*>& chunks,
                  const comm::Communicator& pp, int64_t message_bytes, const TagTable& tags = {});

/// The run executed `schedule`: its compute order, and `with_messages` its every action (with
/// more than one chunk: from a log read with tags), in the schedule's order, and no wait on a
/// send before a compute; a failure shows both, this rank named.
testing::AssertionResult ran(const Executed& e, const lab08::Schedule& schedule, bool with_messages);

}  // namespace scalelab::pptest
