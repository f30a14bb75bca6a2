#pragma once
/// @file pipeline_parallel.hpp
/// Lab 08 contract: pipeline parallelism. The model's layers are cut into p consecutive STAGES,
/// one per rank of a pipeline group; a batch is cut into m MICRO-BATCHES that flow through the
/// stages: activations go forward over point-to-point messages, gradients come back. A SCHEDULE
/// says in which order each stage runs its forwards and backwards:
///
///   AFAB (GPipe)   all forwards, then all backwards: every stage holds m micro-batches
///   1F1B           each backward as early as possible: stage s holds at most p - s
///                  micro-batches, with the same bubble as AFAB
///   interleaved    v model chunks per rank: a smaller bubble, v times the messages
///
/// The bubble is the fraction of a step a stage is idle (waiting for its neighbours).
///
/// Schedules are data (schedule.hpp, given): a list of Actions per stage, checked by a simulator
/// before a single tensor moves; run_schedule executes the same list with the stage models.
///
/// Core steps 1-4 (about 90 minutes), optional steps 5 and 6: README.md.
#include <cstddef>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/data/sampler.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"
#include "schedule.hpp"

namespace scalelab::lab08 {

// ---- Step 1: stages ---------------------------------------------------------------------------

/// Blocks [first, last) of the model.
struct LayerRange {
  int first = 0, last = 0;
  int size() const { return last - first; }
  bool operator==(const LayerRange&) const = default;
};
/// Given. "[first, last)": how a failed check (EXPECT_EQ) and a log line show a range.
inline std::ostream& operator<<(std::ostream& os, const LayerRange& r) {
  return os << "[" << r.first << ", " << r.last << ")";
}

/// Step 1a. The blocks of stage `stage` of `p`, balanced by layer count: the stages together
/// hold every block once, in order (stage 0 the first ones), each a contiguous range; sizes
/// differ by at most one, the larger stages first (10 layers over 4 stages: 3 3 2 2). Throws
/// scalelab::UsageError (one line naming the numbers) when p < 1, p > n_layer (a stage would
/// have no layer) or stage is not in [0, p).
LayerRange stage_layers(int n_layer, int p, int stage);

/// Step 1b. This stage's model: an nn::GPT holding only stage_layers(config.n_layer, p, stage),
/// everything else (seed, dtype, device) from `options`. Because every parameter is drawn from
/// (seed, name), its parameters equal the single-device model's: the first stage holds the
/// embedding (wte, wpe), the last stage ln_f and the head; a last stage without the embedding
/// holds lm_head.weight, a copy of wte (drawn like it).
std::unique_ptr<nn::GPT> build_stage(const ModelConfig& config, int p, int stage,
                                     nn::GPTOptions options = {});

/// Step 1c. The tied embedding across pieces. The single-device model uses wte twice (embedding
/// and head), so its gradient is the sum of both uses. Cut into pieces, the piece holding the
/// embedding has wte.weight and the piece holding the head its own copy, lm_head.weight. Called
/// on every rank of the pipeline group after backward; afterwards both copies' gradients hold
/// the same sum of both uses, bit for bit, so the copies get the same update and stay equal:
///  - the two pieces on two ranks (p > 1): they exchange their gradients over `pp` (each end
///    sends one copy of wte; a rank holding neither sends nothing and changes nothing);
///  - both pieces on this rank (p = 1 with v > 1 chunks: interleaving on one rank): the sum is
///    made here, no message;
///  - one piece holding both ends (p = 1, v = 1): wte is one tensor, already summed: nothing.
/// `chunks` is this rank's model pieces (one, or v).
void sync_tied_gradients(const std::vector<nn::GPT*>& chunks, comm::Communicator& pp);

// ---- Step 2: point to point -------------------------------------------------------------------

/// What a message carries: a stage's output (forward) or the gradient of a stage's input
/// (backward).
enum class Flow { activation, gradient };

/// Tags are unique for mb < kMaxMicroBatches and chunk < kMaxChunks.
inline constexpr int kMaxMicroBatches = 1024, kMaxChunks = 8;  // 2*8*1024 tags < 32767 (MPI's least TAG_UB)

/// Step 2a. The tag of a message: different for every (flow, mb, chunk), so a receive can only
/// match the one message it means, whatever order they arrive in. `chunk` is the RECEIVING
/// piece's chunk. Non-negative and below 2 * kMaxChunks * kMaxMicroBatches (MPI guarantees
/// tags up to 32767 only).
int message_tag(Flow flow, int mb, int chunk = 0);

/// Step 2b. Starts sending `t` to rank `dst` of `pp` with message_tag(flow, mb, chunk) and
/// returns at once (Communicator::send_async): `t` must stay alive until the Work is done. A
/// blocking send here can deadlock: two neighbours each sending to the other before receiving.
comm::Work send_to(comm::Communicator& pp, const Tensor& t, int dst, Flow flow, int mb,
                   int chunk = 0);

/// Step 2c. Starts receiving the message (flow, mb, chunk) from rank `src` of `pp` into a new
/// tensor of `shape` (f32 or the given dtype, on `device`) and returns at once; the Work says
/// when it has arrived. In a pipeline the shape is one micro-batch's (B/m, T, C).
struct Incoming {
  Tensor t;
  comm::Work work;
};
Incoming recv_from(comm::Communicator& pp, const std::vector<int64_t>& shape, int src, Flow flow,
                   int mb, int chunk = 0, DType dtype = DType::f32,
                   Device device = Device::cpu());

// ---- Step 3: schedules as data ----------------------------------------------------------------

/// Step 3a. AFAB (GPipe): every micro-batch's forward in order, then every backward in order;
/// each forward preceded by the receive of its activation and followed by its send, each
/// backward likewise with gradients (receives only where there is a previous stage for
/// activations / a next stage for gradients; sends likewise). Throws UsageError when m < 1 or
/// p < 1 or stage not in [0, p).
Schedule schedule_afab(int p, int m, int stage);

/// Step 3b. 1F1B (PipeDream-flush, Megatron-LM): forwards and backwards each in micro-batch
/// order, with the messages as in AFAB, and each backward as early as the pipeline lets it run:
/// with all p stages' schedules together, simulate() finishes (no deadlock) as fast as AFAB,
/// and stage s never holds more than min(p - s, m) micro-batches. A warm-up of forwards, a
/// steady state alternating forward and backward, a cool-down of backwards. m < p and m = 1
/// must work. Same usage errors as AFAB.
Schedule schedule_1f1b(int p, int m, int stage);

// ---- Step 4: execute --------------------------------------------------------------------------

/// One executed action: what, and when (seconds since run_schedule started).
struct Timed {
  Action action;
  double begin_s = 0, end_s = 0;
};

/// What run_schedule saw, for the timeline and the bubble (step 5).
struct ExecStats {
  std::vector<Timed> actions;  ///< every action, in order, with its begin and end time
  double step_s = 0;           ///< wall time of the whole schedule, sends completed
  int max_in_flight = 0;       ///< most micro-batch activations held at once on this rank
};

/// Step 4a. Runs `schedule` on this rank with its model pieces `chunks` (chunks[c] for the
/// actions of chunk c; one piece unless interleaved) over the micro-batches `micro` (every rank
/// passes all of them; only the first piece reads the tokens and the last the targets). The
/// messages are (B/m, T, C) tensors of the model's compute dtype (bf16 in mixed precision),
/// exchanged with the neighbouring pieces (next_piece / prev_piece). Each send and receive
/// action is one message over `pp` (send_to / recv_from), also when the neighbouring piece is on
/// this rank (p = 1 with v chunks: the rank sends to itself), so that every rank runs the same
/// code and what crosses `pp` is exactly what the schedule lists:
///   recv_activation  receive the previous piece's output of (mb, chunk), and wait for it
///   forward          run this piece on it (the first piece embeds the tokens, the last piece
///                    ends with the loss); keep what its backward needs (an nn::GPTActivations)
///   send_activation  start sending this piece's output to the next piece; do not wait
///   recv_gradient    receive the gradient of this piece's output, and wait for it
///   backward         run this piece's backward (the last piece starts from the loss), which
///                    consumes the forward's activations
///   send_gradient    start sending the gradient of this piece's input to the previous piece
/// What must hold: the pieces' gradients grow by the single-device gradients of the whole batch
/// (the loss of the batch is the mean of the m micro-batches' losses), ACCUMULATED into what they
/// held (nothing is zeroed here); every message is sent once and is done on return; a
/// micro-batch's tensors are released as soon as they are used. Returns the mean loss over the
/// m micro-batches on every rank of `pp` (sent from the rank of the last piece). Fills `stats`
/// when given (the given bookkeeping does it).
double run_schedule(const std::vector<nn::GPT*>& chunks, const Schedule& schedule,
                    const std::vector<data::Batch>& micro, comm::Communicator& pp,
                    ExecStats* stats = nullptr);

/// Step 4b. One pipeline training step's gradients: zero every piece's gradients, cut `batch`
/// into m equal micro-batches (rows), run_schedule, then sync_tied_gradients. Returns the mean
/// loss (the single-device loss of the whole batch). The caller steps the optimizer. Throws
/// UsageError when the rows do not split into m equal micro-batches.
double pipeline_step(const std::vector<nn::GPT*>& chunks, const Schedule& schedule,
                     const data::Batch& batch, int m, comm::Communicator& pp,
                     ExecStats* stats = nullptr);

// ---- Step 5: the bubble, measured --------------------------------------------------------------

enum class Kind { afab, one_f_one_b, interleaved };
/// "afab", "1f1b", "interleaved" (the --schedule option); anything else is a UsageError.
Kind parse_kind(const std::string& name);
const char* kind_name(Kind kind);
/// Given. --chunks (v) beside --schedule, in labs 08 and 10: v in [1, kMaxChunks] always, and
/// more than one chunk per rank only where the schedule interleaves them; a UsageError otherwise.
void check_chunks(Kind kind, int chunks);

/// Step 5a. The predicted bubble fraction of `kind` with p stages, m micro-batches and v chunks
/// per rank: what simulate() measures on its timeline (every stage equally fast, messages
/// free), in closed form. v is used by the interleaved schedule only.
double bubble_formula(Kind kind, int p, int m, int v = 1);

/// This rank's time in one step, from the run itself.
struct StageTime {
  double compute_s = 0;  ///< sum of the forward and backward actions' durations
  double wait_s = 0;     ///< sum of the receive actions' durations (waiting for a neighbour)
  double step_s = 0;     ///< the whole step
  double bubble = 0;     ///< 1 - compute_s / step_s: the fraction of the step not computing
};

/// Step 5b. The measured bubble of this rank from run_schedule's ExecStats.
StageTime measure_stage_time(const ExecStats& stats);

/// Step 5c. The peak bytes one run_schedule adds on this rank above what was allocated before
/// it, by the allocator's counters (common/allocator.hpp): what the schedule holds at its worst.
std::size_t measure_peak_activation_bytes(const std::vector<nn::GPT*>& chunks,
                                          const Schedule& schedule,
                                          const std::vector<data::Batch>& micro,
                                          comm::Communicator& pp);

// ---- Step 6: interleaved 1F1B ------------------------------------------------------------------

/// Step 6a. The blocks of piece (stage, chunk) with v chunks per rank: the model is cut into
/// p * v pieces of equal size, in order, numbered as schedule.hpp says (rank s holds pieces s,
/// s + p, s + 2p, ...). Throws UsageError unless n_layer is a multiple of p * v (and p, v >= 1,
/// stage, chunk in range).
LayerRange chunk_layers(int n_layer, int p, int v, int stage, int chunk);

/// Step 6b. Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021) on stage `stage` of `p` with
/// `v` chunks and m micro-batches: the m*v forward units (micro-batch, chunk) run in the order
/// "p micro-batches of chunk 0, the same p of chunk 1, ..., chunk v-1, then the next p
/// micro-batches"; backwards in the same order with the chunks reversed; a warm-up of forwards,
/// then one forward / one backward, then the cool-down. With every stage's schedule together
/// simulate() finishes, with a bubble v times smaller than 1F1B's fill and drain. Throws
/// UsageError when m < 1, v < 1 or m is not a multiple of p (the order needs whole groups of p).
Schedule schedule_interleaved(int p, int m, int v, int stage);

// ---- given: the schedule by name ----------------------------------------------------------------

/// The schedule of `kind` for this stage (v is used by interleaved only).
Schedule make_schedule(Kind kind, int p, int m, int v, int stage);

/// This rank's model pieces for `kind`: one stage model (build_stage) for AFAB and 1F1B, the v
/// chunk models of chunk_layers for interleaved (chunk c in element c).
std::vector<std::unique_ptr<nn::GPT>> build_pieces(const ModelConfig& config, Kind kind, int p,
                                                   int v, int stage, nn::GPTOptions options = {});

/// Raw pointers to the pieces (what run_schedule takes).
std::vector<nn::GPT*> pointers(const std::vector<std::unique_ptr<nn::GPT>>& pieces);

}  // namespace scalelab::lab08
