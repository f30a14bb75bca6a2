#include "common/nn/moe.hpp"

#include <cmath>

#include "common/nn/mappings.hpp"
#include "common/ops/moe.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::nn {

std::size_t MoEActivations::nbytes() const {
  std::size_t n = 0;
  for (const Tensor* t : {&xr, &probs, &values, &indices, &gates, &dest, &pairs, &ye})
    if (t->defined() && !t->shares_storage_with(x)) n += t->nbytes();
  for (const Tensor& t : kept)
    if (t.defined()) n += t.nbytes();
  return n;
}

int64_t expert_capacity(int64_t tokens, const MoEConfig& c) {
  // No queue holds more than the group's (token, choice) pairs: a larger capacity changes nothing,
  // and clamped there, no finite factor (1e300) overflows the int64 it is cast to.
  const int64_t pairs = tokens * c.top_k;
  const double want =
      std::ceil(c.capacity_factor * static_cast<double>(pairs) / static_cast<double>(c.n_expert));
  return want < static_cast<double>(pairs) ? static_cast<int64_t>(want) : pairs;
}

namespace {
Parameter make(const std::string& name, std::vector<int64_t> full, Shard shard, Init init,
               double std, bool decay) {
  Parameter p;
  p.name = name;
  p.full_shape = std::move(full);
  p.shard = std::move(shard);
  p.init = init;
  p.init_std = std;
  p.weight_decay = decay;
  return p;
}

// Expert i of a (E_local, ...) parameter as a matrix (rows, cols) or a vector (rows).
Tensor expert(const Tensor& t, int64_t i, std::vector<int64_t> shape) {
  return t.rows(i, i + 1).view(std::move(shape));
}
}  // namespace

MoE::MoE(const std::string& name, int64_t C, int64_t n_layer, const MoEOptions& options)
    : options_(options), hidden_(4 * C) {
  const MoEConfig& c = options.config;
  SCALELAB_CHECK(c.n_expert >= 1 && c.top_k >= 1 && c.top_k <= c.n_expert,
                 "{}: top-{} of {} experts", name, c.top_k, c.n_expert);
  SCALELAB_CHECK(c.capacity_factor > 0, "{}: capacity factor {} (must be > 0)", name,
                 c.capacity_factor);
  SCALELAB_CHECK(options.ep_size >= 1 && c.n_expert % options.ep_size == 0 &&
                     options.ep_rank >= 0 && options.ep_rank < options.ep_size,
                 "{}: {} experts over ep = {} (rank {})", name, c.n_expert, options.ep_size,
                 options.ep_rank);
  SCALELAB_CHECK(options.groups >= 1, "{}: {} routing groups", name, options.groups);
  const int64_t E = c.n_expert, H = hidden_;
  // Every expert drawn whole and cut: a rank holding experts [lo, hi) has the single device's.
  const Shard mine = options.ep_size == 1
                         ? Shard{}
                         : Shard{0, {{first_expert(), first_expert() + local_experts()}}};
  router = make(name + ".router.weight", {E, C}, {}, Init::normal, 0.02, true);
  fc_weight = make(name + ".fc.weight", {E, H, C}, mine, Init::normal, 0.02, true);
  fc_bias = make(name + ".fc.bias", {E, H}, mine, Init::zeros, 0, false);
  proj_weight = make(name + ".proj.weight", {E, C, H}, mine, Init::normal,
                     0.02 / std::sqrt(2.0 * n_layer), true);
  proj_bias = make(name + ".proj.bias", {E, C}, mine, Init::zeros, 0, false);
}

std::vector<Parameter*> MoE::parameters() {
  return {&router, &fc_weight, &fc_bias, &proj_weight, &proj_bias};
}
std::vector<Parameter*> MoE::expert_parameters() {
  return {&fc_weight, &fc_bias, &proj_weight, &proj_bias};
}

