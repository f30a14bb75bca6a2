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
#include <vector>

#include "common/ops/cpu/exp_vectorizable.hpp"
#include "common/ops/fused_backend.hpp"

namespace scalelab::ops::cpu {

namespace {
// Tile sizes: Br query rows x Bc key columns. Small on the host (the tiles live on the stack);
// the results do not depend on them beyond rounding.
constexpr int64_t kBr = 16;
constexpr int64_t kBc = 64;

// Storage -> compute type: bf16 and f32 compute in float, f64 in double.
inline float load(bf16 x) { return static_cast<float>(x); }
inline float load(float x) { return x; }
inline double load(double x) { return x; }
template <class S, class A>
S store(A x) { return S(x); }  // bf16(float) rounds to nearest even

template <class A, class S>
A dot_row(const S* a, const S* b, int64_t hs) {
  A s = 0;
  for (int64_t d = 0; d < hs; ++d) s += load(a[d]) * load(b[d]);
  return s;
}

// Every matrix below is one head's (T, hs): row t starts at element t * ld (ld = hs for the
// (BH, T, hs) tensors; 3C for q, k, v read in place from the (B, T, 3C) QKV output, C for y).
//
// (T, hs) -> (hs, T) in the compute type. The score of query i against keys j..j+n is then
// s[c] += q_i[d] * kt[d][j + c] over d: the c loop runs over adjacent numbers, which the compiler
// turns into vector instructions, while every score is still summed over d in the same order as
// dot_row's (so the results are those of the plain dot products, bit for bit).
template <class A, class S>
std::vector<A> transposed(const S* m, int64_t T, int64_t hs, int64_t ld) {
  std::vector<A> t(hs * T);
  for (int64_t j = 0; j < T; ++j)
    for (int64_t d = 0; d < hs; ++d) t[d * T + j] = load(m[j * ld + d]);
  return t;
}

// s[c] = row . cols[:, j0 + c] for c < n: one row of a score tile (row: hs numbers; cols: (hs, T)).
template <class A, class S>
void row_times_cols(A* s, const S* row, const A* cols, int64_t j0, int64_t n, int64_t T,
                    int64_t hs) {
  for (int64_t c = 0; c < n; ++c) s[c] = 0;
  for (int64_t d = 0; d < hs; ++d) {
    const A x = load(row[d]);
    const A* col = cols + d * T + j0;
    for (int64_t c = 0; c < n; ++c) s[c] += x * col[c];
  }
}

// ---- forward ----------------------------------------------------------------------------------
// For one (T, hs) head: q, k, v rows `ld` apart, out rows `ld_out` apart. S is the storage
// type, A the compute (accumulation) type.
template <class S, class A>
SCALELAB_HOST_SIMD void forward_head(S* out, A* lse, const S* q, const S* k, const S* v,
                                     int64_t T, int64_t hs, int64_t ld, int64_t ld_out, A scale,
                                     bool causal) {
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  const std::vector<A> kt = transposed<A>(k, T, hs, ld);  // K^T: (hs, T)
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
        row_times_cols(s, q + i * ld, kt.data(), k0, k1 - k0, T, hs);
        A tile_max = kNegInf;
        for (int64_t c = 0; c < k1 - k0; ++c) {
          s[c] = !causal || k0 + c <= i ? scale * s[c] : kNegInf;
          tile_max = std::max(tile_max, s[c]);
        }
        if (tile_max == kNegInf) continue;  // the whole tile is in this row's future
        // 2. the online softmax: a new max rescales what was summed under the old one
        const A m_new = std::max(m[r], tile_max);
        const A correction = std::exp(m[r] - m_new);  // exp(-inf) = 0 on the first tile
        A* o = acc.data() + r * hs;
        for (int64_t d = 0; d < hs; ++d) o[d] *= correction;
        l[r] *= correction;
        // 3. accumulate p v for the tile (a masked key's p is 0)
        A p[kBc];
        for (int64_t c = 0; c < k1 - k0; ++c)
          p[c] = s[c] == kNegInf ? A(0) : exp_vectorizable(s[c] - m_new);
        for (int64_t c = 0; c < k1 - k0; ++c) {
          l[r] += p[c];
          const S* vj = v + (k0 + c) * ld;
          for (int64_t d = 0; d < hs; ++d) o[d] += p[c] * load(vj[d]);
        }
        m[r] = m_new;
      }
    }
    // 4. normalise once at the end (not per tile) and keep lse for backward
    for (int64_t r = 0; r < q1 - q0; ++r) {
      const A* o = acc.data() + r * hs;
      for (int64_t d = 0; d < hs; ++d) out[(q0 + r) * ld_out + d] = store<S>(o[d] / l[r]);
      lse[q0 + r] = m[r] + std::log(l[r]);
    }
  }
}

