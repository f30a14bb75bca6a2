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
  // BEGIN SOLUTION step 1: balanced split: n_layer / p each, one more for the first n_layer % p
  // HINT: stage s starts after the blocks of stages 0..s-1: s * base + min(s, extra).
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
  // BEGIN SOLUTION step 1: a GPT holding only this stage's blocks
  // HINT: nn::GPTOptions has first_block and last_block; the seed stays the single-device one.
  const LayerRange r = stage_layers(static_cast<int>(config.n_layer), p, stage);
  options.first_block = r.first;
  options.last_block = r.last;
  return std::make_unique<nn::GPT>(config, options);
  // END SOLUTION
}

void sync_tied_gradients(const std::vector<nn::GPT*>& chunks, comm::Communicator& pp) {
  // BEGIN SOLUTION step 1: exchange wte / lm_head.weight gradients, both end with the sum
  // HINT: post the receive and the send (async) before waiting either: both ends send first.
  // HINT: a + b == b + a exactly in floating point, so both copies get the same bits.
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
  // BEGIN SOLUTION step 2: one tag per (flow, mb, chunk)
  SCALELAB_CHECK(0 <= mb && mb < kMaxMicroBatches && 0 <= chunk && chunk < kMaxChunks,
                 "micro-batch {} / chunk {} outside the tag space", mb, chunk);
  tag = ((flow == Flow::gradient ? kMaxChunks : 0) + chunk) * kMaxMicroBatches + mb;
  // END SOLUTION
  return tag;
}

comm::Work send_to(comm::Communicator& pp, const Tensor& t, int dst, Flow flow, int mb,
                   int chunk) {
  // BEGIN SOLUTION step 2: a non-blocking send with the message's tag
  return pp.send_async(t, dst, message_tag(flow, mb, chunk));
  // END SOLUTION
}

Incoming recv_from(comm::Communicator& pp, const std::vector<int64_t>& shape, int src, Flow flow,
                   int mb, int chunk, DType dtype, Device device) {
  Incoming in;
  // BEGIN SOLUTION step 2: a new buffer and a non-blocking receive with the message's tag
  in.t = Tensor::empty(shape, dtype, device);
  in.work = pp.recv_async(in.t, src, message_tag(flow, mb, chunk));
  // END SOLUTION
  return in;
}

// ---- Step 3 -------------------------------------------------------------------------------------

