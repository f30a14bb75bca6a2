// Starter generated from solutions/08_pipeline_parallel/pipeline_parallel.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 034d7b25ae1b98fe (lets make-labs see your edits).
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
  // TODO step 1: every block in one stage, in order; sizes within one, larger first
  throw scalelab::NotImplemented(
      "lab 08 step 1: every block in one stage, in order; sizes within one, larger first (README.md#step-1)");
  return r;
}

std::unique_ptr<nn::GPT> build_stage(const ModelConfig& config, int p, int stage,
                                     nn::GPTOptions options) {
  // TODO step 1: a GPT holding only this stage's blocks, with the single-device values
  // HINT: nn::GPTOptions has first_block and last_block.
  throw scalelab::NotImplemented(
      "lab 08 step 1: a GPT holding only this stage's blocks, with the single-device values (README.md#step-1)");
}

void sync_tied_gradients(const std::vector<nn::GPT*>& chunks, comm::Communicator& pp) {
  // TODO step 1: both copies of the tied embedding end with the same sum of gradients
  // HINT: the two ends may be two ranks or two pieces of this rank (README.md#step-1).
  throw scalelab::NotImplemented(
      "lab 08 step 1: both copies of the tied embedding end with the same sum of gradients (README.md#step-1)");
}

// ---- Step 2 -------------------------------------------------------------------------------------

int message_tag(Flow flow, int mb, int chunk) {
  int tag = 0;
  // TODO step 2: a different tag for every (flow, micro-batch, chunk)
  throw scalelab::NotImplemented(
      "lab 08 step 2: a different tag for every (flow, micro-batch, chunk) (README.md#step-2)");
  return tag;
}

comm::Work send_to(comm::Communicator& pp, const Tensor& t, int dst, Flow flow, int mb,
                   int chunk) {
  // TODO step 2: start sending the message and return at once
  throw scalelab::NotImplemented(
      "lab 08 step 2: start sending the message and return at once (README.md#step-2)");
}

Incoming recv_from(comm::Communicator& pp, const std::vector<int64_t>& shape, int src, Flow flow,
                   int mb, int chunk, DType dtype, Device device) {
  Incoming in;
  // TODO step 2: start receiving the message into a new buffer and return at once
  throw scalelab::NotImplemented(
      "lab 08 step 2: start receiving the message into a new buffer and return at once (README.md#step-2)");
  return in;
}

// ---- Step 3 -------------------------------------------------------------------------------------

Schedule schedule_afab(int p, int m, int stage) {
  Schedule s;
  // TODO step 3: AFAB: every forward, then every backward, each with its messages
  throw scalelab::NotImplemented(
      "lab 08 step 3: AFAB: every forward, then every backward, each with its messages (README.md#step-3)");
  return s;
}

Schedule schedule_1f1b(int p, int m, int stage) {
  Schedule s;
  // TODO step 3: 1F1B: each backward as early as possible: <= p - stage in flight
  throw scalelab::NotImplemented(
      "lab 08 step 3: 1F1B: each backward as early as possible: <= p - stage in flight (README.md#step-3)");
  return s;
}

// ---- Step 4 -------------------------------------------------------------------------------------

namespace {

// Given: the bookkeeping of run_schedule, so that step 4 is about the actions themselves.

// What one (chunk, micro-batch) holds between its actions. Each member is released (assigned an
// empty Tensor, or reset()) as soon as it has been used, so a stage holds only what is in flight.
struct Slot {
  nn::GPTActivations acts;  // filled by the forward, consumed by the backward
  Tensor received;          // the activation (forward) or gradient (backward) from a neighbour
  Tensor to_send;           // this piece's output (forward) or input gradient (backward)
};

// Sends in flight. A send reads its tensor until it completes, so each keeps the tensor alive;
// poll() frees the finished ones (run_schedule calls it before each compute), wait_all() ends
// the step.
class PendingSends {
 public:
  void add(comm::Work work, Tensor t) { sends_.push_back({std::move(work), std::move(t)}); }
  void poll() {
    std::erase_if(sends_, [](Sending& s) { return s.work.test(); });
  }
  void wait_all() {
    for (Sending& s : sends_) s.work.wait();
    sends_.clear();
  }

