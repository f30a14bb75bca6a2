// The mixture-of-experts ops (moe.hpp) on the host: rows in order (deterministic), each by the
// row code the CUDA kernels run too (moe_rows.hpp).
#include <algorithm>
#include <vector>

#include "common/ops/cpu/ops_cpu.hpp"
#include "common/ops/moe_rows.hpp"

namespace scalelab::ops::cpu {

void softmax_backward(Tensor& din, const Tensor& out, const Tensor& dout) {
  const int64_t N = out.size(0), E = out.size(1);
  SCALELAB_FLOAT_TYPES(out.dtype(), {
    const T* y = out.data<T>();
    const T* dy = dout.data<T>();
    T* dx = din.data<T>();
    for (int64_t n = 0; n < N; ++n) moe_rows::softmax_backward(dx + n * E, y + n * E, dy + n * E, E);
  });
}

void top_k(Tensor& values, Tensor& indices, const Tensor& x, int64_t k) {
  const int64_t N = x.size(0), E = x.size(1);
  int32_t* idx = indices.data<int32_t>();
  SCALELAB_FLOAT_TYPES(x.dtype(), {
    const T* p = x.data<T>();
    T* v = values.data<T>();
    for (int64_t n = 0; n < N; ++n) moe_rows::top_k(v + n * k, idx + n * k, p + n * E, E, k);
  });
}

void top_k_backward(Tensor& dx, const Tensor& dvalues, const Tensor& indices) {
  const int64_t N = dx.size(0), E = dx.size(1), k = indices.size(1);
  const int32_t* idx = indices.data<int32_t>();
  SCALELAB_FLOAT_TYPES(dx.dtype(), {
    T* d = dx.data<T>();
    const T* dv = dvalues.data<T>();
    for (int64_t n = 0; n < N; ++n) moe_rows::top_k_backward(d + n * E, dv + n * k, idx + n * k, k);
  });
}

void normalize_rows(Tensor& out, const Tensor& in) {
  const int64_t N = in.size(0), k = in.size(1);
  SCALELAB_FLOAT_TYPES(in.dtype(), {
    const T* x = in.data<T>();
    T* y = out.data<T>();
    for (int64_t n = 0; n < N; ++n) moe_rows::normalize(y + n * k, x + n * k, k);
  });
}

void normalize_rows_backward(Tensor& din, const Tensor& dout, const Tensor& in) {
  const int64_t N = in.size(0), k = in.size(1);
  SCALELAB_FLOAT_TYPES(in.dtype(), {
    const T* x = in.data<T>();
    const T* dy = dout.data<T>();
    T* dx = din.data<T>();
    for (int64_t n = 0; n < N; ++n)
      moe_rows::normalize_backward(dx + n * k, dy + n * k, x + n * k, k);
  });
}

void moe_route(Tensor& dest, Tensor& assigned, Tensor& kept, const Tensor& indices,
               int64_t n_expert, int64_t groups, int64_t capacity) {
  const int64_t N = indices.size(0), k = indices.size(1), per = N / groups, E = n_expert;
  const int32_t* idx = indices.data<int32_t>();
  int32_t* d = dest.data<int32_t>();
  int32_t* a = assigned.data<int32_t>();
  int32_t* kp = kept.data<int32_t>();
  std::fill(a, a + groups * E, 0);
  // Pass 1: each pair's place in its expert's queue within its group (priority: choice, token).
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t n = g * per; n < (g + 1) * per; ++n) {
        const int32_t e = idx[n * k + j];
        SCALELAB_CHECK(e >= 0 && e < E, "moe_route: expert {} of token {} is not in [0, {})", e,
                       n, E);
        const int32_t slot = a[g * E + e]++;
        d[n * k + j] = slot < capacity ? slot : -1;
      }
  for (int64_t i = 0; i < groups * E; ++i) kp[i] = std::min<int32_t>(a[i], capacity);
  // Pass 2: where each (expert, group) block starts in the expert-major layout.
  std::vector<int64_t> start(groups * E);
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t g = 0; g < groups; ++g) {
      start[g * E + e] = row;
      row += kp[g * E + e];
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j)
      if (d[n * k + j] >= 0)
        d[n * k + j] = static_cast<int32_t>(start[(n / per) * E + idx[n * k + j]] + d[n * k + j]);
}

void multiply_rows(Tensor& x, const Tensor& w) {
  const int64_t M = x.size(0), C = x.size(1);
  SCALELAB_TRAIN_TYPES_AS(x.dtype(), scalar_t, {
    scalar_t* p = x.data<scalar_t>();
    const acc_t* s = w.data<acc_t>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < C; ++c) p[m * C + c] = scalar_t(acc_t(p[m * C + c]) * s[m]);
  });
}

void row_dot(Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(0), C = a.size(1);
  SCALELAB_TRAIN_TYPES_AS(a.dtype(), scalar_t, {
    const scalar_t* x = a.data<scalar_t>();
    const scalar_t* y = b.data<scalar_t>();
    acc_t* o = out.data<acc_t>();
    for (int64_t m = 0; m < M; ++m) {
      acc_t s = 0;
      for (int64_t c = 0; c < C; ++c) s += acc_t(x[m * C + c]) * acc_t(y[m * C + c]);
      o[m] = s;
    }
  });
}

}  // namespace scalelab::ops::cpu
