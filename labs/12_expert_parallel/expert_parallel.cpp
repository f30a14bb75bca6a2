// Starter generated from solutions/12_expert_parallel/expert_parallel.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 98d8fe22089b02d2 (lets make-labs see your edits).
// Lab 12: expert parallelism: the router, dispatch and combine on one device, the exchange of
// tokens with the ranks holding their experts, and the gradient reduction beside dp.
#include "expert_parallel.hpp"

#include <algorithm>
#include <cmath>

#include "common/errors.hpp"
#include "common/ops/moe.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::lab12 {

// ---- step 1 ----------------------------------------------------------------------------------

Routing route(const Tensor& logits, const MoEConfig& c) {
  const int64_t N = logits.size(0), E = logits.size(1), k = c.top_k;
  SCALELAB_CHECK(E == c.n_expert, "route: logits {} for {} experts", logits.str(), c.n_expert);
  const Device dev = logits.device();
  const DType R = logits.dtype();
  Routing r;
  // TODO step 1: probabilities, the top k, the gates, the capacity, the balancing loss
  // HINT: common/ops/moe.hpp has the pieces (top_k, normalize_rows, moe_route with one group);
  // HINT: nn::MoE's comment states the capacity and the loss. Counts come to the host (to_vector).
  throw scalelab::NotImplemented(
      "lab 12 step 1: probabilities, the top k, the gates, the capacity, the balancing loss (README.md#step-1)");
  return r;
}

void route_backward(Tensor& dlogits, const Tensor& dgates, const Routing& r,
                    const MoEConfig& c, double aux_scale) {
  const int64_t N = r.probs.size(0), E = r.probs.size(1), k = c.top_k;
  const Device dev = r.probs.device();
  const DType R = r.probs.dtype();
  // TODO step 1: gates -> chosen probabilities -> all (+ the balancing loss) -> logits
  // HINT: every forward op has its backward in common/ops/moe.hpp; f is a count: no gradient.
  throw scalelab::NotImplemented(
      "lab 12 step 1: gates -> chosen probabilities -> all (+ the balancing loss) -> logits (README.md#step-1)");
}

// ---- step 2 ----------------------------------------------------------------------------------

namespace {
// pair p -> its token p / k, as an i32 index on the device (the gathers' and adds' ids)
Tensor pair_tokens(int64_t N, int64_t k, Device dev) {
  std::vector<double> t(N * k);
  for (int64_t p = 0; p < N * k; ++p) t[p] = static_cast<double>(p / k);
  return Tensor::from_vector(t, {N * k}, DType::i32).to(dev);
}
int64_t total(const std::vector<int64_t>& v) {
  int64_t n = 0;
  for (int64_t x : v) n += x;
  return n;
}
}  // namespace

Tensor dispatch(const Tensor& x, const Routing& r) {
  const int64_t N = x.size(0), C = x.size(1), k = r.indices.size(1);
  Tensor xd = Tensor::zeros({total(r.kept), C}, x.dtype(), x.device());
  // TODO step 2: each pair's token row to its row of the layout (dropped: nowhere)
  // HINT: ops::gather_rows and ops::index_add_rows move rows by an i32 index (-1: skipped).
  throw scalelab::NotImplemented(
      "lab 12 step 2: each pair's token row to its row of the layout (dropped: nowhere) (README.md#step-2)");
  return xd;
}

void dispatch_backward(Tensor& dx, const Tensor& dxd, const Routing& r) {
  // TODO step 2: each pair's row gradient back to its token (dropped pairs: 0)
  throw scalelab::NotImplemented(
      "lab 12 step 2: each pair's row gradient back to its token (dropped pairs: 0) (README.md#step-2)");
}

Tensor combine(const Tensor& ye, const Routing& r) {
  const int64_t N = r.indices.size(0), k = r.indices.size(1), C = ye.size(1);
  Tensor y = Tensor::zeros({N, C}, ye.dtype(), ye.device());
  // TODO step 2: every kept pair's expert row, times its gate, into its token's row
  // HINT: ops::multiply_rows scales rows by the gates.
  throw scalelab::NotImplemented(
      "lab 12 step 2: every kept pair's expert row, times its gate, into its token's row (README.md#step-2)");
  return y;
}

void combine_backward(Tensor& dye, Tensor& dgates, const Tensor& dy, const Tensor& ye,
                      const Routing& r) {
  // TODO step 2: dgate = dy . expert row; d expert row = gate dy
  // HINT: ops::row_dot gives one number per row.
  throw scalelab::NotImplemented(
      "lab 12 step 2: dgate = dy . expert row; d expert row = gate dy (README.md#step-2)");
}

// ---- step 3 ----------------------------------------------------------------------------------

Exchange exchange_counts(const std::vector<int64_t>& rows_per_expert, comm::Communicator& ep) {
  const int n = ep.size();
  const int64_t E = static_cast<int64_t>(rows_per_expert.size()), El = E / n;
  SCALELAB_CHECK(E % n == 0, "exchange_counts: {} experts over ep = {}", E, n);
  Exchange x;
  x.send_rows.assign(n, 0);
  x.recv_rows.assign(n, 0);
  x.from_rank.assign(n * El, 0);
  // TODO step 3: my counts of rank o's experts go to rank o; theirs of mine come back
  // HINT: an equal-chunk Communicator::all_to_all of an i32 tensor of the E counts.
  throw scalelab::NotImplemented(
      "lab 12 step 3: my counts of rank o's experts go to rank o; theirs of mine come back (README.md#step-3)");
  return x;
}