Tensor MoE::run_experts(const Tensor& x, const std::vector<int64_t>& rows,
                        std::vector<Tensor>& kept) const {
  const int64_t M = x.size(0), C = x.size(1), H = hidden_;
  SCALELAB_CHECK(static_cast<int64_t>(rows.size()) == local_experts(),
                 "run_experts: row counts of {} experts; this model holds {}", rows.size(),
                 local_experts());
  Tensor y = Tensor::empty({M, C}, x.dtype(), x.device());
  Tensor h = Tensor::empty({M, H}, x.dtype(), x.device());  // before GELU
  Tensor g = Tensor::empty({M, H}, x.dtype(), x.device());  // after: proj's input
  int64_t at = 0;
  for (int64_t i = 0; i < local_experts(); ++i) {
    const int64_t n = rows[i];
    if (n == 0) continue;  // no token for this expert: no work
    const Tensor xi = x.rows(at, at + n);
    Tensor hi = h.rows(at, at + n), gi = g.rows(at, at + n), yi = y.rows(at, at + n);
    ops::matmul(hi, xi, expert(fc_weight.compute_value(), i, {H, C}), false, true);
    ops::add_bias(hi, expert(fc_bias.compute_value(), i, {H}));
    ops::gelu_forward(gi, hi);
    ops::matmul(yi, gi, expert(proj_weight.compute_value(), i, {C, H}), false, true);
    ops::add_bias(yi, expert(proj_bias.compute_value(), i, {C}));
    at += n;
  }
  SCALELAB_CHECK(at == M, "run_experts: {} rows for {} experts' counts summing to {}", M,
                 local_experts(), at);
  kept.insert(kept.end(), {x, h, g});
  return y;
}

Tensor MoE::run_experts_backward(const Tensor& dy, const std::vector<int64_t>& rows,
                                 const std::vector<Tensor>& kept, std::size_t first) {
  const Tensor& x = kept.at(first);
  const Tensor& h = kept.at(first + 1);
  const Tensor& g = kept.at(first + 2);
  const int64_t M = x.size(0), C = x.size(1), H = hidden_;
  Tensor dx = Tensor::zeros({M, C}, x.dtype(), x.device());
  Tensor dg = Tensor::zeros({M, H}, x.dtype(), x.device());
  Tensor dh = Tensor::zeros({M, H}, x.dtype(), x.device());
  int64_t at = 0;
  for (int64_t i = 0; i < local_experts(); ++i) {
    const int64_t n = rows[i];
    if (n == 0) continue;
    const Tensor dyi = dy.rows(at, at + n), xi = x.rows(at, at + n);
    const Tensor hi = h.rows(at, at + n), gi = g.rows(at, at + n);
    Tensor dgi = dg.rows(at, at + n), dhi = dh.rows(at, at + n), dxi = dx.rows(at, at + n);
    Tensor dW2 = expert(proj_weight.grad, i, {C, H}), db2 = expert(proj_bias.grad, i, {C});
    Tensor dW1 = expert(fc_weight.grad, i, {H, C}), db1 = expert(fc_bias.grad, i, {H});
    ops::matmul(dgi, dyi, expert(proj_weight.compute_value(), i, {C, H}));  // dg = dy W2
    ops::matmul(dW2, dyi, gi, true, false, 1.0, 1.0);                       // dW2 += dy^T g
    ops::bias_backward(db2, dyi);
    ops::gelu_backward(dhi, hi, dgi);
    ops::matmul(dxi, dhi, expert(fc_weight.compute_value(), i, {H, C}));    // dx = dh W1
    ops::matmul(dW1, dhi, xi, true, false, 1.0, 1.0);                       // dW1 += dh^T x
    ops::bias_backward(db1, dhi);
    at += n;
  }
  return dx;
}

