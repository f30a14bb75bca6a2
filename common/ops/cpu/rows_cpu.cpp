// Per-row pieces of a softmax and masked indexing on the host (ops.hpp): what lab 07's
// vocabulary-parallel embedding and cross-entropy are built from. bf16 is storage: each element
// is loaded into acc_t, computed there and rounded once when stored.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "common/ops/cpu/ops_cpu.hpp"

namespace scalelab::ops::cpu {

namespace {
// The column (or table row) an id names on a rank holding [lo, lo + n), or -1 if another's.
inline int64_t local_index(int32_t id, int64_t lo, int64_t n) {
  const int64_t i = static_cast<int64_t>(id) - lo;
  return i >= 0 && i < n ? i : -1;
}
}  // namespace

void row_max(Tensor& max, const Tensor& x) {
  const int64_t N = x.size(0), V = x.size(1);
  SCALELAB_TRAIN_TYPES_AS(x.dtype(), scalar_t, {
    const scalar_t* p = x.data<scalar_t>();
    acc_t* m = max.data<acc_t>();  // stats_dtype(x) is acc_t
    for (int64_t n = 0; n < N; ++n) {
      acc_t best = -std::numeric_limits<acc_t>::infinity();
      for (int64_t v = 0; v < V; ++v) best = std::max(best, acc_t(p[n * V + v]));
      m[n] = best;
    }
  });
}

void exp_rows(Tensor& x, Tensor& sum, const Tensor& max) {
  const int64_t N = x.size(0), V = x.size(1);
  SCALELAB_TRAIN_TYPES_AS(x.dtype(), scalar_t, {
    scalar_t* p = x.data<scalar_t>();
    const acc_t* m = max.data<acc_t>();
    acc_t* s = sum.data<acc_t>();
    for (int64_t n = 0; n < N; ++n) {
      acc_t total = 0;
      for (int64_t v = 0; v < V; ++v) {
        const acc_t e = std::exp(acc_t(p[n * V + v]) - m[n]);
        p[n * V + v] = scalar_t(e);
        total += e;  // the unrounded exponential
      }
      s[n] = total;
    }
  });
}

void divide_rows(Tensor& x, const Tensor& s) {
  const int64_t N = x.size(0), V = x.size(1);
  SCALELAB_TRAIN_TYPES_AS(x.dtype(), scalar_t, {
    scalar_t* p = x.data<scalar_t>();
    const acc_t* d = s.data<acc_t>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t v = 0; v < V; ++v) p[n * V + v] = scalar_t(acc_t(p[n * V + v]) / d[n]);
  });
}

void pick_columns(Tensor& out, const Tensor& x, const Tensor& ids, int64_t lo) {
  const int64_t N = x.size(0), V = x.size(1);
  const int32_t* id = ids.data<int32_t>();
  SCALELAB_TRAIN_TYPES_AS(x.dtype(), scalar_t, {
    const scalar_t* p = x.data<scalar_t>();
    acc_t* o = out.data<acc_t>();
    for (int64_t n = 0; n < N; ++n) {
      const int64_t v = local_index(id[n], lo, V);
      o[n] = v < 0 ? acc_t(0) : acc_t(p[n * V + v]);
    }
  });
}

void gather_rows(Tensor& out, const Tensor& table, const Tensor& ids, int64_t lo) {
  const int64_t N = out.size(0), C = out.size(1), R = table.size(0);
  const int32_t* id = ids.data<int32_t>();
  SCALELAB_TRAIN_TYPES_AS(out.dtype(), scalar_t, {
    const scalar_t* t = table.data<scalar_t>();
    scalar_t* o = out.data<scalar_t>();
    for (int64_t n = 0; n < N; ++n) {
      const int64_t r = local_index(id[n], lo, R);
      if (r < 0) std::fill(o + n * C, o + (n + 1) * C, scalar_t(0));
      else std::copy(t + r * C, t + (r + 1) * C, o + n * C);
    }
  });
}

namespace {
// table[r] += src[n] in G (the table's type: src's, or f32 for bf16 src), rows in order of n.
template <class G, class S>
void index_add_rows_typed(Tensor& table, const Tensor& src, const Tensor& ids, int64_t lo) {
  using A = std::conditional_t<std::is_same_v<G, double>, double, float>;
  const int64_t N = src.size(0), C = src.size(1), R = table.size(0);
  const int32_t* id = ids.data<int32_t>();
  const S* s = src.data<S>();
  G* t = table.data<G>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = local_index(id[n], lo, R);
    if (r < 0) continue;  // another rank's row
    for (int64_t c = 0; c < C; ++c) t[r * C + c] = G(A(t[r * C + c]) + A(s[n * C + c]));
  }
}
}  // namespace

void index_add_rows(Tensor& table, const Tensor& src, const Tensor& ids, int64_t lo) {
  if (src.dtype() == DType::bf16 && table.dtype() == DType::f32)
    return index_add_rows_typed<float, bf16>(table, src, ids, lo);
  SCALELAB_TRAIN_TYPES_AS(src.dtype(), scalar_t, {
    index_add_rows_typed<scalar_t, scalar_t>(table, src, ids, lo);
  });
}

void logarithm(Tensor& out, const Tensor& in) {
  const int64_t n = in.numel();
  SCALELAB_FLOAT_TYPES_AS(in.dtype(), scalar_t, {
    const scalar_t* x = in.data<scalar_t>();
    scalar_t* y = out.data<scalar_t>();
    for (int64_t i = 0; i < n; ++i) y[i] = std::log(x[i]);
  });
}

}  // namespace scalelab::ops::cpu