namespace {
// Rows as they arrive (rank-major: rank s's rows of my experts, expert by expert) <-> grouped by
// expert (expert i's rows from rank 0, 1, ...): block copies of consecutive rows, no host loop
// over elements.
Tensor regroup(const Tensor& rows, const Exchange& x, bool to_expert_major) {
  const int n = static_cast<int>(x.recv_rows.size());
  const int64_t El = static_cast<int64_t>(x.from_rank.size()) / n;
  Tensor out = Tensor::empty(rows.shape(), rows.dtype(), rows.device());
  // where block (s, i) starts in each order
  std::vector<int64_t> rank_major(n * El), expert_major(n * El);
  int64_t at = 0;
  for (int s = 0; s < n; ++s)
    for (int64_t i = 0; i < El; ++i) rank_major[s * El + i] = at, at += x.from_rank[s * El + i];
  at = 0;
  for (int64_t i = 0; i < El; ++i)
    for (int s = 0; s < n; ++s) expert_major[s * El + i] = at, at += x.from_rank[s * El + i];
  for (int64_t b = 0; b < n * El; ++b) {
    const int64_t len = x.from_rank[b];
    if (len == 0) continue;
    const int64_t from = to_expert_major ? rank_major[b] : expert_major[b];
    const int64_t to = to_expert_major ? expert_major[b] : rank_major[b];
    out.rows(to, to + len).copy_from(rows.rows(from, from + len));
  }
  return out;
}
}  // namespace

Tensor send_to_experts(const Tensor& xd, const Exchange& x, comm::Communicator& ep) {
  const int64_t C = xd.size(1);
  Tensor mine;
  // TODO step 3: one all-to-all of variable counts, then group the rows by expert
  // HINT: Communicator::all_to_all(in, send_counts, out, recv_counts) counts elements, not rows.
  throw scalelab::NotImplemented(
      "lab 12 step 3: one all-to-all of variable counts, then group the rows by expert (README.md#step-3)");
  return mine;
}

Tensor return_from_experts(const Tensor& ye, const Exchange& x, comm::Communicator& ep) {
  const int64_t C = ye.size(1);
  Tensor back;
  // TODO step 3: ungroup, and the same exchange the other way
  throw scalelab::NotImplemented(
      "lab 12 step 3: ungroup, and the same exchange the other way (README.md#step-3)");
  return back;
}

namespace {
// The exchange plan kept for the backward, as one i32 tensor: send, recv, from_rank.
Tensor pack(const Exchange& x) {
  std::vector<double> v;
  for (const auto* part : {&x.send_rows, &x.recv_rows, &x.from_rank})
    v.insert(v.end(), part->begin(), part->end());
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::i32);
}
Exchange unpack(const Tensor& t, int n) {
  const std::vector<double> v = t.to_vector();
  Exchange x;
  x.send_rows.assign(v.begin(), v.begin() + n);
  x.recv_rows.assign(v.begin() + n, v.begin() + 2 * n);
  x.from_rank.assign(v.begin() + 2 * n, v.end());
  return x;
}
std::vector<int64_t> rows_of_my_experts(const Exchange& x, int n) {
  const int64_t El = static_cast<int64_t>(x.from_rank.size()) / n;
  std::vector<int64_t> rows(El, 0);
  for (int s = 0; s < n; ++s)
    for (int64_t i = 0; i < El; ++i) rows[i] += x.from_rank[s * El + i];
  return rows;
}
}  // namespace

Tensor ep_experts_forward(const nn::MoE& moe, const Tensor& xd,
                          const std::vector<int64_t>& rows_per_expert, std::vector<Tensor>& kept,
                          comm::Communicator& ep) {
  Tensor out;
  // TODO step 3: counts, rows out, my experts, rows back
  throw scalelab::NotImplemented(
      "lab 12 step 3: counts, rows out, my experts, rows back (README.md#step-3)");
  return out;
}

Tensor ep_experts_backward(nn::MoE& moe, const Tensor& dye,
                           const std::vector<int64_t>& rows_per_expert,
                           const std::vector<Tensor>& kept, comm::Communicator& ep) {
  SCALELAB_CHECK(static_cast<int64_t>(rows_per_expert.size()) == moe.n_expert(),
                 "ep_experts_backward: counts of {} experts for {}", rows_per_expert.size(),
                 moe.n_expert());
  Tensor dxd;
  // TODO step 3: the forward's exchange again, for the gradients
  throw scalelab::NotImplemented(
      "lab 12 step 3: the forward's exchange again, for the gradients (README.md#step-3)");
  return dxd;
}

// ---- step 4 ----------------------------------------------------------------------------------

void reduce_gradients(nn::GPT& model, comm::Communicator& world, comm::Communicator& edp) {
  // TODO step 4: experts over the ranks holding them, everything else over all
  // HINT: MoE::expert_parameters() of each MoE block (Block::moe) are the experts.
  throw scalelab::NotImplemented(
      "lab 12 step 4: experts over the ranks holding them, everything else over all (README.md#step-4)");
}

}  // namespace scalelab::lab12