void MoE::forward(Tensor& out, const Tensor& input, MoEActivations& a, const Mappings& m) const {
  const MoEConfig& c = config();
  const int64_t C = input.size(-1), N = input.numel() / C, E = c.n_expert, k = c.top_k;
  const int64_t G = groups();
  SCALELAB_CHECK(N % G == 0, "MoE: {} rows do not form {} equal routing groups", N, G);
  const Device dev = input.device();
  const DType dt = input.dtype(), R = ops::stats_dtype(dt);  // the router runs in fp32 (or f64)
  a.reset();
  a.x = input.view({N, C});
  if (dt == R) {
    a.xr = a.x;
  } else {
    a.xr = Tensor::empty({N, C}, R, dev);
    ops::cast(a.xr, a.x);
  }
  // The router: logits = x W_r^T, probabilities, the top k, the gates.
  Tensor logits = Tensor::empty({N, E}, R, dev);
  ops::matmul(logits, a.xr, router.value, false, true);
  a.probs = Tensor::empty({N, E}, R, dev);
  ops::softmax_forward(a.probs, logits);
  a.values = Tensor::empty({N, k}, R, dev);
  a.indices = Tensor::empty({N, k}, DType::i32, dev);
  ops::top_k(a.values, a.indices, a.probs, k);
  a.gates = Tensor::empty({N, k}, R, dev);
  if (k == 1) ops::copy(a.gates, a.values);
  else ops::normalize_rows(a.gates, a.values);
  // Capacity: each pair's row, or -1. The counts come to the host: they size the buffers.
  a.capacity = expert_capacity(N / G, c);
  Tensor dest = Tensor::empty({N, k}, DType::i32, dev);
  // both counts in one buffer: one read back (on a GPU, one wait for the queue), not two
  Tensor counts = Tensor::empty({2, G, E}, DType::i32, dev);
  Tensor assigned = counts.rows(0, 1).view({G, E}), kept = counts.rows(1, 2).view({G, E});
  ops::moe_route(dest, assigned, kept, a.indices, E, G, a.capacity);
  a.dest = dest.view({N * k});
  const std::vector<double> both = counts.to_vector();
  a.assigned.assign(both.begin(), both.begin() + G * E);
  a.kept_counts.assign(both.begin() + G * E, both.end());
  a.rows_per_expert.assign(E, 0);
  int64_t M = 0;
  for (int64_t i = 0; i < G * E; ++i) {
    a.rows_per_expert[i % E] += a.kept_counts[i];
    a.dropped += a.assigned[i] - a.kept_counts[i];
    M += a.kept_counts[i];
  }
  // Dispatch: pair n*k + j carries token n's row to its expert's row dest (none if dropped).
  std::vector<double> pairs(N * k);
  for (int64_t p = 0; p < N * k; ++p) pairs[p] = static_cast<double>(p / k);
  a.pairs = Tensor::from_vector(pairs, {N * k}, DType::i32).to(dev);
  Tensor x_pairs = a.x;
  if (k > 1) {
    x_pairs = Tensor::empty({N * k, C}, dt, dev);
    ops::gather_rows(x_pairs, a.x, a.pairs, 0);
  }
  Tensor xd = Tensor::zeros({M, C}, dt, dev);
  ops::index_add_rows(xd, x_pairs, a.dest, 0);
  // The experts (one device: all of them here; expert parallel: the mappings' exchange).
  a.ye = m.experts_forward(*this, xd, a.rows_per_expert, a.kept);
  // Combine: y[n] = sum_j gate[n, j] * ye[dest[n, j]] (a dropped pair gives 0).
  Tensor y_pairs = Tensor::empty({N * k, C}, dt, dev);
  ops::gather_rows(y_pairs, a.ye, a.dest, 0);
  ops::multiply_rows(y_pairs, a.gates.view({N * k}));
  Tensor y = out.view({N, C});
  ops::fill(y, 0.0);
  ops::index_add_rows(y, y_pairs, a.pairs, 0);
  // The balancing loss, per group: E sum_e f_e P_e, averaged over the groups. f comes from the
  // counts (on the host already); P, the probabilities' column means, stays on the device: the
  // loss is one dot product there, sum_{g,e} w[g, e] P-sum[g, e], no read.
  const int64_t per = N / G;
  Tensor cols = Tensor::zeros({G, E}, R, dev);  // every group's column sums
  for (int64_t g = 0; g < G; ++g) {
    Tensor col = cols.rows(g, g + 1).view({E});
    ops::bias_backward(col, a.probs.rows(g * per, (g + 1) * per));
  }
  std::vector<double> w(G * E);  // aux_coef / G * E * f[g, e] / per (the mean of the sums)
  for (int64_t i = 0; i < G * E; ++i)
    w[i] = c.aux_coef / static_cast<double>(G) * static_cast<double>(E) *
           (a.assigned[i] / static_cast<double>(per * k)) / static_cast<double>(per);
  Tensor sums = cols.view({1, G * E});
  if (R != DType::f64) {  // the dot product in f64, as the loss it joins
    sums = Tensor::empty({1, G * E}, DType::f64, dev);
    ops::cast(sums, cols.view({1, G * E}));
  }
  Tensor aux = Tensor::empty({1}, DType::f64, dev);
  ops::row_dot(aux, sums, Tensor::from_vector(w, {1, G * E}, DType::f64).to(dev));
  a.aux = Scalar(aux);
}

