// The grader's reference ring (and its planted variants): see cp_checks.hpp.
#include "tests/11_context_parallel/cp_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace cptest {

namespace {
Tensor lse_chunk(const Tensor& lse, int i) {
  const int64_t BH = lse.size(1), c = lse.size(2);
  return lse.view({2, BH * c}).rows(i, i + 1).view({BH, c});
}
}  // namespace

Tensor reference_ring_forward(Tensor& y, const Tensor& q, const Tensor& kv, double scale,
                              comm::Communicator& cp, Variant variant) {
  const int n = cp.size(), r = cp.rank();
  const int64_t BH = q.size(1), c = q.size(2), hs = q.size(3);
  Tensor lse = Tensor::empty({2, BH, c}, ops::flash_attention_lse_dtype(q.dtype()), q.device());
  Tensor y_b = Tensor::empty({BH, c, hs}, q.dtype(), q.device());
  Tensor lse_b = Tensor::empty({BH, c}, lse.dtype(), q.device());
  bool started[2] = {false, false};
  auto attend = [&](int i, const Tensor& block, int j, bool causal) {
    Tensor yi = lab11::chunk(y, i), li = lse_chunk(lse, i);
    const Tensor kj = lab11::chunk(lab11::kv_part(block, 0), j),
                 vj = lab11::chunk(lab11::kv_part(block, 1), j);
    Tensor& o = started[i] ? y_b : yi;
    Tensor& l = started[i] ? lse_b : li;
    ops::flash_attention_forward(o, l, lab11::chunk(q, i), kj, vj, scale, causal);
    if (started[i]) ops::attention_merge(yi, li, y_b, lse_b);
    started[i] = true;
  };
  // the block of rank src: its chunks src and 2n-1-src against mine, r and 2n-1-r
  auto use = [&](const Tensor& block, int src) {
    if (src == r) {
      attend(0, block, 0, true), attend(1, block, 0, false), attend(1, block, 1, true);
    } else if (src < r) {
      attend(0, block, 0, false), attend(1, block, 0, false);
    } else {
      attend(1, block, 0, false), attend(1, block, 1, false);
    }
    if (variant == Variant::no_causal_skip && src != r) {
      // planted: computes the two fully masked blocks too (and throws them away)
      Tensor junk = y_b.clone(), junk_lse = lse_b.clone();
      const int late = src < r ? 1 : 0;  // (0, 1) and (1, 1) before me; (0, 1) and (0, 0) after
      const int masked[2][2] = {{0, 1}, {late, late}};
      for (const auto& ij : masked)
        ops::flash_attention_forward(junk, junk_lse, lab11::chunk(q, ij[0]),
                                     lab11::chunk(lab11::kv_part(block, 0), ij[1]),
                                     lab11::chunk(lab11::kv_part(block, 1), ij[1]), scale, false);
    }
  };
  if (variant == Variant::all_gather) {  // planted: every block at once, no ring
    std::vector<int64_t> shape = kv.shape();
    shape.insert(shape.begin(), n);
    Tensor all = Tensor::empty(shape, kv.dtype(), kv.device());
    cp.all_gather(kv, all);
    for (int s = 0; s < n; ++s) {
      const int src = (r - s + n) % n;
      use(all.view({n, kv.numel()}).rows(src, src + 1).view(kv.shape()), src);
    }
    return lse;
  }
  Tensor cur = kv;
  for (int s = 0; s < n; ++s) {
    Tensor next;
    comm::Work got, sent;
    if (s + 1 < n) {
      next = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
      got = cp.recv_async(next, (r - 1 + n) % n);
      sent = cp.send_async(cur, (r + 1) % n);
    }
    if (variant == Variant::waits_first && s + 1 < n) got.wait(), sent.wait();  // planted
    use(cur, (r - s + n) % n);
    if (s + 1 < n) {
      got.wait(), sent.wait();
      cur = next;
    }
  }
  return lse;
}

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
  const double loss = lab11::cp_forward_backward(
      model, batch.x, batch.y, cp, [&](const Tensor& t) { return zigzag_rows(t, n, cp.rank()); });
  const Tensor got = model.params().grads(), want = single.params().grads();
  if (dt == DType::bf16) {
    EXPECT_NEAR(loss, single_loss, 2e-3 * std::abs(single_loss));
    EXPECT_TRUE(labtest::close_on_every_rank(got, want, 0, 3e-2 * labtest::max_abs(want)));
  } else {
    EXPECT_NEAR(loss, single_loss, 1e-5 * std::abs(single_loss));
    EXPECT_TRUE(labtest::close_on_every_rank(got, want, labtest::kAllReduceRtol,
                                             labtest::kAllReduceAtol));
  }
}

}  // namespace cptest