Schedule schedule_afab(int p, int m, int stage) {
  Schedule s;
  // BEGIN SOLUTION step 3: all forwards, then all backwards, with their messages
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
  // BEGIN SOLUTION step 3: warm-up forwards, one forward / one backward, cool-down backwards
  // HINT: the last stage has no warm-up: its forward of i is followed at once by backward i.
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
  // BEGIN SOLUTION step 4: execute the actions: one GPTActivations per micro-batch in flight
  // HINT: keep per (chunk, micro-batch): its GPTActivations, the input received, the output to
  // HINT: send, the gradient received; release each as soon as it is used.
  // HINT: keep each send's Work AND its tensor until it is done (test() them as you go).
  // HINT: stats (when given): one Timed{action, begin, seconds_since(t0)} per action, and the
  // HINT: most micro-batches in flight; a trace::Scope per action shows it in --trace.
  std::vector<std::vector<nn::GPTActivations>> acts(v, std::vector<nn::GPTActivations>(m));
  std::vector<std::vector<Tensor>> received(v, std::vector<Tensor>(m));  // from the neighbour
  std::vector<std::vector<Tensor>> to_send(v, std::vector<Tensor>(m));   // for the neighbour
  struct Sending {
    comm::Work work;
    Tensor t;  // alive until the send is done
  };
  std::vector<Sending> sending;
  int in_flight = 0;
  for (const Action& a : schedule) {
    const double begin = seconds_since(t0);
    nn::GPT& model = *chunks.at(a.chunk);
    const data::Batch& mb = micro.at(a.mb);
    const std::vector<int64_t> shape = {mb.batch_size(), mb.x.size(1), C};  // (B, T, C)
    const std::string name = to_string(a);
    trace::Scope scope(name, a.op == Op::forward || a.op == Op::backward ? "compute" : "p2p");
    switch (a.op) {
      case Op::recv_activation: {
        const Piece from = prev_piece(p, v, stage, a.chunk);
        Incoming in = recv_from(pp, shape, from.stage, Flow::activation, a.mb, a.chunk, dtype, dev);
        in.work.wait();  // the one place a stage waits for its neighbour
        received[a.chunk][a.mb] = in.t;
        break;
      }
      case Op::forward: {
        nn::GPTActivations& A = acts[a.chunk][a.mb];
        Tensor x = model.has_embedding() ? model.embed(mb.x.to(dev), A)  // (B, T, C)
                                         : received[a.chunk][a.mb];
        received[a.chunk][a.mb] = Tensor();  // A keeps it as the first block's input
        Tensor y = model.forward_blocks(x, A);  // (B, T, C)
        if (model.has_head())
          loss_sum += model.head_forward(y, mb.y.to(dev), A);
        else
          to_send[a.chunk][a.mb] = y;
        in_flight += 1;
        break;
      }
      case Op::send_activation: {
        const Piece to = next_piece(p, v, stage, a.chunk);
        Tensor& y = to_send[a.chunk][a.mb];
        sending.push_back({send_to(pp, y, to.stage, Flow::activation, a.mb, to.chunk), y});
        y = Tensor();
        break;
      }
      case Op::recv_gradient: {
        const Piece from = next_piece(p, v, stage, a.chunk);
        Incoming in = recv_from(pp, shape, from.stage, Flow::gradient, a.mb, a.chunk, dtype, dev);
        in.work.wait();
        received[a.chunk][a.mb] = in.t;
        break;
      }
      case Op::backward: {
        nn::GPTActivations& A = acts[a.chunk][a.mb];
        // d loss / d (this piece's output), of the mean over m micro-batches: scale 1/m
        Tensor dy = model.has_head() ? model.head_backward(A, 1.0 / m) : received[a.chunk][a.mb];
        received[a.chunk][a.mb] = Tensor();
        Tensor dx = model.backward_blocks(dy, A);  // gradients accumulate (+=)
        if (model.has_embedding())
          model.embed_backward(dx, A);
        else
          to_send[a.chunk][a.mb] = dx;
        A.reset();
        in_flight -= 1;
        break;
      }
      case Op::send_gradient: {
        const Piece to = prev_piece(p, v, stage, a.chunk);
        Tensor& dx = to_send[a.chunk][a.mb];
        sending.push_back({send_to(pp, dx, to.stage, Flow::gradient, a.mb, to.chunk), dx});
        dx = Tensor();
        break;
      }
    }
    // Sends that are done free their buffers now, not at the end of the step.
    std::erase_if(sending, [](Sending& s) { return s.work.test(); });
    if (stats != nullptr) {
      stats->actions.push_back({a, begin, seconds_since(t0)});
      stats->max_in_flight = std::max(stats->max_in_flight, in_flight);
    }
  }
  for (Sending& s : sending) s.work.wait();
  // END SOLUTION
  if (stats != nullptr) stats->step_s = seconds_since(t0);
  // The loss lives on the rank holding the head (the last stage): every rank gets it.
  Tensor loss = Tensor::from_vector({loss_sum / m}, {1}, DType::f64);
  pp.broadcast(loss, p - 1);
  return loss.item();
}

double pipeline_step(const std::vector<nn::GPT*>& chunks, const Schedule& schedule,
                     const data::Batch& batch, int m, comm::Communicator& pp, ExecStats* stats) {
  double loss = 0;
  // BEGIN SOLUTION step 4: zero, cut into micro-batches, run the schedule, sum the tied gradients
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

double bubble_formula(Kind kind, int p, int m, int v) {
  double b = 0;
  // BEGIN SOLUTION step 5: (p - 1) / (m + p - 1), or (p - 1) / (v m + p - 1) interleaved
  const double fill = p - 1;
  const double work = kind == Kind::interleaved ? static_cast<double>(v) * m : m;
  b = fill / (work + fill);
  // END SOLUTION
  return b;
}

StageTime measure_stage_time(const ExecStats& stats) {
  StageTime t;
  // BEGIN SOLUTION step 5: compute = forwards + backwards, wait = receives, bubble = 1 - compute/step
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
  // BEGIN SOLUTION step 5: the allocator's peak during one run_schedule, above the start
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
  // BEGIN SOLUTION step 6: piece vs = chunk * p + stage holds n_layer / (p v) blocks
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
  // BEGIN SOLUTION step 6: Megatron's interleaved order, warm-up, 1F1B, cool-down
  // HINT: unit k of the m*v: group k / (p v) of p micro-batches, chunk (k / p) % v within it.
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
