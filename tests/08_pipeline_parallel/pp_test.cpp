// Lab 08 graders' shared helpers (see pp_test.hpp). Written for the tests; no lab08 code.
#include "pp_test.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/allocator.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::pptest {

std::unique_ptr<nn::GPT> reference_model(const data::Batch& batch, double* loss) {
  auto model = std::make_unique<nn::GPT>(kLab.config(), nn::GPTOptions{.seed = kLab.seed});
  nn::GPTActivations acts;
  const double l = model->forward(batch.x, batch.y, acts);
  model->backward(acts);
  if (loss != nullptr) *loss = l;
  return model;
}

std::vector<data::Batch> split(const data::Batch& batch, int m) {
  std::vector<data::Batch> out;
  const int64_t b = batch.batch_size() / m;
  for (int i = 0; i < m; ++i) out.push_back(batch.rows(i * b, (i + 1) * b));
  return out;
}

std::pair<int, int> blocks_of(int n_layer, int p, int stage) {
  const int base = n_layer / p, extra = n_layer % p;
  const int first = stage * base + std::min(stage, extra);
  return {first, first + base + (stage < extra ? 1 : 0)};
}

std::vector<std::unique_ptr<nn::GPT>> pieces_of(int p, int v, int stage, Device device) {
  const int L = static_cast<int>(kLab.config().n_layer);
  std::vector<std::unique_ptr<nn::GPT>> out;
  for (int c = 0; c < v; ++c) {
    auto [first, last] = blocks_of(L, p, stage);
    if (v > 1) {
      const int per = L / (p * v), vs = c * p + stage;
      first = vs * per;
      last = first + per;
    }
    out.push_back(std::make_unique<nn::GPT>(
        kLab.config(), nn::GPTOptions{.device = device, .seed = kLab.seed, .first_block = first,
                                      .last_block = last}));
  }
  return out;
}

std::vector<nn::GPT*> raw(const std::vector<std::unique_ptr<nn::GPT>>& pieces) {
  std::vector<nn::GPT*> out;
  for (const auto& x : pieces) out.push_back(x.get());
  return out;
}

lab08::Schedule test_schedule(bool afab, int p, int m, int stage, int extra_warmup) {
  using lab08::Op;
  lab08::Schedule s;
  const bool first = stage == 0, last = stage == p - 1;
  auto fwd = [&](int i) {
    if (!first) s.push_back({Op::recv_activation, i});
    s.push_back({Op::forward, i});
    if (!last) s.push_back({Op::send_activation, i});
  };
  auto bwd = [&](int i) {
    if (!last) s.push_back({Op::recv_gradient, i});
    s.push_back({Op::backward, i});
    if (!first) s.push_back({Op::send_gradient, i});
  };
  const int warmup = afab ? m : std::min(p - stage - 1 + extra_warmup, m);
  int f = 0, b = 0;
  for (; f < warmup; ++f) fwd(f);
  while (f < m) {
    fwd(f++);
    bwd(b++);
  }
  while (b < m) bwd(b++);
  return s;
}

testing::AssertionResult grads_match(const std::vector<nn::GPT*>& pieces, nn::GPT& reference,
                                     bool bitwise_except_tied) {
  for (nn::GPT* piece : pieces)
    for (nn::Parameter* p : piece->parameters()) {
      const bool tied = p->name == "wte.weight" || p->name == "lm_head.weight";
      const std::string ref_name = p->name == "lm_head.weight" ? "wte.weight" : p->name;
      const train::Diff d = train::compare(p->grad, reference.params().get(ref_name).grad);
      if (bitwise_except_tied && !tied && !d.bitwise)
        return testing::AssertionFailure()
               << "gradient of " << p->name << " is not bitwise the single-device one: " << d.str();
      if (!d.within(kRtol, kAtol))
        return testing::AssertionFailure()
               << "gradient of " << p->name << " differs from the single-device one (rtol "
               << kRtol << ", atol " << kAtol << "): " << d.str();
    }
  return testing::AssertionSuccess();
}

testing::AssertionResult on_every_rank(const testing::AssertionResult& ok) {
  return labtest::on_every_rank(ok);  // every rank reports the failing ranks' own causes
}

