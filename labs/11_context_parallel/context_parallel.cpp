// Starter generated from solutions/11_context_parallel/context_parallel.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 2f5f840adaf13df1 (lets make-labs see your edits).
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
  // TODO step 1: the global index of each of my rows, my early chunk then my late one
  throw scalelab::NotImplemented(
      "lab 11 step 1: the global index of each of my rows, my early chunk then my late one (README.md#step-1)");
  return p;
}

Owner zigzag_owner(int64_t t, int64_t T, int cp) {
  require_split(T, cp);
  SCALELAB_REQUIRE(t >= 0 && t < T, "token {} is not in a sequence of {}", t, T);
  Owner o;
  // TODO step 1: the rank holding token t, and its row there
  throw scalelab::NotImplemented(
      "lab 11 step 1: the rank holding token t, and its row there (README.md#step-1)");
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
  // TODO step 1: copy my two chunks of every batch row, each as one device copy
  throw scalelab::NotImplemented(
      "lab 11 step 1: copy my two chunks of every batch row, each as one device copy (README.md#step-1)");
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
  // TODO step 1: every rank's two chunks back in their places
  throw scalelab::NotImplemented(
      "lab 11 step 1: every rank's two chunks back in their places (README.md#step-1)");
  return out;
}

// ---- step 2 ----------------------------------------------------------------------------------

Tensor ring_attention_forward(Tensor& y, const Tensor& q, const Tensor& kv, double scale,
                              comm::Communicator& cp) {
  const int n = cp.size(), r = cp.rank();
  const int64_t BH = q.size(1), c = q.size(2), hs = q.size(3);
  Tensor lse = Tensor::empty({2, BH, c}, ops::flash_attention_lse_dtype(q.dtype()), q.device());
  // TODO step 2: my queries against every rank's K/V block as it comes round the ring
  throw scalelab::NotImplemented(
      "lab 11 step 2: my queries against every rank's K/V block as it comes round the ring (README.md#step-2)");
  return lse;
}

// ---- step 3 ----------------------------------------------------------------------------------

void ring_attention_backward(Tensor& dq, Tensor& dkv, const Tensor& dy, const Tensor& q,
                             const Tensor& kv, const Tensor& y, const Tensor& lse, double scale,
                             comm::Communicator& cp) {
  const int n = cp.size(), r = cp.rank();
  const int64_t BH = q.size(1), c = q.size(2), hs = q.size(3);
  // TODO step 3: the blocks go round again, each with its dK/dV, which arrives home last
  throw scalelab::NotImplemented(
      "lab 11 step 3: the blocks go round again, each with its dK/dV, which arrives home last (README.md#step-3)");
}

// ---- step 4 ----------------------------------------------------------------------------------

Tensor all_to_all_attention_forward(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v,
                                    int64_t n_head, double scale, comm::Communicator& cp,
                                    std::vector<Tensor>& kept) {
  const int n = cp.size();
  SCALELAB_REQUIRE(n_head % n == 0, "all-to-all attention: {} heads over {} ranks", n_head, n);
  Tensor lse;
  // TODO step 4: my heads over the whole sequence, one exchange in and one out
  throw scalelab::NotImplemented(
      "lab 11 step 4: my heads over the whole sequence, one exchange in and one out (README.md#step-4)");
  return lse;
}

void all_to_all_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dy,
                                   const Tensor& lse, const std::vector<Tensor>& kept,
                                   int64_t n_head, double scale, comm::Communicator& cp) {
  // TODO step 4: dy to my heads, their backward, each gradient back to its rows' rank
  throw scalelab::NotImplemented(
      "lab 11 step 4: dy to my heads, their backward, each gradient back to its rows' rank (README.md#step-4)");
}

}  // namespace scalelab::lab11
