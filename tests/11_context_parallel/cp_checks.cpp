// The graders' shared checks and the whole-model comparison: see cp_checks.hpp.
#include "tests/11_context_parallel/cp_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace cptest {

std::string sends_problem(const comm::CommStats& did, int64_t blocks, std::size_t kv_bytes) {
  const comm::CommCount sends = comm::comm_total(did, "", "send");
  std::int64_t other = 0;
  for (const auto& [key, count] : did)
    if (key.op != "send" && key.op != "recv") other += count.calls;
  const int64_t want = blocks * static_cast<int64_t>(kv_bytes);
  if (sends.bytes == want && other == 0) return "";
  return fmt::format("sent {} bytes in {} messages (and {} other operations); want {} K/V "
                     "blocks of {} bytes = {} bytes, by send/recv alone",
                     sends.bytes, sends.calls, other, blocks, kv_bytes, want);
}

std::string overlap_problem(const std::vector<exec_log::Event>& log, const comm::Communicator& cp,
                            std::size_t kv_bytes, int64_t blocks) {
  const auto is_compute = [](const exec_log::Event& e) {
    return e.object == nullptr && e.what.rfind("flash_attention", 0) == 0;
  };
  int64_t received = 0, overlapped = 0;
  std::vector<std::string> seen;
  for (std::size_t i = 0; i < log.size(); ++i) {
    const exec_log::Event& post = log[i];
    if (post.what != "recv" || post.group != cp.name() ||
        post.bytes != static_cast<std::int64_t>(kv_bytes))
      continue;
    ++received;
    bool computed = false;  // a block's compute started since the post ...
    std::size_t w = i + 1;
    for (; w < log.size(); ++w) {
      const exec_log::Event& e = log[w];
      if (e.what == "wait" && e.op == "recv" && e.group == post.group && e.seq == post.seq) break;
      computed = computed || is_compute(e);
    }
    if (w == log.size()) {
      seen.push_back(fmt::format("recv #{} never waited for", post.seq));
    } else if (computed) {  // ... before the first wait for it
      ++overlapped;
    } else {
      seen.push_back(fmt::format("recv #{} waited for before any block computed", post.seq));
    }
  }
  if (overlapped >= blocks) return "";
  return fmt::format("{} of {} K/V block receives were in flight while a block computed (posted "
                     "before a flash attention, waited for after it started); want at least {}: "
                     "post the next block's recv (and send this one), compute, then wait{}{}",
                     overlapped, received, blocks, seen.empty() ? "" : ". Seen: ",
                     fmt::format("{}", fmt::join(seen, "; ")));
}

void model_matches_single_device(DType dt, lab11::Attention attention, int64_t n_head) {
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
  model.set_mappings(lab11::make_cp_mappings(cp, zigzag_positions(T, n, cp.rank()), attention,
                                             config.n_head));
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

}  // namespace cptest
