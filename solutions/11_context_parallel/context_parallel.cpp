// Lab 11: context parallelism: the zig-zag split of the sequence, ring attention forward and
// backward, and all-to-all (Ulysses) attention.
#include "context_parallel.hpp"

#include "common/errors.hpp"
#include "common/ops/flash_attention.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::lab11 {

namespace {
void require_split(int64_t T, int cp) {
  SCALELAB_REQUIRE(cp >= 1, "cp must be at least 1, got {}", cp);
  SCALELAB_REQUIRE(T >= 0 && T % (2 * cp) == 0,
                   "a sequence of {} tokens does not cut into 2 cp = {} equal chunks", T, 2 * cp);
}
}  // namespace

// ---- step 1 ----------------------------------------------------------------------------------

std::vector<int64_t> zigzag_positions(int64_t T, int cp, int rank) {
  require_split(T, cp);
  SCALELAB_REQUIRE(rank >= 0 && rank < cp, "rank {} is not one of the {} ranks", rank, cp);
  std::vector<int64_t> p;
  // BEGIN SOLUTION step 1: the global index of each of my rows, my early chunk then my late one
  const int64_t c = T / (2 * cp);
  for (const int64_t k : {static_cast<int64_t>(rank), 2 * cp - 1 - static_cast<int64_t>(rank)})
    for (int64_t i = 0; i < c; ++i) p.push_back(k * c + i);
  // END SOLUTION
  return p;
}

Owner zigzag_owner(int64_t t, int64_t T, int cp) {
  require_split(T, cp);
  SCALELAB_REQUIRE(t >= 0 && t < T, "token {} is not in a sequence of {}", t, T);
  Owner o;
  // BEGIN SOLUTION step 1: the rank holding token t, and its row there
  const int64_t c = T / (2 * cp), k = t / c;
  const bool early = k < cp;
  o.rank = static_cast<int>(early ? k : 2 * cp - 1 - k);
  o.row = (early ? 0 : c) + t % c;
  // END SOLUTION
  return o;
}

Tensor shard_sequence(const Tensor& x, int cp, int rank) {
  SCALELAB_CHECK(x.dim() >= 2, "shard_sequence: {} is not (B, T, ...)", x.str());
  const int64_t B = x.size(0), T = x.size(1);
  require_split(T, cp);
  SCALELAB_REQUIRE(rank >= 0 && rank < cp, "rank {} is not one of the {} ranks", rank, cp);
  std::vector<int64_t> shape = x.shape();
  shape[1] = T / cp;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  // BEGIN SOLUTION step 1: copy my two chunks of every batch row, each as one device copy
  const int64_t c = T / (2 * cp), width = c * (x.numel() / (B * T));
  const Tensor chunks = x.view({B * 2 * cp, width});  // row b*2cp + k: chunk k of batch row b
  Tensor mine = out.view({B * 2, width});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t k = h == 0 ? rank : 2 * cp - 1 - rank;
      mine.rows(2 * b + h, 2 * b + h + 1).copy_from(chunks.rows(b * 2 * cp + k, b * 2 * cp + k + 1));
    }
  // END SOLUTION
  return out;
}

Tensor unshard_sequence(const std::vector<Tensor>& shards) {
  SCALELAB_CHECK(!shards.empty() && shards[0].dim() >= 2, "unshard_sequence: no (B, T/cp) shards");
  const int cp = static_cast<int>(shards.size());
  const int64_t B = shards[0].size(0), T = shards[0].size(1) * cp;
  require_split(T, cp);
  std::vector<int64_t> shape = shards[0].shape();
  shape[1] = T;
  Tensor out = Tensor::empty(shape, shards[0].dtype(), shards[0].device());
  // BEGIN SOLUTION step 1: every rank's two chunks back in their places
  const int64_t c = T / (2 * cp), width = c * (out.numel() / (B * T));
  Tensor chunks = out.view({B * 2 * cp, width});
  for (int r = 0; r < cp; ++r) {
    const Tensor theirs = shards[r].view({B * 2, width});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < 2; ++h) {
        const int64_t k = h == 0 ? r : 2 * cp - 1 - r;
        chunks.rows(b * 2 * cp + k, b * 2 * cp + k + 1).copy_from(theirs.rows(2 * b + h, 2 * b + h + 1));
      }
  }
  // END SOLUTION
  return out;
}

// ---- step 2 ----------------------------------------------------------------------------------