double local_pipeline(const std::vector<nn::GPT*>& stages, const std::vector<data::Batch>& micro,
                      const LocalFaults& faults) {
  const int p = static_cast<int>(stages.size()), m = static_cast<int>(micro.size());
  for (nn::GPT* s : stages) s->zero_grad();
  // acts[s][i]: stage s's activations of micro-batch i; out[s][i]: what it sends on.
  std::vector<std::vector<nn::GPTActivations>> acts(p, std::vector<nn::GPTActivations>(m));
  std::vector<std::vector<Tensor>> out(p, std::vector<Tensor>(m));
  double loss = 0;
  for (int s = 0; s < p; ++s)  // stage by stage: every input of stage s exists before it runs
    for (int i = 0; i < m; ++i) {
      nn::GPT& g = *stages[s];
      // the fault: stage 1 takes the next micro-batch's activation as its input
      const int from = faults.wrong_micro_batch && s == 1 ? (i + 1) % m : i;
      Tensor x = s == 0 ? g.embed(micro[i].x, acts[s][i]) : out[s - 1][from];
      Tensor y = g.forward_blocks(x, acts[s][i]);
      if (g.has_head())
        loss += g.head_forward(y, micro[i].y, acts[s][i]) / m;
      else
        out[s][i] = y;
    }
  for (int i = 0; i < m; ++i) {
    if (faults.zero_grad_each_micro_batch)
      for (nn::GPT* s : stages) s->zero_grad();  // the fault: only the last micro-batch is left
    Tensor d;
    for (int s = p - 1; s >= 0; --s) {
      nn::GPT& g = *stages[s];
      Tensor dy = g.has_head() ? g.head_backward(acts[s][i], 1.0 / m) : d;
      d = g.backward_blocks(dy, acts[s][i]);
      if (g.has_embedding()) g.embed_backward(d, acts[s][i]);
    }
  }
  if (p > 1 && !faults.skip_tied_sum) {
    Tensor& w = stages.front()->params().get("wte.weight").grad;
    Tensor& h = stages.back()->params().get("lm_head.weight").grad;
    Tensor sum = w.clone();
    ops::axpy(sum, 1.0, h);
    ops::copy(w, sum);
    ops::copy(h, sum);
  }
  return loss;
}

namespace {

Tensor noise(const std::vector<int64_t>& shape, uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<std::size_t>(n));
  uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (double& e : v) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    e = (static_cast<double>(x >> 11) / 9007199254740992.0 - 0.5) * 0.02;
  }
  return Tensor::from_vector(v, shape, DType::f32);
}

}  // namespace

std::size_t local_stage_peak(nn::GPT& g, const lab08::Schedule& schedule,
                             const std::vector<data::Batch>& micro) {
  const int m = static_cast<int>(micro.size());
  const int64_t C = g.config().n_embd;
  std::vector<nn::GPTActivations> acts(m);
  std::vector<Tensor> received(m);
  g.zero_grad();
  reset_peak_memory(g.device());
  const std::size_t before = memory_stats(g.device()).current;
  for (const lab08::Action& a : schedule) {
    const std::vector<int64_t> shape = {micro[a.mb].batch_size(), micro[a.mb].x.size(1), C};
    switch (a.op) {
      case lab08::Op::recv_activation:
      case lab08::Op::recv_gradient:
        received[a.mb] = noise(shape, static_cast<uint64_t>(a.mb) + 1);
        break;
      case lab08::Op::forward: {
        if (!g.has_embedding() && !received[a.mb].defined())  // a schedule without receives
          received[a.mb] = noise(shape, static_cast<uint64_t>(a.mb) + 1);
        Tensor x = g.has_embedding() ? g.embed(micro[a.mb].x, acts[a.mb]) : received[a.mb];
        received[a.mb] = Tensor();
        Tensor y = g.forward_blocks(x, acts[a.mb]);
        if (g.has_head()) g.head_forward(y, micro[a.mb].y, acts[a.mb]);
        break;  // a send would take y away: dropped here
      }
      case lab08::Op::backward: {
        if (!g.has_head() && !received[a.mb].defined())
          received[a.mb] = noise(shape, static_cast<uint64_t>(a.mb) + 1);
        Tensor dy = g.has_head() ? g.head_backward(acts[a.mb], 1.0 / m) : received[a.mb];
        received[a.mb] = Tensor();
        Tensor dx = g.backward_blocks(dy, acts[a.mb]);
        if (g.has_embedding()) g.embed_backward(dx, acts[a.mb]);
        acts[a.mb].reset();
        break;
      }
      default:
        break;
    }
  }
  return memory_stats(g.device()).peak - before;
}