// ---- backward ---------------------------------------------------------------------------------
// With P = softmax(S) recomputed as p_ij = exp(s_ij - lse_i):
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D) with D_i = sum_j p_ij dp_ij = dO_i . O_i,
//   dQ = scale dS K,  dK = scale dS^T Q.
// One pass over key tiles (FlashAttention-2's backward loop order): a key tile's dK and dV are
// summed over the query tiles that see it, and each (query, key) pair adds its share to dQ_i.
// On a GPU the key tiles run in parallel, so dQ_i is added to by several thread blocks at once
// (atomics, or a second pass over query tiles: ops/cuda's kernels take the second pass). Here
// the tiles run one after another, so dQ_i simply accumulates, and in the order of j: every sum
// runs in the same order as a two-pass backward's would.
// q, k, v, dq, dk, dv rows `ld` apart; out and dout rows `ld_out` apart.
template <class S, class A>
SCALELAB_HOST_SIMD void backward_head(S* dq, S* dk, S* dv, const S* dout, const S* q, const S* k,
                                      const S* v, const S* out, const A* lse, A* D, int64_t T,
                                      int64_t hs, int64_t ld, int64_t ld_out, A scale,
                                      bool causal) {
  for (int64_t i = 0; i < T; ++i) D[i] = dot_row<A>(dout + i * ld_out, out + i * ld_out, hs);
  const std::vector<A> kt = transposed<A>(k, T, hs, ld), vt = transposed<A>(v, T, hs, ld);
  std::vector<A> acc_q(T * hs, A(0)), acc_k(kBc * hs), acc_v(kBc * hs);
  for (int64_t k0 = 0; k0 < T; k0 += kBc) {
    const int64_t k1 = std::min(k0 + kBc, T), nc = k1 - k0;
    std::fill(acc_k.begin(), acc_k.end(), A(0));
    std::fill(acc_v.begin(), acc_v.end(), A(0));
    // causal: from the first query that sees k0 (query i sees keys j <= i)
    for (int64_t i = causal ? k0 : 0; i < T; ++i) {
      const int64_t n = causal ? std::min(nc, i - k0 + 1) : nc;  // the keys of the tile i sees
      A p[kBc], ds[kBc];
      row_times_cols(p, q + i * ld, kt.data(), k0, n, T, hs);         // s_ij / scale
      row_times_cols(ds, dout + i * ld_out, vt.data(), k0, n, T, hs);  // dp_ij = dO_i . v_j
      for (int64_t c = 0; c < n; ++c) {
        p[c] = exp_vectorizable(scale * p[c] - lse[i]);
        ds[c] = p[c] * (ds[c] - D[i]);
      }
      A* aq = acc_q.data() + i * hs;
      for (int64_t c = 0; c < n; ++c) {
        const S* kj = k + (k0 + c) * ld;
        A* ak = acc_k.data() + c * hs;
        A* av = acc_v.data() + c * hs;
        for (int64_t d = 0; d < hs; ++d) {
          aq[d] += ds[c] * load(kj[d]);
          ak[d] += ds[c] * load(q[i * ld + d]);
          av[d] += p[c] * load(dout[i * ld_out + d]);
        }
      }
    }
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t d = 0; d < hs; ++d) {
        dk[(k0 + c) * ld + d] = store<S>(scale * acc_k[c * hs + d]);
        dv[(k0 + c) * ld + d] = store<S>(acc_v[c * hs + d]);
      }
  }
  for (int64_t i = 0; i < T; ++i)
    for (int64_t d = 0; d < hs; ++d) dq[i * ld + d] = store<S>(scale * acc_q[i * hs + d]);
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


// Head (b, h): its offsets in the in-side and out-side tensors (AttentionLayout).
int64_t in_at(const AttentionLayout& l, int64_t b, int64_t h) {
  return b * l.in_batch + h * l.in_head;
}
int64_t out_at(const AttentionLayout& l, int64_t b, int64_t h) {
  return b * l.out_batch + h * l.out_head;
}
}  // namespace

bool flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, const AttentionLayout& l, double scale,
                             bool causal) {
  with_types(q.dtype(), [&](auto s_tag, auto a_tag) {
    using S = decltype(s_tag);
    using A = decltype(a_tag);
    for (int64_t b = 0; b < l.B; ++b)
      for (int64_t h = 0; h < l.NH; ++h) {
        const int64_t in = in_at(l, b, h);
        forward_head<S, A>(out.data<S>() + out_at(l, b, h), lse.data<A>() + (b * l.NH + h) * l.T,
                           q.data<S>() + l.q_off + in, k.data<S>() + l.k_off + in,
                           v.data<S>() + l.v_off + in, l.T, l.hs, l.in_ld, l.out_ld, A(scale),
                           causal);
      }
  });
  return true;
}

bool flash_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const AttentionLayout& l, double scale,
                              bool causal) {
  with_types(q.dtype(), [&](auto s_tag, auto a_tag) {
    using S = decltype(s_tag);
    using A = decltype(a_tag);
    Tensor D = Tensor::empty({l.T}, dtype_of<A>());  // D_i = dO_i . O_i for one head: T numbers
    for (int64_t b = 0; b < l.B; ++b)
      for (int64_t h = 0; h < l.NH; ++h) {
        const int64_t in = in_at(l, b, h), o = out_at(l, b, h);
        backward_head<S, A>(dq.data<S>() + l.q_off + in, dk.data<S>() + l.k_off + in,
                            dv.data<S>() + l.v_off + in, dout.data<S>() + o,
                            q.data<S>() + l.q_off + in, k.data<S>() + l.k_off + in,
                            v.data<S>() + l.v_off + in, out.data<S>() + o,
                            lse.data<A>() + (b * l.NH + h) * l.T, D.data<A>(), l.T, l.hs, l.in_ld,
                            l.out_ld, A(scale), causal);
      }
  });
  return true;
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
