// Starter generated from solutions/08_pipeline_parallel/pipeline_parallel.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 5ce392a332157557 (lets make-labs see your edits).
// Lab 08: pipeline parallelism: stages, activations over send/recv, schedules as data (AFAB,
// 1F1B, interleaved 1F1B), executed with one GPTActivations per micro-batch in flight.
#include "pipeline_parallel.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "common/allocator.hpp"
#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"

namespace scalelab::lab08 {

namespace {

// The tag of the tied-embedding exchange: above every micro-batch message's tag.
constexpr int kTiedTag = 2 * kMaxChunks * kMaxMicroBatches;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void check_schedule_args(int p, int m, int stage) {
  SCALELAB_REQUIRE(p >= 1, "the number of pipeline stages must be at least 1, got {}", p);
  SCALELAB_REQUIRE(m >= 1, "the number of micro-batches must be at least 1, got {}", m);
  SCALELAB_REQUIRE(m <= kMaxMicroBatches, "at most {} micro-batches, got {}", kMaxMicroBatches, m);
  SCALELAB_REQUIRE(0 <= stage && stage < p, "stage {} is not one of the {} stages", stage, p);
}

}  // namespace

// ---- Step 1 -------------------------------------------------------------------------------------

LayerRange stage_layers(int n_layer, int p, int stage) {
  LayerRange r;
  // TODO step 1: balanced split: n_layer / p each, one more for the first n_layer % p
  // HINT: stage s starts after the blocks of stages 0..s-1: s * base + min(s, extra).
  throw scalelab::NotImplemented(
      "lab 08 step 1: balanced split: n_layer / p each, one more for the first n_layer % p (README.md#step-1)");
  return r;
}

std::unique_ptr<nn::GPT> build_stage(const ModelConfig& config, int p, int stage,
                                     nn::GPTOptions options) {
  // TODO step 1: a GPT holding only this stage's blocks
  // HINT: nn::GPTOptions has first_block and last_block; the seed stays the single-device one.
  throw scalelab::NotImplemented(
      "lab 08 step 1: a GPT holding only this stage's blocks (README.md#step-1)");
}

void sync_tied_gradients(const std::vector<nn::GPT*>& chunks, comm::Communicator& pp) {
  // TODO step 1: exchange wte / lm_head.weight gradients, both end with the sum
  // HINT: post the receive and the send (async) before waiting either: both ends send first.
  // HINT: a + b == b + a exactly in floating point, so both copies get the same bits.
  throw scalelab::NotImplemented(
      "lab 08 step 1: exchange wte / lm_head.weight gradients, both end with the sum (README.md#step-1)");
}

// ---- Step 2 -------------------------------------------------------------------------------------

int message_tag(Flow flow, int mb, int chunk) {
  int tag = 0;
  // TODO step 2: one tag per (flow, mb, chunk)
  throw scalelab::NotImplemented(
      "lab 08 step 2: one tag per (flow, mb, chunk) (README.md#step-2)");
  return tag;
}

comm::Work send_to(comm::Communicator& pp, const Tensor& t, int dst, Flow flow, int mb,
                   int chunk) {
  // TODO step 2: a non-blocking send with the message's tag
  throw scalelab::NotImplemented(
      "lab 08 step 2: a non-blocking send with the message's tag (README.md#step-2)");
}

Incoming recv_from(comm::Communicator& pp, const std::vector<int64_t>& shape, int src, Flow flow,
                   int mb, int chunk, DType dtype, Device device) {
  Incoming in;
  // TODO step 2: a new buffer and a non-blocking receive with the message's tag
  throw scalelab::NotImplemented(
      "lab 08 step 2: a new buffer and a non-blocking receive with the message's tag (README.md#step-2)");
  return in;
}

// ---- Step 3 -------------------------------------------------------------------------------------

Schedule schedule_afab(int p, int m, int stage) {
  Schedule s;
  // TODO step 3: all forwards, then all backwards, with their messages
  throw scalelab::NotImplemented(
      "lab 08 step 3: all forwards, then all backwards, with their messages (README.md#step-3)");
  return s;
}

Schedule schedule_1f1b(int p, int m, int stage) {
  Schedule s;
  // TODO step 3: warm-up forwards, one forward / one backward, cool-down backwards
  // HINT: the last stage has no warm-up: its forward of i is followed at once by backward i.
  throw scalelab::NotImplemented(
      "lab 08 step 3: warm-up forwards, one forward / one backward, cool-down backwards (README.md#step-3)");
  return s;
}

// ---- Step 4 -------------------------------------------------------------------------------------

double run_schedule(const std::vector<nn::GPT*>& chunks, const Schedule& schedule,
                    const std::vector<data::Batch>& micro, comm::Communicator& pp,
                    ExecStats* stats) {
  SCALELAB_CHECK(!chunks.empty(), "run_schedule without a model piece");
  const int p = pp.size(), stage = pp.rank(), v = static_cast<int>(chunks.size());
  const int m = static_cast<int>(micro.size());
  const Device dev = chunks[0]->device();
  const DType dtype = chunks[0]->params().compute_dtype();  // activations: bf16 if mixed
  const int64_t C = chunks[0]->config().n_embd;
  const Clock::time_point t0 = Clock::now();
  if (stats != nullptr) *stats = ExecStats{};
  double loss_sum = 0;
  // TODO step 4: execute the actions: one GPTActivations per micro-batch in flight
  // HINT: keep per (chunk, micro-batch): its GPTActivations, the input received, the output to
  // HINT: send, the gradient received; release each as soon as it is used.
  // HINT: keep each send's Work AND its tensor until it is done (test() them as you go).
  // HINT: stats (when given): one Timed{action, begin, seconds_since(t0)} per action, and the
  // HINT: most micro-batches in flight; a trace::Scope per action shows it in --trace.
  throw scalelab::NotImplemented(
      "lab 08 step 4: execute the actions: one GPTActivations per micro-batch in flight (README.md#step-4)");
  if (stats != nullptr) stats->step_s = seconds_since(t0);
  // The loss lives on the rank holding the head (the last stage): every rank gets it.
  Tensor loss = Tensor::from_vector({loss_sum / m}, {1}, DType::f64);
  pp.broadcast(loss, p - 1);
  return loss.item();
}

double pipeline_step(const std::vector<nn::GPT*>& chunks, const Schedule& schedule,
                     const data::Batch& batch, int m, comm::Communicator& pp, ExecStats* stats) {
  double loss = 0;
  // TODO step 4: zero, cut into micro-batches, run the schedule, sum the tied gradients
  throw scalelab::NotImplemented(
      "lab 08 step 4: zero, cut into micro-batches, run the schedule, sum the tied gradients (README.md#step-4)");
  return loss;
}

// ---- Step 5 -------------------------------------------------------------------------------------

Kind parse_kind(const std::string& name) {
  if (name == "afab") return Kind::afab;
  if (name == "1f1b") return Kind::one_f_one_b;
  if (name == "interleaved") return Kind::interleaved;
  throw UsageError(fmt::format("unknown schedule '{}' (afab, 1f1b, interleaved)", name));
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::afab: return "afab";
    case Kind::one_f_one_b: return "1f1b";
    case Kind::interleaved: return "interleaved";
  }
  return "?";
}