std::size_t one_micro_batch_bytes(nn::GPT& g, const data::Batch& micro) {
  nn::GPTActivations acts;
  const int64_t C = g.config().n_embd;
  Tensor x = g.has_embedding() ? g.embed(micro.x, acts)
                               : noise({micro.batch_size(), micro.x.size(1), C}, 99);
  Tensor y = g.forward_blocks(x, acts);
  if (g.has_head()) g.head_forward(y, micro.y, acts);
  return acts.nbytes();
}

testing::AssertionResult MemoryBounds::holds(std::size_t peak, int k,
                                             const std::string& what) const {
  const double lo = p1 + (k - 1.5) * a, hi = p1 + (k - 0.5) * a;
  if (peak < lo || peak > hi)
    return testing::AssertionFailure()
           << what << ": peak " << peak << " bytes is not " << k << " micro-batches' worth [" << lo
           << ", " << hi << "] (one micro-batch: " << a << " bytes, one F+B peak " << p1 << ")";
  return testing::AssertionSuccess();
}

MemoryBounds bounds(nn::GPT& stage, const std::vector<data::Batch>& micro) {
  MemoryBounds b;
  b.a = static_cast<double>(one_micro_batch_bytes(stage, micro[0]));
  const lab08::Schedule one = {{lab08::Op::recv_activation, 0}, {lab08::Op::forward, 0},
                               {lab08::Op::recv_gradient, 0}, {lab08::Op::backward, 0}};
  b.p1 = static_cast<double>(local_stage_peak(stage, one, {micro[0]}));
  return b;
}

namespace {

// A (B/m, T, C) message of the interleaved run, named by its tag as the schedule names the action:
// the tag gives the receiving piece (this rank's chunk for a receive, the peer's for a send), and
// the sending piece is that one's neighbour; it must be on the other end of the message.
std::string tagged_action(const exec_log::Event& ev, const TagTable& tags, int p, int v, int s,
                          int peer) {
  const std::string unknown = fmt::format("{}?tag {} peer {}", ev.what, ev.tag, peer);
  const auto t = tags.find(ev.tag);
  if (t == tags.end()) return unknown;
  const Tagged& k = t->second;
  const bool send = ev.what == "send";
  const int at = send ? peer : s;  // the stage of the receiving piece, chunk k.chunk
  if (k.chunk >= v) return unknown;
  // activations come from the previous piece, gradients from the next one
  const lab08::Piece from = k.gradient ? lab08::next_piece(p, v, at, k.chunk)
                                       : lab08::prev_piece(p, v, at, k.chunk);
  if (!from.exists || from.stage != (send ? s : peer)) return unknown;
  return lab08::to_string(lab08::Action{
      .op = send ? (k.gradient ? lab08::Op::send_gradient : lab08::Op::send_activation)
                 : (k.gradient ? lab08::Op::recv_gradient : lab08::Op::recv_activation),
      .mb = k.mb,
      .chunk = send ? from.chunk : k.chunk});
}

}  // namespace

