// The graders' shared checks and the whole-model comparison: see cp_checks.hpp.
#include "tests/11_context_parallel/cp_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/errors.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/global_loss.hpp"

namespace cptest {

int64_t heap_allowance(int64_t bh, int64_t c, int64_t hs, bool backward) {
  const Tensor q = Tensor::uniform({bh, c, hs}, 7), k = Tensor::uniform({bh, c, hs}, 8),
               v = Tensor::uniform({bh, c, hs}, 9), dy = Tensor::uniform({bh, c, hs}, 10);
  Tensor y = Tensor::empty({bh, c, hs}), y_b = Tensor::empty({bh, c, hs});
  Tensor lse = Tensor::empty({bh, c}, ops::flash_attention_lse_dtype(DType::f32));
  Tensor lse_b = Tensor::empty({bh, c}, lse.dtype());
  Tensor dq = Tensor::empty({bh, c, hs}), dk = dq.clone(), dv = dq.clone();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  ops::flash_attention_forward(y, lse, q, k, v, scale, false);
  int64_t scratch = 0;
  const auto measure = [&](const std::function<void()>& kernel) {
    const labtest::MemoryUse m = labtest::memory_use_of(kernel);
    scratch = std::max(scratch, m.heap.peak - m.tensor_peak);
  };
  if (backward) {
    measure([&] { ops::flash_attention_backward(dq, dk, dv, dy, q, k, v, y, lse, scale, false); });
  } else {
    measure([&] { ops::flash_attention_forward(y_b, lse_b, q, k, v, scale, false); });
    measure([&] { ops::attention_merge(y, lse, y_b, lse_b); });
  }
  return kHeapBookkeeping + scratch;
}

testing::AssertionResult close_chunks(const Tensor& got, const Tensor& want, double rtol,
                                      double atol, const std::string& what) {
  train::Diff d = train::compare(got, want);
  d.shape.clear();  // str() names the element by its flat index only: its place is told below
  testing::AssertionResult mine = testing::AssertionSuccess();
  if (!d.within(rtol, atol)) {
    const int cp = labtest::world().size(), r = labtest::world().rank();
    std::vector<int64_t> at(got.dim());  // the worst element's index, dimension by dimension
    int64_t flat = std::max<int64_t>(d.worst_index, 0);
    for (int64_t k = got.dim() - 1; k >= 0; --k) {
      at[k] = flat % got.size(k);
      flat /= got.size(k);
    }
    const bool kv = got.dim() == 5;  // (2 K/V, 2 chunks, BH, c, hs)
    const int64_t part = kv ? at[0] : 0, i = kv ? at[1] : at[0], h = kv ? at[2] : at[1];
    const int64_t row = kv ? at[3] : at[2], c = kv ? got.size(3) : got.size(2);
    const int64_t token = (i == 0 ? r : 2 * cp - 1 - r) * c + row;
    std::string where = fmt::format("{}{} chunk {} (your {} chunk), head {} (of batch x heads), "
                                    "row {} (token {} of the sequence)",
                                    kv ? (part == 0 ? "dK, " : "dV, ") : "",
                                    kv ? "key" : "query", i, i == 0 ? "early" : "late", h, row,
                                    token);
    if (got.dim() >= 4) where += fmt::format(", column {}", at.back());
    mine = testing::AssertionFailure() << what << fmt::format(" not within rtol {:g} atol {:g}: ",
                                                              rtol, atol)
                                       << d.str() << "; the worst element is " << where;
  }
  return labtest::on_every_rank(mine);
}

std::string sends_problem(const comm::Traffic& did, int64_t blocks, std::size_t kv_bytes) {
  int64_t bytes = 0, messages = 0;
  std::vector<std::string> others;  // every row of the ledger that is not a send or a receive
  for (const auto& [key, count] : did) {
    if (key.op == "send") bytes += count.bytes, messages += count.calls;
    else if (key.op != "recv")
      others.push_back(fmt::format("{} x{}", comm::traffic_key_str(key), count.calls));
  }
  const int64_t want = blocks * static_cast<int64_t>(kv_bytes);
  if (bytes == want && others.empty()) return "";
  return fmt::format("sent {} bytes in {} messages (and {} other operations{}{}); want {} K/V "
                     "blocks of {} bytes = {} bytes, by send/recv alone",
                     bytes, messages, others.size(), others.empty() ? "" : ": ",
                     fmt::join(others, ", "), blocks, kv_bytes, want);
}

std::string work_problem(const ops::WorkCount& did, int64_t bh, int64_t c, int64_t hs,
                         const comm::Communicator& cp, bool backward) {
  const int64_t want = zigzag_attention_flops(bh, c, hs, cp.size(), cp.rank(), backward);
  if (did.matmul_flops == want) return "";
  return fmt::format(
      "the ring {} did {} FLOPs of matrix multiplies in {} calls, {} the {} of this rank's two "
      "query chunks against only the key chunks they see ({}); every matmul counts, separate, "
      "batched or fused in flash attention (ops::work_stats(), common/ops/work.hpp): compare "
      "work_stats().matmul_flops around each block you compute with its (query, key) pairs",
      backward ? "backward" : "forward", did.matmul_flops, did.matmul_calls,
      did.matmul_flops > want ? "more than" : "fewer than", want,
      did.matmul_flops > want ? "fully masked blocks computed: masked blocks skipped?"
                              : "a block the queries see not computed");
}

namespace {
// The K/V block receives of one ring call (indices into the log), among its receives of a
// block's size on cp's group. Forward: all of them. Backward: the dK/dV that follow the blocks
// are the same size, so they are told apart by tag: the K/V blocks' is the tag of the call's
// first block-sized send on cp (a ring's first message is its own K/V block; whatever tags the
// dK/dV and the last hop home use); or, all on that one tag, by order (each step's first, as in
// README's hint; the last is the dK/dV home).
std::vector<std::size_t> kv_receives(const std::vector<exec_log::Event>& log,
                                     const comm::Communicator& cp, std::size_t kv_bytes,
                                     bool backward) {
  const auto block_sized = [&](const exec_log::Event& e, const char* what) {
    return e.what == what && e.group == cp.name() &&
           e.bytes == static_cast<std::int64_t>(kv_bytes);
  };
  std::vector<std::size_t> all;
  for (std::size_t i = 0; i < log.size(); ++i)
    if (block_sized(log[i], "recv")) all.push_back(i);
  if (!backward) return all;
  const auto first_send = std::find_if(
      log.begin(), log.end(), [&](const exec_log::Event& e) { return block_sized(e, "send"); });
  if (first_send == log.end()) return all;  // nothing sent: judged on every receive
  std::vector<std::size_t> kv;
  for (const std::size_t i : all)
    if (log[i].tag == first_send->tag) kv.push_back(i);
  if (kv.size() < all.size()) return kv;
  kv.clear();
  for (std::size_t k = 0; k + 1 < all.size(); k += 2) kv.push_back(all[k]);
  return kv;
}

bool is_compute(const exec_log::Event& e) {
  return e.object == nullptr && e.what.rfind("flash_attention", 0) == 0;
}
}  // namespace

std::string direction_problem(const std::vector<exec_log::Event>& log,
                              const comm::Communicator& cp, const std::string& what) {
  const int n = cp.size(), r = cp.rank();
  const int next = cp.world_ranks()[(r + 1) % n], prev = cp.world_ranks()[(r - 1 + n) % n];
  std::vector<std::string> wrong;
  for (const exec_log::Event& e : log) {
    if (e.group != cp.name() || (e.what != "send" && e.what != "recv")) continue;
    const bool send = e.what == "send";
    if (e.peer == (send ? next : prev)) continue;
    wrong.push_back(fmt::format("{} #{} {} rank {}{}", e.what, e.seq, send ? "to" : "from",
                                e.peer, e.peer == cp.world_ranks()[r] ? " (itself)" : ""));
  }
  if (wrong.empty()) return "";
  return fmt::format("{}: {} not between ring neighbours: {}; on a ring a rank sends only to the "
                     "next rank, {} here, and receives only from the previous one, {} here: a "
                     "block reaches the others by being passed on, one hop per step",
                     what,
                     wrong.size() == 1 ? "a message" : fmt::format("{} messages", wrong.size()),
                     fmt::join(wrong, ", "), next, prev);
}

RingWatch::RingWatch(const exec_log::Recording& rec, const comm::Communicator& cp,
                     std::string what) {
  if (!comm::overlap()) return;  // the no-overlap baseline holds the compute hook
  armed_ = true;
  exec_log::set_compute_hook([&rec, &cp, what = std::move(what)] {
    const std::string p = direction_problem(rec.events(), cp, what);
    if (p.empty()) return;
    // Ended here, not thrown: unwinding would destroy the test's communicator, which waits for
    // the unmatched operation. exit_all prints the verdict the test main would (every rank
    // alike when all of them stop here; else this rank's, after a few seconds, and aborts).
    const testing::TestInfo* test = testing::UnitTest::GetInstance()->current_test_info();
    const std::string name = test == nullptr ? std::string("?")
                                             : fmt::format("{}.{}", test->test_suite_name(),
                                                           test->name());
    exit_all(kExitFailed, fmt::format("[scalelab] verdict: failed: {} on rank {}: {} (stopped at "
                                      "its next compute: a message to or from the wrong rank may "
                                      "never be matched, and the ring would hang)",
                                      name, world_rank(), p));
  });
}

RingWatch::~RingWatch() {
  if (armed_) exec_log::set_compute_hook({});
}

std::string overlap_problem(const std::vector<exec_log::Event>& log, const comm::Communicator& cp,
                            std::size_t kv_bytes, int64_t blocks, bool backward) {
  const std::vector<std::size_t> kv = kv_receives(log, cp, kv_bytes, backward);
  const auto received = static_cast<int64_t>(kv.size());
  int64_t overlapped = 0;
  std::vector<std::string> seen;
  const auto flash_calls = [&](std::size_t from, std::size_t to) {
    return std::count_if(log.begin() + static_cast<std::ptrdiff_t>(from),
                         log.begin() + static_cast<std::ptrdiff_t>(to), is_compute);
  };
  for (std::size_t k = 0; k < kv.size(); ++k) {
    const exec_log::Event& post = log[kv[k]];
    std::size_t w = kv[k] + 1;  // its first wait
    for (; w < log.size(); ++w) {
      const exec_log::Event& e = log[w];
      if (e.what == "wait" && e.op == "recv" && e.group == post.group && e.seq == post.seq) break;
    }
    if (w == log.size()) {
      seen.push_back(fmt::format("recv #{} never waited for", post.seq));
      continue;
    }
    // In flight for a whole block: compute between the post and the wait, and none between the
    // wait and the next block's post (a wait after the first of a block's flash calls leaves
    // the rest of that block's compute, and the next receive's post, behind it). After the last
    // receive's wait comes the last block, computed in no more calls than the one before it.
    const auto during = flash_calls(kv[k] + 1, w);
    const bool last = k + 1 == kv.size();
    const auto after = flash_calls(w, last ? log.size() : kv[k + 1]);
    if (during == 0) {
      seen.push_back(fmt::format("recv #{} waited for before any block computed", post.seq));
    } else if (last ? after > during : after > 0) {
      seen.push_back(fmt::format("recv #{} waited for while a block was still computing ({} flash "
                                 "attention calls before the wait, {} after it{})",
                                 post.seq, during, after,
                                 last ? "" : " before the next block's receive was posted"));
    } else {
      ++overlapped;
    }
  }
  if (overlapped >= blocks) return "";
  if (received == 0)
    return fmt::format("no receive of one K/V block's size ({} bytes: this rank's K and V, packed "
                       "as kv) on the ring's communicator; want at least {} in flight while a "
                       "block computes: receive each block as one message, into a tensor shaped "
                       "like kv",
                       kv_bytes, blocks);
  return fmt::format("{} of {} K/V block receives{} were in flight while a block computed "
                     "(posted before its flash attention, waited for after all of it); want at "
                     "least {}: post the next block's recv (and send this one), compute, then "
                     "wait{}{}",
                     overlapped, received, backward ? " (not counting the dK/dV)" : "", blocks,
                     seen.empty() ? "" : ". Seen: ", fmt::format("{}", fmt::join(seen, "; ")));
}

std::string batch_problem(const std::vector<exec_log::Event>& log, const comm::Communicator& cp,
                          std::size_t kv_bytes) {
  std::vector<std::string> alone;
  int64_t received = 0;
  for (const exec_log::Event& post : log) {
    if (post.what != "recv" || post.group != cp.name() ||
        post.bytes != static_cast<std::int64_t>(kv_bytes))
      continue;
    ++received;
    const auto same_batch_send = [&](const exec_log::Event& e) {
      return e.what == "send" && e.group == post.group && e.batch == post.batch;
    };
    const bool with_send =
        post.batch != 0 && std::any_of(log.begin(), log.end(), same_batch_send);
    if (!with_send) alone.push_back(fmt::format("recv #{}", post.seq));
  }
  if (alone.empty()) return "";
  return fmt::format("{} of {} K/V block receives were not posted in one batch with a send ({}): "
                     "post each ring step's receive and send together "
                     "(Communicator::send_recv_async); on NCCL a lone recv_async or send_async "
                     "starts only when it is waited for, so nothing would travel while you compute",
                     alone.size(), received, fmt::join(alone, ", "));
}

std::string dkdv_posted_problem(const std::vector<exec_log::Event>& log,
                                const comm::Communicator& cp, std::size_t kv_bytes) {
  const std::vector<std::size_t> kv = kv_receives(log, cp, kv_bytes, /*backward=*/true);
  std::vector<std::string> early;
  int64_t dkdv = 0;
  bool computed = false;  // a block's compute since the previous dK/dV receive (or the start)
  for (std::size_t i = 0; i < log.size(); ++i) {
    const exec_log::Event& e = log[i];
    if (is_compute(e)) computed = true;
    if (e.what != "recv" || e.group != cp.name() ||
        e.bytes != static_cast<std::int64_t>(kv_bytes) ||
        std::find(kv.begin(), kv.end(), i) != kv.end())
      continue;
    ++dkdv;
    if (!computed) early.push_back(fmt::format("recv #{} (tag {})", e.seq, e.tag));
    computed = false;
  }
  if (early.empty()) return "";
  return fmt::format("{} of {} dK/dV receives posted before the block they belong to was computed "
                     "here ({}): a block's dK/dV leave the previous rank only after it computed "
                     "on that block, so post their receive after your compute (with the send of "
                     "yours, one batch); posted before it, under comm::set_overlap(false) and on "
                     "NCCL every rank waits for it before computing, and the ring deadlocks",
                     early.size(), dkdv, fmt::join(early, ", "));
}

std::string sends_waited_problem(const std::vector<exec_log::Event>& log,
                                 const comm::Communicator& cp) {
  std::vector<std::string> seen;
  int64_t sends = 0;
  for (std::size_t i = 0; i < log.size(); ++i) {
    const exec_log::Event& post = log[i];
    if (post.what != "send" || post.group != cp.name()) continue;
    ++sends;
    std::size_t next = log.size(), waited = log.size();  // the next send of its stream, its wait
    for (std::size_t j = i + 1; j < log.size(); ++j) {
      const exec_log::Event& e = log[j];
      if (next == log.size() && e.what == "send" && e.group == post.group &&
          e.peer == post.peer && e.tag == post.tag)
        next = j;
      if (e.what == "wait" && e.op == "send" && e.group == post.group && e.seq == post.seq) {
        waited = j;
        break;
      }
    }
    if (waited == log.size())
      seen.push_back(fmt::format("send #{} (to rank {}, tag {}) never waited for before the call "
                                 "returned", post.seq, post.peer, post.tag));
    else if (next < waited)
      seen.push_back(fmt::format("send #{} (to rank {}, tag {}) waited for only after the next "
                                 "send to that rank was posted", post.seq, post.peer, post.tag));
  }
  if (seen.empty()) return "";
  return fmt::format("{} of its {} sends not waited for in time: {}. Until its Work is "
                     "waited for, a send may still be reading its tensor: wait for the sends of "
                     "a step as well as its receives before that buffer is used again, and before "
                     "returning", seen.size(), sends, fmt::join(seen, "; "));
}

namespace {

// The grader's own ring forward (step 3's model is graded without the attendee's step 2): every
// rank's K/V block all-gathered, then each of my two query chunks against every key chunk it
// sees (earlier chunks whole, its own causally), merged by the online softmax. Memory and bytes
// are not graded here: the result is what a ring gives, in another order of merges.
Tensor grader_ring_forward(Tensor& yc, const Tensor& qc, const Tensor& kv, double scale,
                           comm::Communicator& cp) {
  const int n = cp.size(), r = cp.rank();
  const int64_t BH = qc.size(1), c = qc.size(2), hs = qc.size(3);
  std::vector<int64_t> shape = kv.shape();
  shape.insert(shape.begin(), n);
  Tensor all = Tensor::empty(shape, kv.dtype(), kv.device());
  cp.all_gather(kv, all);
  Tensor lse = Tensor::empty({2, BH, c}, ops::flash_attention_lse_dtype(qc.dtype()), qc.device());
  Tensor y_b = Tensor::empty({BH, c, hs}, qc.dtype(), qc.device());
  Tensor lse_b = Tensor::empty({BH, c}, lse.dtype(), qc.device());
  for (int i = 0; i < 2; ++i) {
    const int a = i == 0 ? r : 2 * n - 1 - r;  // my chunk i's place in the sequence
    Tensor yi = lab11::chunk(yc, i), li = lab11::lse_chunk(lse, i);
    bool started = false;
    for (int src = 0; src < n; ++src) {
      const Tensor block = all.view({n, kv.numel()}).rows(src, src + 1).view(kv.shape());
      for (int j = 0; j < 2; ++j) {
        const int b = j == 0 ? src : 2 * n - 1 - src;
        if (b > a) continue;
        const Tensor k = lab11::chunk(lab11::kv_part(block, 0), j);
        const Tensor v = lab11::chunk(lab11::kv_part(block, 1), j);
        ops::flash_attention_forward(started ? y_b : yi, started ? lse_b : li,
                                     lab11::chunk(qc, i), k, v, scale, b == a);
        if (started) ops::attention_merge(yi, li, y_b, lse_b);
        started = true;
      }
    }
  }
  return lse;
}

// The given context-parallel mappings with the grader's ring forward in place of step 2's.
class GraderForward final : public nn::Mappings {
 public:
  GraderForward(std::shared_ptr<const nn::Mappings> given, comm::Communicator& cp)
      : given_(std::move(given)), cp_(cp) {}
  bool replaces_attention() const override { return true; }
  Tensor attention_forward(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v,
                           double scale, std::vector<Tensor>&) const override {
    const Tensor qc = lab11::to_chunks(q), kv = lab11::pack_kv(k, v);
    Tensor yc = Tensor::empty(qc.shape(), qc.dtype(), qc.device());
    Tensor lse = grader_ring_forward(yc, qc, kv, scale, cp_);
    lab11::from_chunks(y, yc);
    return lse;
  }
  void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dy, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& y, const Tensor& lse,
                          const std::vector<Tensor>& kept, double scale) const override {
    given_->attention_backward(dq, dk, dv, dy, q, k, v, y, lse, kept, scale);
  }
  Tensor embedding_forward(const Tensor& wte, int64_t lo, const Tensor& wpe,
                           const Tensor& tokens) const override {
    return given_->embedding_forward(wte, lo, wpe, tokens);
  }
  void embedding_backward(Tensor& dwte, int64_t lo, Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens) const override {
    given_->embedding_backward(dwte, lo, dwpe, dout, tokens);
  }

