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
  // BEGIN SOLUTION step 1: every block in one stage, in order; sizes within one, larger first
  SCALELAB_REQUIRE(p >= 1, "the number of pipeline stages must be at least 1, got {}", p);
  SCALELAB_REQUIRE(p <= n_layer, "{} pipeline stages for {} layers: a stage would have no layer",
                   p, n_layer);
  SCALELAB_REQUIRE(0 <= stage && stage < p, "stage {} is not one of the {} stages", stage, p);
  const int base = n_layer / p, extra = n_layer % p;
  r.first = stage * base + std::min(stage, extra);
  r.last = r.first + base + (stage < extra ? 1 : 0);
  // END SOLUTION
  return r;
}

std::unique_ptr<nn::GPT> build_stage(const ModelConfig& config, int p, int stage,
                                     nn::GPTOptions options) {
  // BEGIN SOLUTION step 1: a GPT holding only this stage's blocks, with the single-device values
  // HINT: nn::GPTOptions has first_block and last_block.
  const LayerRange r = stage_layers(static_cast<int>(config.n_layer), p, stage);
  options.first_block = r.first;
  options.last_block = r.last;
  return std::make_unique<nn::GPT>(config, options);
  // END SOLUTION
}

void sync_tied_gradients(const std::vector<nn::GPT*>& chunks, comm::Communicator& pp) {
  // BEGIN SOLUTION step 1: both copies of the tied embedding end with the same sum of gradients
  // HINT: the two ends may be two ranks or two pieces of this rank (README.md#step-1).
  nn::GPT* emb = nullptr;
  nn::GPT* head = nullptr;
  for (nn::GPT* c : chunks) {
    if (c->has_embedding()) emb = c;
    if (c->has_head()) head = c;
  }
  if (emb == nullptr && head == nullptr) return;  // a middle stage
  if (emb == head) return;                        // one model: wte is used twice, already summed
  if (emb != nullptr && head != nullptr) {        // both pieces on this rank (p = 1, v > 1)
    Tensor& w = emb->params().get("wte.weight").grad;
    Tensor& h = head->params().get("lm_head.weight").grad;
    ops::axpy(w, 1.0, h);
    ops::copy(h, w);
    return;
  }
  Tensor& mine = emb != nullptr ? emb->params().get("wte.weight").grad
                                : head->params().get("lm_head.weight").grad;
  const int peer = emb != nullptr ? pp.size() - 1 : 0;
  Tensor theirs = Tensor::empty(mine.shape(), mine.dtype(), mine.device());
  comm::Work r = pp.recv_async(theirs, peer, kTiedTag);
  comm::Work s = pp.send_async(mine, peer, kTiedTag);
  r.wait();
  s.wait();  // `mine` is read by the send: add only after it is done
  ops::axpy(mine, 1.0, theirs);
  // END SOLUTION
}

// ---- Step 2 -------------------------------------------------------------------------------------

int message_tag(Flow flow, int mb, int chunk) {
  int tag = 0;
  // BEGIN SOLUTION step 2: a different tag for every (flow, micro-batch, chunk)
  SCALELAB_CHECK(0 <= mb && mb < kMaxMicroBatches && 0 <= chunk && chunk < kMaxChunks,
                 "micro-batch {} / chunk {} outside the tag space", mb, chunk);
  tag = ((flow == Flow::gradient ? kMaxChunks : 0) + chunk) * kMaxMicroBatches + mb;
  // END SOLUTION
  return tag;
}

comm::Work send_to(comm::Communicator& pp, const Tensor& t, int dst, Flow flow, int mb,
                   int chunk) {
  // BEGIN SOLUTION step 2: start sending the message and return at once
  return pp.send_async(t, dst, message_tag(flow, mb, chunk));
  // END SOLUTION
}

Incoming recv_from(comm::Communicator& pp, const std::vector<int64_t>& shape, int src, Flow flow,
                   int mb, int chunk, DType dtype, Device device) {
  Incoming in;
  // BEGIN SOLUTION step 2: start receiving the message into a new buffer and return at once
  in.t = Tensor::empty(shape, dtype, device);
  in.work = pp.recv_async(in.t, src, message_tag(flow, mb, chunk));
  // END SOLUTION
  return in;
}

// ---- Step 3 -------------------------------------------------------------------------------------

Schedule schedule_afab(int p, int m, int stage) {
  Schedule s;
  // BEGIN SOLUTION step 3: AFAB: every forward, then every backward, each with its messages
  check_schedule_args(p, m, stage);
  const bool first = stage == 0, last = stage == p - 1;
  for (int i = 0; i < m; ++i) {
    if (!first) s.push_back({Op::recv_activation, i});
    s.push_back({Op::forward, i});
    if (!last) s.push_back({Op::send_activation, i});
  }
  for (int i = 0; i < m; ++i) {
    if (!last) s.push_back({Op::recv_gradient, i});
    s.push_back({Op::backward, i});
    if (!first) s.push_back({Op::send_gradient, i});
  }
  // END SOLUTION
  return s;
}

