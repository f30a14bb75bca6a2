// Flash attention on the host: the tiled algorithm of the CUDA kernel
// (ops/cuda/flash_attention_cuda.cu), written as plain loops so it can be read and tested
// against the unfused path. See flash_attention.hpp for what it computes.
//
// References: Dao, Fu, Ermon, Rudra, Re, "FlashAttention: Fast and Memory-Efficient Exact
// Attention with IO-Awareness" (NeurIPS 2022); Dao, "FlashAttention-2: Faster Attention with
// Better Parallelism and Work Partitioning" (2023). FlashAttention-2's loop order: the OUTER loop
// runs over query tiles (each is independent: one CUDA thread block each), the INNER loop over
// the key/value tiles that query tile can see.
//
// Notation per (batch*head) matrix: s = scale * q_i . k_j (a score), p = exp(s - max) (an
// unnormalised probability), l = sum_j p (the softmax's denominator), lse = max + log(l).
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/ops/fused_backend.hpp"

namespace scalelab::ops::cpu {

namespace {
// Tile sizes: Br query rows x Bc key columns. Small on the host (the tiles live on the stack);
// the results do not depend on them beyond rounding.
constexpr int64_t kBr = 16;
constexpr int64_t kBc = 16;

// Storage -> compute type: bf16 and f32 compute in float, f64 in double.
inline float load(bf16 x) { return static_cast<float>(x); }
inline float load(float x) { return x; }
inline double load(double x) { return x; }
template <class S, class A>
S store(A x) { return S(x); }  // bf16(float) rounds to nearest even

// Views of one (T, hs) matrix of a (BH, T, hs) tensor, and one row of (BH, T).
template <class S>
struct Mat {
  S* p;
  int64_t hs;
  S* row(int64_t t) const { return p + t * hs; }
};

template <class A, class S>
A dot_row(const S* a, const S* b, int64_t hs) {
  A s = 0;
  for (int64_t d = 0; d < hs; ++d) s += load(a[d]) * load(b[d]);
  return s;
}

// ---- forward ----------------------------------------------------------------------------------
// For one (T, hs) head. S is the storage type, A the compute (accumulation) type.
template <class S, class A>
void forward_head(S* out, A* lse, const S* q, const S* k, const S* v, int64_t T, int64_t hs,
                  A scale, bool causal) {
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  for (int64_t q0 = 0; q0 < T; q0 += kBr) {  // one query tile: rows [q0, q1)
    const int64_t q1 = std::min(q0 + kBr, T);
    A m[kBr], l[kBr];        // running max and running sum, per row of the tile
    std::vector<A> acc((q1 - q0) * hs, A(0));  // the partial output, unnormalised
    for (int64_t r = 0; r < q1 - q0; ++r) m[r] = kNegInf, l[r] = 0;

    // Causal: keys after the tile's last query (q1 - 1) are masked for every row: skip them.
    for (int64_t k0 = 0; k0 < (causal ? q1 : T); k0 += kBc) {
      const int64_t k1 = std::min(k0 + kBc, T);
      for (int64_t r = 0; r < q1 - q0; ++r) {
        const int64_t i = q0 + r;
        // 1. scores of this row against the tile's keys (masked: -inf, so p = 0)
        A s[kBc];
        A tile_max = kNegInf;
        for (int64_t c = 0; c < k1 - k0; ++c) {
          const int64_t j = k0 + c;
          s[c] = !causal || j <= i ? scale * dot_row<A>(q + i * hs, k + j * hs, hs) : kNegInf;
          tile_max = std::max(tile_max, s[c]);
        }
        if (tile_max == kNegInf) continue;  // the whole tile is in this row's future
        // 2. the online softmax: a new max rescales what was summed under the old one
        const A m_new = std::max(m[r], tile_max);
        const A correction = std::exp(m[r] - m_new);  // exp(-inf) = 0 on the first tile
        A* o = acc.data() + r * hs;
        for (int64_t d = 0; d < hs; ++d) o[d] *= correction;
        l[r] *= correction;
        // 3. accumulate p v for the tile
        for (int64_t c = 0; c < k1 - k0; ++c) {
          if (s[c] == kNegInf) continue;
          const A p = std::exp(s[c] - m_new);
          l[r] += p;
          const S* vj = v + (k0 + c) * hs;
          for (int64_t d = 0; d < hs; ++d) o[d] += p * load(vj[d]);
        }
        m[r] = m_new;
      }
    }
    // 4. normalise once at the end (not per tile) and keep lse for backward
    for (int64_t r = 0; r < q1 - q0; ++r) {
      const A* o = acc.data() + r * hs;
      for (int64_t d = 0; d < hs; ++d) out[(q0 + r) * hs + d] = store<S>(o[d] / l[r]);
      lse[q0 + r] = m[r] + std::log(l[r]);
    }
  }
}

// ---- backward ---------------------------------------------------------------------------------
// With P = softmax(S) recomputed as p_ij = exp(s_ij - lse_i):
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D) with D_i = sum_j p_ij dp_ij = dO_i . O_i,
//   dQ = scale dS K,  dK = scale dS^T Q.
// Two passes, both tiled like the forward and both without atomics (deterministic, and each
// output row is written by exactly one tile: the same structure as the CUDA kernels):
//   pass 1 over query tiles: dQ_i = scale sum_j dS_ij k_j (keys j <= i);
//   pass 2 over key tiles:   dK_j = scale sum_i dS_ij q_i, dV_j = sum_i p_ij dO_i (queries i >= j).
// FlashAttention-2 does both in one pass over key tiles with dQ added atomically; two passes
// recompute the scores once more (about 1.4x the backward's FLOPs) but need no atomics.

// p_ij and dS_ij of one (query i, key j) pair: the scalar core of both passes.
template <class A, class S>
void prob_and_dscore(A& p, A& ds, const S* qi, const S* kj, const S* vj, const S* doi, A lse_i,
                     A D_i, int64_t hs, A scale) {
  p = std::exp(scale * dot_row<A>(qi, kj, hs) - lse_i);
  ds = p * (dot_row<A>(doi, vj, hs) - D_i);
}

template <class S, class A>
void backward_head(S* dq, S* dk, S* dv, const S* dout, const S* q, const S* k, const S* v,
                   const S* out, const A* lse, A* D, int64_t T, int64_t hs, A scale,
                   bool causal) {
  for (int64_t i = 0; i < T; ++i) D[i] = dot_row<A>(dout + i * hs, out + i * hs, hs);

  std::vector<A> acc(std::max(kBr, kBc) * hs);
  // pass 1: dQ, query tile by query tile (keys up to the tile's last query)
  for (int64_t q0 = 0; q0 < T; q0 += kBr) {
    const int64_t q1 = std::min(q0 + kBr, T);
    std::fill(acc.begin(), acc.end(), A(0));
    for (int64_t k0 = 0; k0 < (causal ? q1 : T); k0 += kBc)
      for (int64_t r = 0; r < q1 - q0; ++r)
        for (int64_t j = k0, i = q0 + r; j < std::min(k0 + kBc, causal ? i + 1 : T); ++j) {
          A p, ds;
          prob_and_dscore(p, ds, q + i * hs, k + j * hs, v + j * hs, dout + i * hs, lse[i], D[i],
                          hs, scale);
          for (int64_t d = 0; d < hs; ++d) acc[r * hs + d] += ds * load(k[j * hs + d]);
        }
    for (int64_t r = 0; r < q1 - q0; ++r)
      for (int64_t d = 0; d < hs; ++d) dq[(q0 + r) * hs + d] = store<S>(scale * acc[r * hs + d]);
  }
  // pass 2: dK and dV, key tile by key tile (queries from the tile's first key on)
  std::vector<A> acc_v(kBc * hs);
  for (int64_t k0 = 0; k0 < T; k0 += kBc) {
    const int64_t k1 = std::min(k0 + kBc, T);
    std::fill(acc.begin(), acc.end(), A(0));
    std::fill(acc_v.begin(), acc_v.end(), A(0));
    // causal: from the first query tile that sees k0
    for (int64_t q0 = causal ? k0 - k0 % kBr : 0; q0 < T; q0 += kBr)
      for (int64_t c = 0; c < k1 - k0; ++c)
        for (int64_t i = causal ? std::max(q0, k0 + c) : q0, j = k0 + c;
             i < std::min(q0 + kBr, T); ++i) {
          A p, ds;
          prob_and_dscore(p, ds, q + i * hs, k + j * hs, v + j * hs, dout + i * hs, lse[i], D[i],
                          hs, scale);
          for (int64_t d = 0; d < hs; ++d) {
            acc[c * hs + d] += ds * load(q[i * hs + d]);
            acc_v[c * hs + d] += p * load(dout[i * hs + d]);
          }
        }
    for (int64_t c = 0; c < k1 - k0; ++c)
      for (int64_t d = 0; d < hs; ++d) {
        dk[(k0 + c) * hs + d] = store<S>(scale * acc[c * hs + d]);
        dv[(k0 + c) * hs + d] = store<S>(acc_v[c * hs + d]);
      }
  }
}

// Calls f(S{}, A{}) with the storage and compute types of `dtype`.
template <class F>
void with_types(DType dtype, F f) {
  switch (dtype) {
    case DType::f32: f(float{}, float{}); break;
    case DType::f64: f(double{}, double{}); break;
    case DType::bf16: f(bf16{}, float{}); break;
    default: SCALELAB_CHECK(false, "flash attention: dtype {}", dtype_name(dtype));
  }
}
}  // namespace

