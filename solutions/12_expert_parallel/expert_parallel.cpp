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
  // BEGIN SOLUTION step 1: probabilities, the top k, the gates, the capacity, the balancing loss
  // HINT: common/ops/moe.hpp has the pieces (top_k, normalize_rows, moe_route with one group);
  // HINT: nn::MoE's comment states the capacity and the loss. Counts come to the host (to_vector).
  r.probs = Tensor::empty({N, E}, R, dev);
  ops::softmax_forward(r.probs, logits);
  r.values = Tensor::empty({N, k}, R, dev);
  r.indices = Tensor::empty({N, k}, DType::i32, dev);
  ops::top_k(r.values, r.indices, r.probs, k);
  r.gates = Tensor::empty({N, k}, R, dev);
  if (k == 1) ops::copy(r.gates, r.values);  // Switch: the probability itself
  else ops::normalize_rows(r.gates, r.values);
  r.capacity = nn::expert_capacity(N, c);  // ceil(cf N k / E), at most the N k pairs
  Tensor dest = Tensor::empty({N, k}, DType::i32, dev);
  Tensor assigned = Tensor::empty({1, E}, DType::i32, dev), kept = assigned.clone();
  ops::moe_route(dest, assigned, kept, r.indices, E, 1, r.capacity);
  r.dest = dest.view({N * k});
  for (double a : assigned.to_vector()) r.assigned.push_back(static_cast<int64_t>(a));
  for (double a : kept.to_vector()) r.kept.push_back(static_cast<int64_t>(a));
  // aux = coef E sum_e f_e P_e: f from the counts, P from the probabilities' column means
  Tensor P = Tensor::zeros({E}, R, dev);
  ops::bias_backward(P, r.probs);
  const std::vector<double> Ps = P.to_vector();
  for (int64_t e = 0; e < E; ++e) {
    r.dropped += r.assigned[e] - r.kept[e];
    r.aux += E * (static_cast<double>(r.assigned[e]) / (N * k)) * (Ps[e] / N);
  }
  r.aux *= c.aux_coef;
  // END SOLUTION
  return r;
}

void route_backward(Tensor& dlogits, const Tensor& dgates, const Routing& r,
                    const MoEConfig& c, double aux_scale) {
  const int64_t N = r.probs.size(0), E = r.probs.size(1), k = c.top_k;
  const Device dev = r.probs.device();
  const DType R = r.probs.dtype();
  // BEGIN SOLUTION step 1: gates -> chosen probabilities -> all (+ the balancing loss) -> logits
  // HINT: every forward op has its backward in common/ops/moe.hpp; f is a count: no gradient.
  Tensor dvalues = Tensor::zeros({N, k}, R, dev);
  if (k == 1) ops::copy(dvalues, dgates.view({N, k}));
  else ops::normalize_rows_backward(dvalues, dgates.view({N, k}), r.values);
  Tensor dprobs = Tensor::zeros({N, E}, R, dev);
  ops::top_k_backward(dprobs, dvalues, r.indices);
  // d aux / d p[n, e] = coef E f_e / N, the same for every row: a bias over the rows
  std::vector<double> g(E);
  for (int64_t e = 0; e < E; ++e)
    g[e] = aux_scale * c.aux_coef * E * (static_cast<double>(r.assigned[e]) / (N * k)) / N;
  ops::add_bias(dprobs, Tensor::from_vector(g, {E}, R).to(dev));
  ops::fill(dlogits, 0.0);
  ops::softmax_backward(dlogits, r.probs, dprobs);
  // END SOLUTION
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
  // BEGIN SOLUTION step 2: each pair's token row to its row of the layout (dropped: nowhere)
  // HINT: ops::gather_rows and ops::index_add_rows move rows by an i32 index (-1: skipped).
  const Tensor tokens = pair_tokens(N, k, x.device());
  Tensor x_pairs = Tensor::empty({N * k, C}, x.dtype(), x.device());
  ops::gather_rows(x_pairs, x, tokens, 0);
  ops::index_add_rows(xd, x_pairs, r.dest, 0);
  // END SOLUTION
  return xd;
}

void dispatch_backward(Tensor& dx, const Tensor& dxd, const Routing& r) {
  // BEGIN SOLUTION step 2: each pair's row gradient back to its token (dropped pairs: 0)
  const int64_t N = dx.size(0), C = dx.size(1), k = r.indices.size(1);
  Tensor d_pairs = Tensor::empty({N * k, C}, dxd.dtype(), dxd.device());
  ops::gather_rows(d_pairs, dxd, r.dest, 0);
  ops::index_add_rows(dx, d_pairs, pair_tokens(N, k, dx.device()), 0);
  // END SOLUTION
}

Tensor combine(const Tensor& ye, const Routing& r) {
  const int64_t N = r.indices.size(0), k = r.indices.size(1), C = ye.size(1);
  Tensor y = Tensor::zeros({N, C}, ye.dtype(), ye.device());
  // BEGIN SOLUTION step 2: every kept pair's expert row, times its gate, into its token's row
  // HINT: ops::multiply_rows scales rows by the gates.
  Tensor y_pairs = Tensor::empty({N * k, C}, ye.dtype(), ye.device());
  ops::gather_rows(y_pairs, ye, r.dest, 0);  // a dropped pair: a row of zeros
  ops::multiply_rows(y_pairs, r.gates.view({N * k}));
  ops::index_add_rows(y, y_pairs, pair_tokens(N, k, ye.device()), 0);
  // END SOLUTION
  return y;
}

