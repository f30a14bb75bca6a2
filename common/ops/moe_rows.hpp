#pragma once
/// @file moe_rows.hpp
/// The router's row operations (moe.hpp), one (N, E) or (N, k) row at a time: the host's loops
/// (cpu/moe_cpu.cpp) call them row after row, the CUDA kernels (cuda/moe_cuda.cu) one row a
/// thread, so both devices run the same code and agree exactly. The rows are short (E a few
/// dozen experts, k one or two choices): nothing here is worth a warp.
#include <cstdint>

#include "common/bf16.hpp"  // SCALELAB_HD

namespace scalelab::ops::moe_rows {

/// dx += softmax's backward: y (dy - <y, dy>), for the row y = softmax(x).
template <class T>
SCALELAB_HD inline void softmax_backward(T* dx, const T* y, const T* dy, int64_t E) {
  T dot = 0;
  for (int64_t e = 0; e < E; ++e) dot += y[e] * dy[e];
  for (int64_t e = 0; e < E; ++e) dx[e] += y[e] * (dy[e] - dot);
}

/// The k largest of p's E values, largest first: k passes, each the largest column not yet
/// taken (ties: the lowest column, by strict >).
template <class T>
SCALELAB_HD inline void top_k(T* v, int32_t* idx, const T* p, int64_t E, int64_t k) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    idx[j] = static_cast<int32_t>(best);
    v[j] = p[best];
  }
}

/// dx (a row of E) += dv (its k top values' gradients) at their columns.
template <class T>
SCALELAB_HD inline void top_k_backward(T* dx, const T* dv, const int32_t* idx, int64_t k) {
  for (int64_t j = 0; j < k; ++j) dx[idx[j]] += dv[j];
}

/// y = x / sum(x) over a row of k.
template <class T>
SCALELAB_HD inline void normalize(T* y, const T* x, int64_t k) {
  T s = 0;
  for (int64_t j = 0; j < k; ++j) s += x[j];
  for (int64_t j = 0; j < k; ++j) y[j] = x[j] / s;
}

/// dx += normalize's backward: (dy - <dy, y>) / sum(x), with y = x / sum(x).
template <class T>
SCALELAB_HD inline void normalize_backward(T* dx, const T* dy, const T* x, int64_t k) {
  T s = 0, dot = 0;
  for (int64_t j = 0; j < k; ++j) s += x[j];
  for (int64_t j = 0; j < k; ++j) dot += dy[j] * (x[j] / s);
  for (int64_t j = 0; j < k; ++j) dx[j] += (dy[j] - dot) / s;
}

}  // namespace scalelab::ops::moe_rows