void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, double scale, bool causal) {
  const int64_t BH = q.size(0), T = q.size(1), hs = q.size(2);
  with_types(q.dtype(), [&](auto s_tag, auto a_tag) {
    using S = decltype(s_tag);
    using A = decltype(a_tag);
    for (int64_t h = 0; h < BH; ++h)
      forward_head<S, A>(out.data<S>() + h * T * hs, lse.data<A>() + h * T,
                         q.data<S>() + h * T * hs, k.data<S>() + h * T * hs,
                         v.data<S>() + h * T * hs, T, hs, A(scale), causal);
  });
}

void flash_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, double scale, bool causal) {
  const int64_t BH = q.size(0), T = q.size(1), hs = q.size(2);
  with_types(q.dtype(), [&](auto s_tag, auto a_tag) {
    using S = decltype(s_tag);
    using A = decltype(a_tag);
    Tensor D = Tensor::empty({T}, dtype_of<A>());  // D_i = dO_i . O_i for one head: T numbers
    const int64_t n = T * hs;
    for (int64_t h = 0; h < BH; ++h)
      backward_head<S, A>(dq.data<S>() + h * n, dk.data<S>() + h * n, dv.data<S>() + h * n,
                          dout.data<S>() + h * n, q.data<S>() + h * n, k.data<S>() + h * n,
                          v.data<S>() + h * n, out.data<S>() + h * n, lse.data<A>() + h * T,
                          D.data<A>(), T, hs, A(scale), causal);
  });
}