void MoE::backward(Tensor& dx_out, const Tensor& dout, const MoEActivations& a,
                   const Mappings& m, double aux_scale) {
  const MoEConfig& c = config();
  const int64_t C = a.x.size(1), N = a.x.size(0), E = c.n_expert, k = c.top_k, G = groups();
  const Device dev = a.x.device();
  const DType dt = a.x.dtype(), R = a.probs.dtype();
  const int64_t M = a.ye.size(0);
  Tensor dx = dx_out.view({N, C});
  const Tensor dy = dout.view({N, C});
  // Combine's backward: each pair's share of dy, and its gate's gradient dy . ye[dest].
  Tensor dy_pairs = dy;
  if (k > 1) {
    dy_pairs = Tensor::empty({N * k, C}, dt, dev);
    ops::gather_rows(dy_pairs, dy, a.pairs, 0);
  }
  Tensor y_pairs = Tensor::empty({N * k, C}, dt, dev);
  ops::gather_rows(y_pairs, a.ye, a.dest, 0);
  Tensor dgates = Tensor::empty({N * k}, R, dev);
  ops::row_dot(dgates, dy_pairs, y_pairs);
  Tensor dye_pairs = dy_pairs.clone();
  ops::multiply_rows(dye_pairs, a.gates.view({N * k}));
  Tensor dye = Tensor::zeros({M, C}, dt, dev);
  ops::index_add_rows(dye, dye_pairs, a.dest, 0);
  // The experts' backward (their gradients +=), then dispatch's: each row back to its token.
  const Tensor dxd = m.experts_backward(*this, dye, a.rows_per_expert, a.kept);
  Tensor dx_pairs = Tensor::empty({N * k, C}, dt, dev);
  ops::gather_rows(dx_pairs, dxd, a.dest, 0);
  ops::index_add_rows(dx, dx_pairs, a.pairs, 0);
  // The router's backward: gates -> chosen probabilities -> all probabilities (+ the balancing
  // loss's gradient) -> logits -> W_r and x.
  Tensor dvalues = Tensor::zeros({N, k}, R, dev);
  if (k == 1) ops::copy(dvalues, dgates.view({N, k}));
  else ops::normalize_rows_backward(dvalues, dgates.view({N, k}), a.values);
  Tensor dprobs = Tensor::zeros({N, E}, R, dev);
  ops::top_k_backward(dprobs, dvalues, a.indices);
  const int64_t per = N / G;
  for (int64_t g = 0; g < G; ++g) {
    std::vector<double> grad(E);
    for (int64_t e = 0; e < E; ++e)
      grad[e] = aux_scale * c.aux_coef * static_cast<double>(E) *
                (a.assigned[g * E + e] / static_cast<double>(per * k)) /
                static_cast<double>(per * G);
    Tensor rows = dprobs.rows(g * per, (g + 1) * per);
    ops::add_bias(rows, Tensor::from_vector(grad, {E}, R).to(dev));
  }
  Tensor dlogits = Tensor::zeros({N, E}, R, dev);
  ops::softmax_backward(dlogits, a.probs, dprobs);
  ops::matmul(router.grad, dlogits, a.xr, true, false, 1.0, 1.0);  // dW_r += dlogits^T x
  if (dt == R) {
    ops::matmul(dx, dlogits, router.value, false, false, 1.0, 1.0);  // dx += dlogits W_r
  } else {
    Tensor dxr = Tensor::empty({N, C}, R, dev);
    ops::matmul(dxr, dlogits, router.value);
    Tensor d = Tensor::empty({N, C}, dt, dev);
    ops::cast(d, dxr);
    ops::add(dx, dx, d);
  }
}

}  // namespace scalelab::nn