double bubble_formula(Kind kind, int p, int m, int v) {
  double b = 0;
  // TODO step 5: (p - 1) / (m + p - 1), or (p - 1) / (v m + p - 1) interleaved
  throw scalelab::NotImplemented(
      "lab 08 step 5: (p - 1) / (m + p - 1), or (p - 1) / (v m + p - 1) interleaved (README.md#step-5)");
  return b;
}

StageTime measure_stage_time(const ExecStats& stats) {
  StageTime t;
  // TODO step 5: compute = forwards + backwards, wait = receives, bubble = 1 - compute/step
  throw scalelab::NotImplemented(
      "lab 08 step 5: compute = forwards + backwards, wait = receives, bubble = 1 - compute/step (README.md#step-5)");
  return t;
}

std::size_t measure_peak_activation_bytes(const std::vector<nn::GPT*>& chunks,
                                          const Schedule& schedule,
                                          const std::vector<data::Batch>& micro,
                                          comm::Communicator& pp) {
  std::size_t bytes = 0;
  // TODO step 5: the allocator's peak during one run_schedule, above the start
  throw scalelab::NotImplemented(
      "lab 08 step 5: the allocator's peak during one run_schedule, above the start (README.md#step-5)");
  return bytes;
}

// ---- Step 6 -------------------------------------------------------------------------------------

LayerRange chunk_layers(int n_layer, int p, int v, int stage, int chunk) {
  LayerRange r;
  // TODO step 6: piece vs = chunk * p + stage holds n_layer / (p v) blocks
  throw scalelab::NotImplemented(
      "lab 08 step 6: piece vs = chunk * p + stage holds n_layer / (p v) blocks (README.md#step-6)");
  return r;
}

Schedule schedule_interleaved(int p, int m, int v, int stage) {
  Schedule s;
  // TODO step 6: Megatron's interleaved order, warm-up, 1F1B, cool-down
  // HINT: unit k of the m*v: group k / (p v) of p micro-batches, chunk (k / p) % v within it.
  throw scalelab::NotImplemented(
      "lab 08 step 6: Megatron's interleaved order, warm-up, 1F1B, cool-down (README.md#step-6)");
  return s;
}

// ---- given --------------------------------------------------------------------------------------

Schedule make_schedule(Kind kind, int p, int m, int v, int stage) {
  switch (kind) {
    case Kind::afab: return schedule_afab(p, m, stage);
    case Kind::one_f_one_b: return schedule_1f1b(p, m, stage);
    case Kind::interleaved: return schedule_interleaved(p, m, v, stage);
  }
  return {};
}

std::vector<std::unique_ptr<nn::GPT>> build_pieces(const ModelConfig& config, Kind kind, int p,
                                                   int v, int stage, nn::GPTOptions options) {
  std::vector<std::unique_ptr<nn::GPT>> pieces;
  if (kind != Kind::interleaved) {
    pieces.push_back(build_stage(config, p, stage, options));
    return pieces;
  }
  for (int c = 0; c < v; ++c) {
    const LayerRange r = chunk_layers(static_cast<int>(config.n_layer), p, v, stage, c);
    options.first_block = r.first;
    options.last_block = r.last;
    pieces.push_back(std::make_unique<nn::GPT>(config, options));
  }
  return pieces;
}

std::vector<nn::GPT*> pointers(const std::vector<std::unique_ptr<nn::GPT>>& pieces) {
  std::vector<nn::GPT*> out;
  for (const auto& x : pieces) out.push_back(x.get());
  return out;
}

}  // namespace scalelab::lab08