 private:
  std::shared_ptr<const nn::Mappings> given_;
  comm::Communicator& cp_;
};

}  // namespace

namespace {
// The model test's set-up: tiny's shape at a 4x longer context on cp = every rank, one global
// batch, and the single device's loss (and gradients, after its backward) on it.
struct ModelCase {
  ModelConfig config;
  int64_t T = 0;
  data::Batch batch;
  nn::GPTOptions options;
};

ModelCase model_case(DType dt, int64_t n_head) {
  ModelCase c;
  c.config = labtest::test_model(2);
  if (n_head > 0) c.config.n_head = n_head;
  c.T = 4 * c.config.block_size;  // a long context: 4 x tiny's block size
  c.config.block_size = c.T;
  const data::Sampler sampler(labtest::synthetic_corpus(7), 2, c.T, 99);
  c.batch = sampler.batch(0);
  c.options = nn::GPTOptions{.seed = 1234, .compute_dtype = dt, .flash_attention = true};
  return c;
}
}  // namespace

void model_loss_matches_single_device(DType dt) {
  comm::Communicator cp = labtest::new_world();
  const int n = cp.size();
  const ModelCase c = model_case(dt, 0);
  nn::GPT single(c.config, c.options);
  const double single_loss = single.forward(c.batch.x, c.batch.y);
  // The last block's output, this rank's zig-zag rows of the single device's: at initialisation
  // the loss is about ln(vocab) whatever the attention attends to (a ring that pairs queries with
  // the wrong rank's keys moves it by ~1e-6 of itself), the hidden states are not.
  const Tensor want_x = zigzag_rows(single.activations().head.x, n, cp.rank());

  nn::GPT model(c.config, c.options);
  model.set_mappings(lab11::make_cp_mappings(cp, zigzag_positions(c.T, n, cp.rank()),
                                             lab11::Attention::ring, c.config.n_head));
  labtest::Explain why(model, c.options, {.positions = zigzag_positions(c.T, n, cp.rank())});
  const auto rows = [&](const Tensor& t) { return zigzag_rows(t, n, cp.rank()); };
  const double local = model.forward(rows(c.batch.x), rows(c.batch.y));
  const double loss = train::global_loss(local, cp);
  why.step_done(c.batch, /*gradients=*/false);
  const double rel = dt == DType::bf16 ? 2e-3 : 1e-5;
  testing::AssertionResult ok = testing::AssertionSuccess();
  if (std::abs(loss - single_loss) > rel * std::abs(single_loss))
    ok = testing::AssertionFailure() << "loss " << loss << ", single device " << single_loss
                                     << " (rtol " << rel << ")";
  EXPECT_TRUE(labtest::on_every_rank(ok, why));
  const Tensor& got_x = model.activations().head.x;
  const double atol = (dt == DType::bf16 ? 3e-2 : 1e-5) * labtest::max_abs(want_x);
  EXPECT_TRUE(labtest::close_on_every_rank(got_x, want_x, 0, atol, why));
}