Schedule schedule_1f1b(int p, int m, int stage) {
  Schedule s;
  // BEGIN SOLUTION step 3: 1F1B: each backward as early as possible: <= p - stage in flight
  check_schedule_args(p, m, stage);
  const bool first = stage == 0, last = stage == p - 1;
  auto forward = [&](int i) {
    if (!first) s.push_back({Op::recv_activation, i});
    s.push_back({Op::forward, i});
    if (!last) s.push_back({Op::send_activation, i});
  };
  auto backward = [&](int i) {
    if (!last) s.push_back({Op::recv_gradient, i});
    s.push_back({Op::backward, i});
    if (!first) s.push_back({Op::send_gradient, i});
  };
  const int warmup = std::min(p - stage - 1, m);
  int next_f = 0, next_b = 0;
  for (; next_f < warmup; ++next_f) forward(next_f);
  while (next_f < m) {  // steady state: in flight stays at warmup + 1 <= p - stage
    forward(next_f++);
    backward(next_b++);
  }
  while (next_b < m) backward(next_b++);
  // END SOLUTION
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
    // BEGIN SOLUTION step 4: run one action: compute, or a message to or from a neighbour
    // HINT: slots[a.chunk][a.mb], sends.add(...), loss_sum; the contract lists what each op does.
    nn::GPT& model = *chunks.at(a.chunk);
    const data::Batch& mb = micro.at(a.mb);
    Slot& slot = slots[a.chunk][a.mb];
    const std::vector<int64_t> shape = {mb.batch_size(), mb.x.size(1), C};  // (B/m, T, C)
    switch (a.op) {
      case Op::recv_activation: {
        const Piece from = prev_piece(p, v, stage, a.chunk);
        Incoming in = recv_from(pp, shape, from.stage, Flow::activation, a.mb, a.chunk, dtype, dev);
        in.work.wait();  // the one place a stage waits for its neighbour
        slot.received = in.t;
        break;
      }
      case Op::forward: {
        Tensor x = model.has_embedding() ? model.embed(mb.x.to(dev), slot.acts)  // (B/m, T, C)
                                         : slot.received;
        slot.received = Tensor();  // acts keeps it as the first block's input
        Tensor y = model.forward_blocks(x, slot.acts);
        if (model.has_head())
          loss_sum += model.head_forward(y, mb.y.to(dev), slot.acts);
        else
          slot.to_send = y;
        break;
      }
      case Op::send_activation: {
        const Piece to = next_piece(p, v, stage, a.chunk);
        sends.add(send_to(pp, slot.to_send, to.stage, Flow::activation, a.mb, to.chunk),
                  slot.to_send);
        slot.to_send = Tensor();
        break;
      }
      case Op::recv_gradient: {
        const Piece from = next_piece(p, v, stage, a.chunk);
        Incoming in = recv_from(pp, shape, from.stage, Flow::gradient, a.mb, a.chunk, dtype, dev);
        in.work.wait();
        slot.received = in.t;
        break;
      }
      case Op::backward: {
        // d loss / d (this piece's output), of the mean over m micro-batches: scale 1/m
        Tensor dy = model.has_head() ? model.head_backward(slot.acts, 1.0 / m) : slot.received;
        slot.received = Tensor();
        Tensor dx = model.backward_blocks(dy, slot.acts);  // gradients accumulate (+=)
        if (model.has_embedding())
          model.embed_backward(dx, slot.acts);
        else
          slot.to_send = dx;
        slot.acts.reset();
        break;
      }
      case Op::send_gradient: {
        const Piece to = prev_piece(p, v, stage, a.chunk);
        sends.add(send_to(pp, slot.to_send, to.stage, Flow::gradient, a.mb, to.chunk),
                  slot.to_send);
        slot.to_send = Tensor();
        break;
      }
    }
    // END SOLUTION
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
  // BEGIN SOLUTION step 4: one batch's gradients from m micro-batches, tied copies summed
  const int64_t rows = batch.batch_size();
  SCALELAB_REQUIRE(m >= 1, "the number of micro-batches must be at least 1, got {}", m);
  SCALELAB_REQUIRE(rows % m == 0, "{} rows do not split into {} equal micro-batches", rows, m);
  for (nn::GPT* c : chunks) c->zero_grad();
  std::vector<data::Batch> micro;
  const int64_t b = rows / m;
  for (int i = 0; i < m; ++i) micro.push_back(batch.rows(i * b, (i + 1) * b));
  loss = run_schedule(chunks, schedule, micro, pp, stats);
  sync_tied_gradients(chunks, pp);
  // END SOLUTION
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
  // BEGIN SOLUTION step 5: the simulator's bubble in closed form (the idle fraction of a stage)
  const double fill = p - 1;
  const double work = kind == Kind::interleaved ? static_cast<double>(v) * m : m;
  b = fill / (work + fill);
  // END SOLUTION
  return b;
}