// The online-softmax merge of two partial attentions over disjoint key sets (ring attention):
// per row, lse = log(e^lse + e^lse_b) and out = out e^(lse_old - lse) + out_b e^(lse_b - lse).
// A row that saw no key has lse = -inf and contributes nothing.
void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const int64_t rows = lse.numel(), hs = out.size(2);
  with_types(out.dtype(), [&](auto s_tag, auto a_tag) {
    using S = decltype(s_tag);
    using A = decltype(a_tag);
    constexpr A kNegInf = -std::numeric_limits<A>::infinity();
    S* o = out.data<S>();
    const S* ob = out_b.data<S>();
    A* l = lse.data<A>();
    const A* lb = lse_b.data<A>();
    for (int64_t r = 0; r < rows; ++r) {
      if (lb[r] == kNegInf) continue;
      const A m = std::max(l[r], lb[r]);
      const A merged = m + std::log(std::exp(l[r] - m) + std::exp(lb[r] - m));
      const A wa = std::exp(l[r] - merged), wb = std::exp(lb[r] - merged);
      for (int64_t d = 0; d < hs; ++d)
        o[r * hs + d] = store<S>(wa * load(o[r * hs + d]) + wb * load(ob[r * hs + d]));
      l[r] = merged;
    }
  });
}

}  // namespace scalelab::ops::cpu