Tensor ring_attention_forward(Tensor& y, const Tensor& q, const Tensor& kv, double scale,
                              comm::Communicator& cp) {
  const int n = cp.size(), r = cp.rank();
  const int64_t BH = q.size(1), c = q.size(2), hs = q.size(3);
  Tensor lse = Tensor::empty({2, BH, c}, ops::flash_attention_lse_dtype(q.dtype()), q.device());
  // BEGIN SOLUTION step 2: my queries against every rank's K/V block as it comes round the ring
  // One block's partial result, merged into query chunk i's running (y, lse) by the online
  // softmax; the first block a chunk sees writes it directly.
  Tensor y_b = Tensor::empty({BH, c, hs}, q.dtype(), q.device());
  Tensor lse_b = Tensor::empty({BH, c}, lse.dtype(), q.device());
  bool started[2] = {false, false};
  auto attend = [&](int i, const Tensor& block, int j, bool causal) {
    Tensor yi = chunk(y, i), li = lse_chunk(lse, i);
    const Tensor kj = chunk(kv_part(block, 0), j), vj = chunk(kv_part(block, 1), j);
    if (!started[i]) {
      ops::flash_attention_forward(yi, li, chunk(q, i), kj, vj, scale, causal);
      started[i] = true;
    } else {
      ops::flash_attention_forward(y_b, lse_b, chunk(q, i), kj, vj, scale, causal);
      ops::attention_merge(yi, li, y_b, lse_b);
    }
  };
  Tensor cur = kv;  // the block in hand: mine first, then rank r-1's, r-2's, ...
  for (int s = 0; s < n; ++s) {
    // double buffer: the next block arrives while this one is used; never more than these two.
    // The recv and the send are one step, posted as one batch: in flight from here (on NCCL a
    // lone send/recv starts only when it is waited for).
    Tensor next;
    std::vector<comm::Work> moving;
    if (s + 1 < n) {
      next = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
      moving = cp.send_recv_async({comm::P2POp::recv(next, (r - 1 + n) % n),
                                   comm::P2POp::send(cur, (r + 1) % n)});
    }
    // My chunks are r (early) and 2n-1-r (late); block `src` holds chunks src and 2n-1-src.
    const int src = (r - s + n) % n;
    if (src == r) {         // my own block: causal within each chunk, late sees early whole
      attend(0, cur, 0, true);
      attend(1, cur, 0, false);
      attend(1, cur, 1, true);
    } else if (src < r) {   // an earlier rank: both my chunks see its early chunk, not its late
      attend(0, cur, 0, false);
      attend(1, cur, 0, false);
    } else {                // a later rank: only my late chunk sees anything, both its chunks
      attend(1, cur, 0, false);
      attend(1, cur, 1, false);
    }
    if (s + 1 < n) {
      comm::wait_all(moving);
      cur = next;  // the block just used is freed here (unless it is my own)
    }
  }
  // END SOLUTION
  return lse;
}

// ---- step 3 ----------------------------------------------------------------------------------

void ring_attention_backward(Tensor& dq, Tensor& dkv, const Tensor& dy, const Tensor& q,
                             const Tensor& kv, const Tensor& y, const Tensor& lse, double scale,
                             comm::Communicator& cp) {
  const int n = cp.size(), r = cp.rank();
  const int64_t BH = q.size(1), c = q.size(2), hs = q.size(3);
  // BEGIN SOLUTION step 3: the blocks go round again, each with its dK/dV, which arrives home last
  Tensor dq_b = Tensor::empty({BH, c, hs}, q.dtype(), q.device());
  Tensor dk_b = dq_b.clone(), dv_b = dq_b.clone();
  ops::fill(dq, 0.0);
  Tensor cur = kv, dcur = Tensor::zeros(kv.shape(), kv.dtype(), kv.device());
  // One block's gradients, with the WHOLE attention's y and lse (so its probabilities are the
  // final ones): dq of chunk i +=, dk and dv of the block's chunk j +=.
  auto grad = [&](int i, int j, bool causal) {
    const Tensor kj = chunk(kv_part(cur, 0), j), vj = chunk(kv_part(cur, 1), j);
    ops::flash_attention_backward(dq_b, dk_b, dv_b, chunk(dy, i), chunk(q, i), kj, vj,
                                  chunk(y, i), lse_chunk(lse, i), scale, causal);
    Tensor dqi = chunk(dq, i), dkj = chunk(kv_part(dcur, 0), j), dvj = chunk(kv_part(dcur, 1), j);
    ops::add(dqi, dqi, dq_b);
    ops::add(dkj, dkj, dk_b);
    ops::add(dvj, dvj, dv_b);
  };
  for (int s = 0; s < n; ++s) {
    const int prev = (r - 1 + n) % n, next_rank = (r + 1) % n;
    Tensor next, dnext;
    std::vector<comm::Work> moving;
    if (s + 1 < n) {  // the next K/V block can come while this one is used (tag 0)
      next = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
      moving = cp.send_recv_async({comm::P2POp::recv(next, prev, 0),
                                   comm::P2POp::send(cur, next_rank, 0)});
    }
    const int src = (r - s + n) % n;  // the same blocks as the forward
    if (src == r) {
      grad(0, 0, true);
      grad(1, 0, false);
      grad(1, 1, true);
    } else if (src < r) {
      grad(0, 0, false);
      grad(1, 0, false);
    } else {
      grad(1, 0, false);
      grad(1, 1, false);
    }
    if (s + 1 < n) {  // its dK/dV, with my share added, follows it (tag 1)
      dnext = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
      std::vector<comm::Work> grads = cp.send_recv_async({comm::P2POp::recv(dnext, prev, 1),
                                                          comm::P2POp::send(dcur, next_rank, 1)});
      comm::wait_all(moving);
      comm::wait_all(grads);
      cur = next;
      dcur = dnext;
    }
  }
  // Every rank has added its share to the block in hand (rank r+1's): one last hop takes it home.
  if (n == 1) {
    dkv.copy_from(dcur);
  } else {
    std::vector<comm::Work> home = cp.send_recv_async({comm::P2POp::recv(dkv, (r - 1 + n) % n, 1),
                                                       comm::P2POp::send(dcur, (r + 1) % n, 1)});
    comm::wait_all(home);
  }
  // END SOLUTION
}