void model_matches_single_device(DType dt, lab11::Attention attention, int64_t n_head,
                                 bool grader_forward) {
  comm::Communicator cp = labtest::new_world();
  const int n = cp.size();
  ModelConfig config = labtest::test_model(2);
  if (n_head > 0) config.n_head = n_head;
  const int64_t T = 4 * config.block_size;  // a long context: 4 x tiny's block size
  config.block_size = T;
  const data::Sampler sampler(labtest::synthetic_corpus(7), 2, T, 99);
  const data::Batch batch = sampler.batch(0);
  const nn::GPTOptions options{.seed = 1234, .compute_dtype = dt, .flash_attention = true};

  nn::GPT single(config, options);
  const double single_loss = single.forward(batch.x, batch.y);
  single.backward();

  nn::GPT model(config, options);
  std::shared_ptr<const nn::Mappings> mappings =
      lab11::make_cp_mappings(cp, zigzag_positions(T, n, cp.rank()), attention, config.n_head);
  if (grader_forward) mappings = std::make_shared<GraderForward>(mappings, cp);
  model.set_mappings(mappings);
  // a failure names the first tensor that left the twin (its positions: the grader's zig-zag)
  labtest::Explain why(model, options, {.positions = zigzag_positions(T, n, cp.rank())});
  const double loss = lab11::cp_forward_backward(
      model, batch.x, batch.y, cp, [&](const Tensor& t) { return zigzag_rows(t, n, cp.rank()); });
  why.step_done(batch);
  const Tensor got = model.params().grads(), want = single.params().grads();
  const auto loss_near = [&](double rel) {  // the same loss on every rank
    if (std::abs(loss - single_loss) <= rel * std::abs(single_loss))
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "loss " << loss << ", single device " << single_loss << " (rtol " << rel << ")";
  };
  if (dt == DType::bf16) {
    EXPECT_TRUE(labtest::on_every_rank(loss_near(2e-3), why));
    EXPECT_TRUE(labtest::close_on_every_rank(got, want, 0, 3e-2 * labtest::max_abs(want), why));
  } else {
    EXPECT_TRUE(labtest::on_every_rank(loss_near(1e-5), why));
    EXPECT_TRUE(labtest::close_on_every_rank(got, want, labtest::kAllReduceRtol,
                                             labtest::kAllReduceAtol, why));
  }
}

