#pragma once
// A mixture of experts written out on the host in double, the way the papers state it, with no
// dispatch: the router's softmax and top-k, the capacity by a hand count (per group, first
// choices first, in token order), and then EVERY expert on EVERY token, masked by the gate
// matrix (0 where a pair was not chosen or was dropped). What nn::MoE (tests/common/test_moe.cpp)
// and lab 12's dispatch and combine (tests/12_expert_parallel) are checked against.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/model_config.hpp"
#include "common/tensor.hpp"

namespace scalelab::testing {

struct MoEReference {
  std::vector<double> y;          // (N, C) the layer's output
  std::vector<double> gate;       // (N, E) the mask: gate weight of kept pairs, else 0
  std::vector<int> chosen;        // (N, k) the experts, best first
  std::vector<int64_t> assigned;  // (G, E) before dropping
  std::vector<int64_t> kept;      // (G, E)
  int64_t dropped = 0;
  double aux = 0;                 // coefficient included
};

inline double gelu(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

// x (N, C); router (E, C); fc_w (E, H, C), fc_b (E, H), proj_w (E, C, H), proj_b (E, C): all
// experts, as host tensors of any float dtype.
inline MoEReference moe_reference(const Tensor& x, const Tensor& router, const Tensor& fc_w,
                                  const Tensor& fc_b, const Tensor& proj_w, const Tensor& proj_b,
                                  const MoEConfig& c, int64_t groups) {
  const int64_t C = x.size(-1), N = x.numel() / C, E = c.n_expert, k = c.top_k;
  const int64_t H = fc_w.size(1), per = N / groups;
  const int64_t cap = static_cast<int64_t>(
      std::ceil(c.capacity_factor * static_cast<double>(per * k) / E));
  const std::vector<double> X = x.to_vector(), W = router.to_vector(), W1 = fc_w.to_vector(),
                            B1 = fc_b.to_vector(), W2 = proj_w.to_vector(),
                            B2 = proj_b.to_vector();
  MoEReference r;
  r.y.assign(N * C, 0);
  r.gate.assign(N * E, 0);
  r.chosen.assign(N * k, -1);
  r.assigned.assign(groups * E, 0);
  r.kept.assign(groups * E, 0);
  std::vector<double> p(N * E), g(N * k);
  for (int64_t n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t i = 0; i < C; ++i) l += X[n * C + i] * W[e * C + i];
      p[n * E + e] = l;
      mx = std::max(mx, l);
    }
    for (int64_t e = 0; e < E; ++e) s += (p[n * E + e] = std::exp(p[n * E + e] - mx));
    for (int64_t e = 0; e < E; ++e) p[n * E + e] /= s;
    std::vector<int> order(E);
    for (int e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return p[n * E + a] > p[n * E + b]; });
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += p[n * E + order[j]];
    for (int64_t j = 0; j < k; ++j) {
      r.chosen[n * k + j] = order[j];
      g[n * k + j] = k == 1 ? p[n * E + order[j]] : p[n * E + order[j]] / chosen;
    }
  }
  // the hand count: per group, first choices (token order), then second choices
  for (int64_t gr = 0; gr < groups; ++gr)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t n = gr * per; n < (gr + 1) * per; ++n) {
        const int e = r.chosen[n * k + j];
        if (r.assigned[gr * E + e]++ < cap) {
          ++r.kept[gr * E + e];
          r.gate[n * E + e] = g[n * k + j];
        } else {
          ++r.dropped;
        }
      }
  // every expert on every token, masked
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> h(H);
      for (int64_t a = 0; a < H; ++a) {
        double v = B1[e * H + a];
        for (int64_t i = 0; i < C; ++i) v += W1[(e * H + a) * C + i] * X[n * C + i];
        h[a] = gelu(v);
      }
      for (int64_t i = 0; i < C; ++i) {
        double v = B2[e * C + i];
        for (int64_t a = 0; a < H; ++a) v += W2[(e * C + i) * H + a] * h[a];
        r.y[n * C + i] += r.gate[n * E + e] * v;
      }
    }
  // the balancing loss per group, averaged
  for (int64_t gr = 0; gr < groups; ++gr)
    for (int64_t e = 0; e < E; ++e) {
      double P = 0;
      for (int64_t n = gr * per; n < (gr + 1) * per; ++n) P += p[n * E + e];
      r.aux += E * (static_cast<double>(r.assigned[gr * E + e]) / (per * k)) * (P / per);
    }
  r.aux *= c.aux_coef / groups;
  return r;
}

}  // namespace scalelab::testing