// ---- step 4 ----------------------------------------------------------------------------------

Tensor all_to_all_attention_forward(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v,
                                    int64_t n_head, double scale, comm::Communicator& cp,
                                    std::vector<Tensor>& kept) {
  const int n = cp.size();
  SCALELAB_REQUIRE(n_head % n == 0, "all-to-all attention: {} heads over {} ranks", n_head, n);
  Tensor lse;
  // BEGIN SOLUTION step 4: my heads over the whole sequence, one exchange in and one out
  // In: every rank sends rank j its rows of heads group j and gets the whole sequence of mine.
  const auto gather_heads = [&](const Tensor& mine) {
    const Tensor out = heads_out(mine, n_head, n);
    Tensor got = Tensor::empty(out.shape(), out.dtype(), out.device());
    cp.all_to_all(out, got);
    return to_sequence_order(got, n);  // (B NH/cp, T, hs)
  };
  const Tensor qh = gather_heads(q), kh = gather_heads(k), vh = gather_heads(v);
  Tensor yh = Tensor::empty(qh.shape(), qh.dtype(), qh.device());
  lse = Tensor::empty({qh.size(0), qh.size(1)}, ops::flash_attention_lse_dtype(qh.dtype()),
                      qh.device());
  ops::flash_attention_forward(yh, lse, qh, kh, vh, scale);  // plain causal: the whole sequence
  // Out: every rank gets its rows of every head back.
  const Tensor back = to_zigzag_order(yh, n);
  Tensor got = Tensor::empty(back.shape(), back.dtype(), back.device());
  cp.all_to_all(back, got);
  y.copy_from(heads_in(got, n_head, n));
  kept = {qh, kh, vh, yh};  // what the backward reads, in the head-split layout
  // END SOLUTION
  return lse;
}

void all_to_all_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dy,
                                   const Tensor& lse, const std::vector<Tensor>& kept,
                                   int64_t n_head, double scale, comm::Communicator& cp) {
  // BEGIN SOLUTION step 4: dy to my heads, their backward, each gradient back to its rows' rank
  const int n = cp.size();
  const Tensor out = heads_out(dy, n_head, n);
  Tensor got = Tensor::empty(out.shape(), out.dtype(), out.device());
  cp.all_to_all(out, got);
  const Tensor dyh = to_sequence_order(got, n);
  Tensor dqh = Tensor::empty(dyh.shape(), dyh.dtype(), dyh.device());
  Tensor dkh = dqh.clone(), dvh = dqh.clone();
  ops::flash_attention_backward(dqh, dkh, dvh, dyh, kept.at(0), kept.at(1), kept.at(2),
                                kept.at(3), lse, scale);
  for (auto [grad, mine] : {std::pair{&dqh, &dq}, {&dkh, &dk}, {&dvh, &dv}}) {
    const Tensor back = to_zigzag_order(*grad, n);
    Tensor mine_back = Tensor::empty(back.shape(), back.dtype(), back.device());
    cp.all_to_all(back, mine_back);
    mine->copy_from(heads_in(mine_back, n_head, n));
  }
  // END SOLUTION
}

}  // namespace scalelab::lab11