std::string model_runs_on_sim_as_on_host(lab11::Attention attention, bool backward,
                                         bool grader_forward) {
  comm::Communicator cp = labtest::new_world();
  const int n = cp.size();
  std::vector<std::string> problems;
  for (DType dt : {DType::f32, DType::bf16}) {
    // all-to-all: 4 heads, which split over 1, 2 and 4 ranks (as the model tests)
    ModelCase c = model_case(dt, attention == lab11::Attention::all_to_all ? 4 : 0);
    const auto rows = [&](const Tensor& t) { return zigzag_rows(t, n, cp.rank()); };
    // One run: the loss, and the gradients after a backward or else the last block's output.
    const auto run = [&](Device device) {
      nn::GPTOptions options = c.options;
      options.device = device;
      auto model = std::make_unique<nn::GPT>(c.config, options);
      std::shared_ptr<const nn::Mappings> mappings = lab11::make_cp_mappings(
          cp, zigzag_positions(c.T, n, cp.rank()), attention, c.config.n_head);
      if (grader_forward) mappings = std::make_shared<GraderForward>(mappings, cp);
      model->set_mappings(mappings);
      double loss = 0;
      if (backward) {
        loss = lab11::cp_forward_backward(*model, c.batch.x, c.batch.y, cp, [&](const Tensor& t) {
          return rows(t).to(device);
        });
      } else {
        loss = train::global_loss(
            model->forward(rows(c.batch.x).to(device), rows(c.batch.y).to(device)), cp);
      }
      const Tensor out = backward ? model->params().grads() : model->activations().head.x;
      return std::make_pair(loss, out);
    };
    const std::string what = fmt::format("{}, {}", lab11::attention_name(attention), dtype_name(dt));
    const auto [want, want_out] = run(Device::cpu());
    labtest::collective_run_on_sim([&] {
      const auto [got, got_out] = run(Device::sim());
      problems.push_back(labtest::step_same_on_sim(
          what + ": ", want, got, backward ? "the gradients" : "the last block's output", want_out,
          got_out));
    });
  }
  return labtest::joined(problems);
}

}  // namespace cptest