Executed executed(const std::vector<exec_log::Event>& log, const std::vector<nn::GPT*>& chunks,
                  const comm::Communicator& pp, int64_t message_bytes, const TagTable& tags) {
  Executed e;
  const int v = static_cast<int>(chunks.size()), p = pp.size(), s = pp.rank();
  const int next = s + 1 < p ? pp.world_ranks()[s + 1] : -1, prev = s > 0 ? pp.world_ranks()[s - 1] : -1;
  std::vector<int> forwards(v, 0), backwards(v, 0);
  int in_flight = 0, sA = 0, rA = 0, sG = 0, rG = 0;
  std::vector<std::string> compute, actions;
  const auto chunk_of = [&](const void* object) {
    for (int c = 0; c < v; ++c)
      if (chunks[c] == object) return c;
    return -1;
  };
  const auto name = [&](const char* op, int mb, int chunk) {
    // as lab08::to_string writes an action: "F3", and "F3.1" for chunks other than 0
    return chunk > 0 ? fmt::format("{}{}.{}", op, mb, chunk) : fmt::format("{}{}", op, mb);
  };
  bool send_waited = false;  // a wait on a send of pp since the last forward or backward
  for (const exec_log::Event& ev : log) {
    if (ev.object != nullptr) {  // a model piece
      const int c = chunk_of(ev.object);
      if (c < 0) {
        ++e.stray_calls;
        continue;
      }
      if (ev.what == "forward_blocks") {
        compute.push_back(name("F", forwards[c]++, c));
        actions.push_back(compute.back());
        e.max_in_flight = std::max(e.max_in_flight, ++in_flight);
      } else if (ev.what == "backward_blocks") {
        compute.push_back(name("B", backwards[c]++, c));
        actions.push_back(compute.back());
        --in_flight;
      }
      if ((ev.what == "forward_blocks" || ev.what == "backward_blocks") && send_waited &&
          e.after_send_wait.empty())
        e.after_send_wait = compute.back();
      continue;
    }
    if (ev.what == "wait") {  // the caller waiting on a message, not a message
      send_waited = send_waited || (ev.op == "send" && ev.group == pp.name());
      continue;
    }
    if (ev.group != pp.name() || ev.bytes != message_bytes) continue;
    if (!tags.empty()) {
      if (ev.what != "send" && ev.what != "recv") {  // a collective of a message's size
        actions.push_back(fmt::format("{}?{}", ev.what, ev.peer));
        continue;
      }
      const auto& w = pp.world_ranks();
      const int peer = static_cast<int>(std::find(w.begin(), w.end(), ev.peer) - w.begin());
      actions.push_back(tagged_action(ev, tags, p, v, s, peer));
      continue;
    }
    if (v != 1) continue;
    if (ev.what == "send" && ev.peer == next && next >= 0) actions.push_back(fmt::format("sA{}", sA++));
    else if (ev.what == "recv" && ev.peer == prev && prev >= 0) actions.push_back(fmt::format("rA{}", rA++));
    else if (ev.what == "recv" && ev.peer == next && next >= 0) actions.push_back(fmt::format("rG{}", rG++));
    else if (ev.what == "send" && ev.peer == prev && prev >= 0) actions.push_back(fmt::format("sG{}", sG++));
    else actions.push_back(fmt::format("{}?{}", ev.what, ev.peer));  // a message to nobody's neighbour
  }
  e.compute = fmt::format("{}", fmt::join(compute, " "));
  e.actions = fmt::format("{}", fmt::join(actions, " "));
  return e;
}

testing::AssertionResult ran(const Executed& e, const lab08::Schedule& schedule, bool with_messages) {
  const int rank = labtest::world().rank();
  if (e.stray_calls > 0)
    return testing::AssertionFailure() << "rank " << rank << ": " << e.stray_calls
                                       << " forward/backward call(s) on a model that is not one "
                                          "of the stage's pieces (the library's execution log)";
  if (e.compute != lab08::compute_order(schedule))
    return testing::AssertionFailure()
           << "rank " << rank << " executed (the library's log of forward_blocks / "
           << "backward_blocks calls):\n  " << e.compute << "\nits schedule says:\n  "
           << lab08::compute_order(schedule);
  if (with_messages && e.actions != lab08::to_string(schedule))
    return testing::AssertionFailure()
           << "rank " << rank << " executed (the library's log of piece calls and "
           << "send/recv):\n  " << e.actions << "\nits schedule says:\n  "
           << lab08::to_string(schedule);
  if (with_messages && !e.after_send_wait.empty())
    return testing::AssertionFailure()
           << "rank " << rank << " waited for a send to complete and then computed "
           << e.after_send_wait << " (the library's log of waits and piece calls): a stage "
           << "waits only for its receives; its sends travel while it computes, and are waited "
           << "for once the schedule is done";
  return testing::AssertionSuccess();
}

}  // namespace scalelab::pptest