StageTime measure_stage_time(const ExecStats& stats) {
  StageTime t;
  // BEGIN SOLUTION step 5: this rank's time computing, waiting and idle, from its own timings
  for (const Timed& x : stats.actions) {
    const double d = x.end_s - x.begin_s;
    if (x.action.op == Op::forward || x.action.op == Op::backward) t.compute_s += d;
    if (x.action.op == Op::recv_activation || x.action.op == Op::recv_gradient) t.wait_s += d;
  }
  t.step_s = stats.step_s;
  t.bubble = t.step_s > 0 ? 1.0 - t.compute_s / t.step_s : 0.0;
  // END SOLUTION
  return t;
}

std::size_t measure_peak_activation_bytes(const std::vector<nn::GPT*>& chunks,
                                          const Schedule& schedule,
                                          const std::vector<data::Batch>& micro,
                                          comm::Communicator& pp) {
  std::size_t bytes = 0;
  // BEGIN SOLUTION step 5: the most bytes one run_schedule adds, by the allocator's counters
  const Device dev = chunks.at(0)->device();
  reset_peak_memory(dev);
  const std::size_t before = memory_stats(dev).current;
  run_schedule(chunks, schedule, micro, pp);
  bytes = memory_stats(dev).peak - before;
  // END SOLUTION
  return bytes;
}

// ---- Step 6 -------------------------------------------------------------------------------------

LayerRange chunk_layers(int n_layer, int p, int v, int stage, int chunk) {
  LayerRange r;
  // BEGIN SOLUTION step 6: the blocks of piece (stage, chunk), in schedule.hpp's piece order
  SCALELAB_REQUIRE(p >= 1 && v >= 1, "stages and chunks must be at least 1, got p {} v {}", p, v);
  SCALELAB_REQUIRE(n_layer % (p * v) == 0,
                   "interleaving {} layers over {} stages x {} chunks: the layers must be a "
                   "multiple of {}", n_layer, p, v, p * v);
  SCALELAB_REQUIRE(0 <= stage && stage < p && 0 <= chunk && chunk < v,
                   "piece (stage {}, chunk {}) outside {} stages x {} chunks", stage, chunk, p, v);
  const int per = n_layer / (p * v), vs = chunk * p + stage;
  r.first = vs * per;
  r.last = r.first + per;
  // END SOLUTION
  return r;
}

Schedule schedule_interleaved(int p, int m, int v, int stage) {
  Schedule s;
  // BEGIN SOLUTION step 6: Megatron's interleaved 1F1B: no deadlock, the bubble shrunk by v
  check_schedule_args(p, m, stage);
  SCALELAB_REQUIRE(v >= 1 && v <= kMaxChunks, "chunks per stage must be in [1, {}], got {}",
                   kMaxChunks, v);
  SCALELAB_REQUIRE(m % p == 0, "the interleaved schedule needs micro-batches in groups of the {} "
                   "stages: {} is not a multiple of {}", p, m, p);
  const int total = m * v;
  auto unit = [&](int k, bool backward) {
    const int group = k / (p * v), within = k % (p * v);
    const int chunk = backward ? v - 1 - within / p : within / p;
    return std::pair<int, int>{group * p + within % p, chunk};
  };
  auto forward = [&](int k) {
    const auto [mb, c] = unit(k, false);
    if (prev_piece(p, v, stage, c).exists) s.push_back({Op::recv_activation, mb, c});
    s.push_back({Op::forward, mb, c});
    if (next_piece(p, v, stage, c).exists) s.push_back({Op::send_activation, mb, c});
  };
  auto backward = [&](int k) {
    const auto [mb, c] = unit(k, true);
    if (next_piece(p, v, stage, c).exists) s.push_back({Op::recv_gradient, mb, c});
    s.push_back({Op::backward, mb, c});
    if (prev_piece(p, v, stage, c).exists) s.push_back({Op::send_gradient, mb, c});
  };
  const int warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  int next_f = 0, next_b = 0;
  for (; next_f < warmup; ++next_f) forward(next_f);
  while (next_f < total) {
    forward(next_f++);
    backward(next_b++);
  }
  while (next_b < total) backward(next_b++);
  // END SOLUTION
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