 private:
  struct Sending {
    comm::Work work;
    Tensor t;
  };
  std::vector<Sending> sends_;
};

}  // namespace

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
  Scalar loss_sum;  // the last piece's losses, added on its device: read once, on return
  std::vector<std::vector<Slot>> slots(v, std::vector<Slot>(m));  // slots[chunk][micro-batch]
  PendingSends sends;
  int in_flight = 0;  // micro-batches forwarded and not yet backwarded on this rank
  for (const Action& a : schedule) {
    const bool compute = a.op == Op::forward || a.op == Op::backward;
    // Before computing, free the finished sends and start the rest: testing a send launches it
    // where the backend held it back (nccl holds a lone send until a wait or a test), so it
    // travels during the compute. A send followed at once by a receive is launched by that
    // receive's wait instead, in one NCCL group with it (Megatron's send_forward_recv_backward):
    // launched alone, a send larger than NCCL's buffers holds the stream until its peer
    // receives, and this rank's receive queues behind it while the peer does the same (two
    // stages in 1F1B's steady state: a deadlock).
    if (compute) sends.poll();
    const double begin = seconds_since(t0);
    trace::Scope scope(to_string(a), compute ? "compute" : "p2p");
    // TODO step 4: run one action: compute, or a message to or from a neighbour
    // HINT: slots[a.chunk][a.mb], sends.add(...), loss_sum; the contract lists what each op does.
    throw scalelab::NotImplemented(
        "lab 08 step 4: run one action: compute, or a message to or from a neighbour (README.md#step-4)");
    in_flight += a.op == Op::forward ? 1 : a.op == Op::backward ? -1 : 0;
    if (stats != nullptr) {
      stats->actions.push_back({a, begin, seconds_since(t0)});
      stats->max_in_flight = std::max(stats->max_in_flight, in_flight);
    }
  }
  sends.wait_all();
  if (stats != nullptr) stats->step_s = seconds_since(t0);
  // The loss lives on the rank holding the head (the last stage): every rank gets it, on the
  // stages' device, and reads it here, once a step (the other ranks' sum is a host 0).
  const Scalar mean = loss_sum / m;
  Tensor loss = mean.tensor().defined()
                    ? mean.tensor().clone()
                    : Tensor::from_vector({mean.value()}, {1}, DType::f64).to(dev);
  pp.broadcast(loss, p - 1);
  return Scalar(loss).value();
}

double pipeline_step(const std::vector<nn::GPT*>& chunks, const Schedule& schedule,
                     const data::Batch& batch, int m, comm::Communicator& pp, ExecStats* stats) {
  double loss = 0;
  // TODO step 4: one batch's gradients from m micro-batches, tied copies summed
  throw scalelab::NotImplemented(
      "lab 08 step 4: one batch's gradients from m micro-batches, tied copies summed (README.md#step-4)");
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

void check_chunks(Kind kind, int chunks) {
  SCALELAB_REQUIRE(chunks >= 1 && chunks <= kMaxChunks, "--chunks must be in [1, {}], got {}",
                   kMaxChunks, chunks);
  SCALELAB_REQUIRE(kind == Kind::interleaved || chunks == 1, "--chunks {}: several model chunks "
                   "per rank need --schedule interleaved (got {})", chunks, kind_name(kind));
}

double bubble_formula(Kind kind, int p, int m, int v) {
  double b = 0;
  // TODO step 5: the simulator's bubble in closed form (the idle fraction of a stage)
  throw scalelab::NotImplemented(
      "lab 08 step 5: the simulator's bubble in closed form (the idle fraction of a stage) (README.md#step-5)");
  return b;
}

StageTime measure_stage_time(const ExecStats& stats) {
  StageTime t;
  // TODO step 5: this rank's time computing, waiting and idle, from its own timings
  throw scalelab::NotImplemented(
      "lab 08 step 5: this rank's time computing, waiting and idle, from its own timings (README.md#step-5)");
  return t;
}

std::size_t measure_peak_activation_bytes(const std::vector<nn::GPT*>& chunks,
                                          const Schedule& schedule,
                                          const std::vector<data::Batch>& micro,
                                          comm::Communicator& pp) {
  std::size_t bytes = 0;
  // TODO step 5: the most bytes one run_schedule adds, by the allocator's counters
  throw scalelab::NotImplemented(
      "lab 08 step 5: the most bytes one run_schedule adds, by the allocator's counters (README.md#step-5)");
  return bytes;
}

// ---- Step 6 -------------------------------------------------------------------------------------

LayerRange chunk_layers(int n_layer, int p, int v, int stage, int chunk) {
  LayerRange r;
  // TODO step 6: the blocks of piece (stage, chunk), in schedule.hpp's piece order
  throw scalelab::NotImplemented(
      "lab 08 step 6: the blocks of piece (stage, chunk), in schedule.hpp's piece order (README.md#step-6)");
  return r;
}

Schedule schedule_interleaved(int p, int m, int v, int stage) {
  Schedule s;
  // TODO step 6: Megatron's interleaved 1F1B: no deadlock, the bubble shrunk by v
  throw scalelab::NotImplemented(
      "lab 08 step 6: Megatron's interleaved 1F1B: no deadlock, the bubble shrunk by v (README.md#step-6)");
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