void combine_backward(Tensor& dye, Tensor& dgates, const Tensor& dy, const Tensor& ye,
                      const Routing& r) {
  // BEGIN SOLUTION step 2: dgate = dy . expert row; d expert row = gate dy
  // HINT: ops::row_dot gives one number per row.
  const int64_t N = r.indices.size(0), k = r.indices.size(1), C = ye.size(1);
  Tensor dy_pairs = Tensor::empty({N * k, C}, dy.dtype(), dy.device());
  ops::gather_rows(dy_pairs, dy, pair_tokens(N, k, dy.device()), 0);
  Tensor y_pairs = Tensor::empty({N * k, C}, ye.dtype(), ye.device());
  ops::gather_rows(y_pairs, ye, r.dest, 0);
  ops::row_dot(dgates, dy_pairs, y_pairs);
  ops::multiply_rows(dy_pairs, r.gates.view({N * k}));
  ops::fill(dye, 0.0);
  ops::index_add_rows(dye, dy_pairs, r.dest, 0);
  // END SOLUTION
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
  // BEGIN SOLUTION step 3: my counts of rank o's experts go to rank o; theirs of mine come back
  // HINT: an equal-chunk Communicator::all_to_all of an i32 tensor of the E counts.
  std::vector<double> mine(rows_per_expert.begin(), rows_per_expert.end());
  const Tensor out = Tensor::from_vector(mine, {E}, DType::i32);
  Tensor in = Tensor::empty({E}, DType::i32);
  ep.all_to_all(out, in);  // chunk o (E/ep counts) to rank o
  const std::vector<double> got = in.to_vector();
  for (int o = 0; o < n; ++o)
    for (int64_t i = 0; i < El; ++i) {
      x.send_rows[o] += rows_per_expert[o * El + i];
      x.from_rank[o * El + i] = static_cast<int64_t>(got[o * El + i]);
      x.recv_rows[o] += x.from_rank[o * El + i];
    }
  // END SOLUTION
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
  // BEGIN SOLUTION step 3: one all-to-all of variable counts, then group the rows by expert
  // HINT: Communicator::all_to_all(in, send_counts, out, recv_counts) counts elements, not rows.
  std::vector<int64_t> send(x.send_rows), recv(x.recv_rows);
  for (int64_t& v : send) v *= C;
  for (int64_t& v : recv) v *= C;
  Tensor got = Tensor::empty({total(x.recv_rows), C}, xd.dtype(), xd.device());
  ep.all_to_all(xd, send, got, recv);
  mine = regroup(got, x, /*to_expert_major=*/true);
  // END SOLUTION
  return mine;
}

Tensor return_from_experts(const Tensor& ye, const Exchange& x, comm::Communicator& ep) {
  const int64_t C = ye.size(1);
  Tensor back;
  // BEGIN SOLUTION step 3: ungroup, and the same exchange the other way
  const Tensor by_rank = regroup(ye, x, /*to_expert_major=*/false);
  std::vector<int64_t> send(x.recv_rows), recv(x.send_rows);
  for (int64_t& v : send) v *= C;
  for (int64_t& v : recv) v *= C;
  back = Tensor::empty({total(x.send_rows), C}, ye.dtype(), ye.device());
  ep.all_to_all(by_rank, send, back, recv);
  // END SOLUTION
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
  // BEGIN SOLUTION step 3: counts, rows out, my experts, rows back
  const Exchange x = exchange_counts(rows_per_expert, ep);
  const Tensor mine = send_to_experts(xd, x, ep);
  const Tensor ye = moe.run_experts(mine, rows_of_my_experts(x, ep.size()), kept);
  kept.push_back(pack(x));
  out = return_from_experts(ye, x, ep);
  // END SOLUTION
  return out;
}

Tensor ep_experts_backward(nn::MoE& moe, const Tensor& dye,
                           const std::vector<int64_t>& rows_per_expert,
                           const std::vector<Tensor>& kept, comm::Communicator& ep) {
  SCALELAB_CHECK(static_cast<int64_t>(rows_per_expert.size()) == moe.n_expert(),
                 "ep_experts_backward: counts of {} experts for {}", rows_per_expert.size(),
                 moe.n_expert());
  Tensor dxd;
  // BEGIN SOLUTION step 3: the forward's exchange again, for the gradients
  const Exchange x = unpack(kept.back(), ep.size());
  const Tensor dmine = send_to_experts(dye, x, ep);
  const Tensor dx = moe.run_experts_backward(dmine, rows_of_my_experts(x, ep.size()), kept);
  dxd = return_from_experts(dx, x, ep);
  // END SOLUTION
  return dxd;
}

// ---- step 4 ----------------------------------------------------------------------------------

void reduce_gradients(nn::GPT& model, comm::Communicator& world, comm::Communicator& edp) {
  // BEGIN SOLUTION step 4: experts over the ranks holding them, everything else over all
  // HINT: MoE::expert_parameters() of each MoE block (Block::moe) are the experts.
  std::vector<nn::Parameter*> experts;
  for (auto& b : model.blocks_)
    if (b->moe)
      for (nn::Parameter* p : b->moe->expert_parameters()) experts.push_back(p);
  for (nn::Parameter* p : model.parameters()) {
    const bool expert = std::find(experts.begin(), experts.end(), p) != experts.end();
    (expert ? edp : world).all_reduce(p->grad);
  }
  // END SOLUTION
}

}  // namespace scalelab::lab12
