// The non-matmul pieces of causal self-attention on the host: moving heads in and out of
// (B, NH, T, hs) layout, and the causal softmax. The matmuls (q k^T, att v) are batched_matmul.
#include <cmath>
#include <limits>
#include <vector>

#include "common/ops/cpu/ops_cpu.hpp"

namespace scalelab::ops::cpu {

namespace {
// Calls f(src_index_in_(B,T,width), dst_index_in_(B,NH,T,hs)) for one of q/k/v (part p of 3 in
// qkv, or part 0 of 1 for merge_heads).
template <class F>
void for_each_head_element(int64_t B, int64_t NH, int64_t T, int64_t hs, int64_t width,
                           int64_t part, F f) {
  const int64_t C = NH * hs;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < hs; ++i)
          f((b * T + t) * width + part * C + h * hs + i, ((b * NH + h) * T + t) * hs + i);
}
}  // namespace

void split_heads(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, int64_t NH) {
  const int64_t B = q.size(0), T = q.size(2), hs = q.size(3), W = qkv.size(2);
  SCALELAB_TRAIN_TYPES_AS(qkv.dtype(), scalar_t, {
    const scalar_t* src = qkv.data<scalar_t>();
    scalar_t* dst[3] = {q.data<scalar_t>(), k.data<scalar_t>(), v.data<scalar_t>()};
    for (int p = 0; p < 3; ++p)
      for_each_head_element(B, NH, T, hs, W, p, [&](int64_t s, int64_t d) { dst[p][d] = src[s]; });
  });
}

void split_heads_backward(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const int64_t B = dq.size(0), NH = dq.size(1), T = dq.size(2), hs = dq.size(3);
  const int64_t W = dqkv.size(2);
  SCALELAB_TRAIN_TYPES_AS(dqkv.dtype(), scalar_t, {
    scalar_t* dst = dqkv.data<scalar_t>();
    const scalar_t* src[3] = {dq.data<scalar_t>(), dk.data<scalar_t>(), dv.data<scalar_t>()};
    for (int p = 0; p < 3; ++p)
      for_each_head_element(B, NH, T, hs, W, p, [&](int64_t s, int64_t d) { dst[s] = src[p][d]; });
  });
}

void merge_heads(Tensor& out, const Tensor& y) {
  const int64_t B = y.size(0), NH = y.size(1), T = y.size(2), hs = y.size(3);
  SCALELAB_TRAIN_TYPES_AS(y.dtype(), scalar_t, {
    scalar_t* dst = out.data<scalar_t>();
    const scalar_t* src = y.data<scalar_t>();
    for_each_head_element(B, NH, T, hs, NH * hs, 0, [&](int64_t s, int64_t d) { dst[s] = src[d]; });
  });
}

void merge_heads_backward(Tensor& dy, const Tensor& dout) {
  const int64_t B = dy.size(0), NH = dy.size(1), T = dy.size(2), hs = dy.size(3);
  SCALELAB_TRAIN_TYPES_AS(dy.dtype(), scalar_t, {
    scalar_t* dst = dy.data<scalar_t>();
    const scalar_t* src = dout.data<scalar_t>();
    for_each_head_element(B, NH, T, hs, NH * hs, 0, [&](int64_t s, int64_t d) { dst[d] = src[s]; });
  });
}

void causal_softmax_forward(Tensor& att, const Tensor& preatt, double scale) {
  const int64_t BH = preatt.size(0), T = preatt.size(1);
  SCALELAB_TRAIN_TYPES_AS(preatt.dtype(), scalar_t, {
    using A = acc_t;  // float for bf16: the exponentials and the sum never see bf16 rounding
    std::vector<A> e(static_cast<size_t>(T));
    for (int64_t bh = 0; bh < BH; ++bh) {
      for (int64_t t = 0; t < T; ++t) {
        const scalar_t* x = preatt.data<scalar_t>() + (bh * T + t) * T;
        scalar_t* y = att.data<scalar_t>() + (bh * T + t) * T;
        A mx = -std::numeric_limits<A>::infinity();
        for (int64_t s = 0; s <= t; ++s) mx = std::max(mx, A(scale) * A(x[s]));
        A total = 0;
        for (int64_t s = 0; s <= t; ++s) {
          e[s] = std::exp(A(scale) * A(x[s]) - mx);
          total += e[s];
        }
        for (int64_t s = 0; s <= t; ++s) y[s] = scalar_t(e[s] / total);
        for (int64_t s = t + 1; s < T; ++s) y[s] = scalar_t(A(0));  // masked: the future is not attended
      }
    }
  });
}

void causal_softmax_backward(Tensor& dpreatt, const Tensor& att, const Tensor& datt,
                             double scale) {
  const int64_t BH = att.size(0), T = att.size(1);
  SCALELAB_TRAIN_TYPES_AS(att.dtype(), scalar_t, {
    using A = acc_t;
    for (int64_t bh = 0; bh < BH; ++bh) {
      for (int64_t t = 0; t < T; ++t) {
        const scalar_t* y = att.data<scalar_t>() + (bh * T + t) * T;
        const scalar_t* dy = datt.data<scalar_t>() + (bh * T + t) * T;
        scalar_t* dx = dpreatt.data<scalar_t>() + (bh * T + t) * T;
        // softmax Jacobian: dx_s = y_s (dy_s - sum_r y_r dy_r)
        A dot = 0;
        for (int64_t s = 0; s <= t; ++s) dot += A(y[s]) * A(dy[s]);
        for (int64_t s = 0; s <= t; ++s) dx[s] = scalar_t(A(scale) * A(y[s]) * (A(dy[s]) - dot));
        for (int64_t s = t + 1; s < T; ++s) dx[s] = scalar_t(A(0));
      }
    }
  });
}

}  // namespace scalelab::ops::cpu
