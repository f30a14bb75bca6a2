// The mixture-of-experts ops (moe.hpp) in CUDA. The router's tensors are small ((N, E) with E a
// few dozen at most): one thread per row, running the host's own row code (moe_rows.hpp), so
// the results agree exactly. moe_route's queues are sequential by nature (a pair's slot depends on every pair
// before it in its group): one thread per group walks them in priority order, as the host does.
#include "common/ops/cuda/kernels.cuh"
#include "common/ops/moe_rows.hpp"

namespace scalelab::ops::cuda {

namespace {

template <class T>
__global__ void softmax_backward_kernel(T* dx, const T* y, const T* dy, int64_t N, int64_t E) {
  SCALELAB_GRID_STRIDE(n, N) moe_rows::softmax_backward(dx + n * E, y + n * E, dy + n * E, E);
}

template <class T>
__global__ void top_k_kernel(T* v, int32_t* idx, const T* p, int64_t N, int64_t E, int64_t k) {
  SCALELAB_GRID_STRIDE(n, N) moe_rows::top_k(v + n * k, idx + n * k, p + n * E, E, k);
}

template <class T>
__global__ void top_k_backward_kernel(T* dx, const T* dv, const int32_t* idx, int64_t N,
                                      int64_t E, int64_t k) {
  SCALELAB_GRID_STRIDE(n, N) moe_rows::top_k_backward(dx + n * E, dv + n * k, idx + n * k, k);
}

template <class T>
__global__ void normalize_rows_kernel(T* y, const T* x, int64_t N, int64_t k) {
  SCALELAB_GRID_STRIDE(n, N) moe_rows::normalize(y + n * k, x + n * k, k);
}

template <class T>
__global__ void normalize_rows_backward_kernel(T* dx, const T* dy, const T* x, int64_t N,
                                               int64_t k) {
  SCALELAB_GRID_STRIDE(n, N) moe_rows::normalize_backward(dx + n * k, dy + n * k, x + n * k, k);
}

// One thread per group: each pair's slot in its expert's queue (priority: choice, then token).
__global__ void moe_slots_kernel(int32_t* dest, int32_t* assigned, int32_t* kept,
                                 const int32_t* idx, int64_t groups, int64_t per, int64_t k,
                                 int64_t E, int64_t capacity) {
  SCALELAB_GRID_STRIDE(g, groups) {
    for (int64_t e = 0; e < E; ++e) assigned[g * E + e] = 0;
    for (int64_t j = 0; j < k; ++j)
      for (int64_t n = g * per; n < (g + 1) * per; ++n) {
        const int32_t e = idx[n * k + j];
        const int32_t slot = assigned[g * E + e]++;
        dest[n * k + j] = slot < capacity ? slot : -1;
      }
    for (int64_t e = 0; e < E; ++e)
      kept[g * E + e] = assigned[g * E + e] < capacity ? assigned[g * E + e]
                                                       : static_cast<int32_t>(capacity);
  }
}

// One thread per pair: its slot plus where its (expert, group) block starts.
__global__ void moe_rows_kernel(int32_t* dest, const int32_t* kept, const int32_t* idx,
                                int64_t N, int64_t groups, int64_t per, int64_t k, int64_t E) {
  SCALELAB_GRID_STRIDE(i, N * k) {
    if (dest[i] < 0) continue;
    const int64_t g = (i / k) / per, e = idx[i];
    int64_t start = 0;
    for (int64_t e2 = 0; e2 < e; ++e2)
      for (int64_t g2 = 0; g2 < groups; ++g2) start += kept[g2 * E + e2];
    for (int64_t g2 = 0; g2 < g; ++g2) start += kept[g2 * E + e];
    dest[i] = static_cast<int32_t>(start + dest[i]);
  }
}

template <class S, class A>
__global__ void multiply_rows_kernel(S* x, const A* w, int64_t M, int64_t C) {
  SCALELAB_GRID_STRIDE(i, M * C) x[i] = S(A(x[i]) * w[i / C]);
}

// One warp per row.
template <class S, class A>
__global__ void row_dot_kernel(A* out, const S* a, const S* b, int64_t M, int64_t C) {
  const int64_t row = warp_row();
  if (row >= M) return;
  A s = 0;
  for (int64_t c = lane(); c < C; c += kWarp) s += A(a[row * C + c]) * A(b[row * C + c]);
  s = warp_sum(s);
  if (lane() == 0) out[row] = s;
}

}  // namespace

void softmax_backward(Tensor& din, const Tensor& out, const Tensor& dout) {
  use_device(out);
  const int64_t N = out.size(0), E = out.size(1);
  SCALELAB_FLOAT_TYPES(out.dtype(), softmax_backward_kernel<T><<<blocks_for(N), kThreads>>>(
                                        din.data<T>(), out.data<T>(), dout.data<T>(), N, E));
  CUDA_CHECK_LAUNCH();
}

void top_k(Tensor& values, Tensor& indices, const Tensor& x, int64_t k) {
  use_device(x);
  const int64_t N = x.size(0), E = x.size(1);
  SCALELAB_FLOAT_TYPES(x.dtype(), top_k_kernel<T><<<blocks_for(N), kThreads>>>(
                                      values.data<T>(), indices.data<int32_t>(), x.data<T>(), N,
                                      E, k));
  CUDA_CHECK_LAUNCH();
}

void top_k_backward(Tensor& dx, const Tensor& dvalues, const Tensor& indices) {
  use_device(dx);
  const int64_t N = dx.size(0), E = dx.size(1), k = indices.size(1);
  SCALELAB_FLOAT_TYPES(dx.dtype(), top_k_backward_kernel<T><<<blocks_for(N), kThreads>>>(
                                       dx.data<T>(), dvalues.data<T>(),
                                       indices.data<int32_t>(), N, E, k));
  CUDA_CHECK_LAUNCH();
}

void normalize_rows(Tensor& out, const Tensor& in) {
  use_device(in);
  const int64_t N = in.size(0), k = in.size(1);
  SCALELAB_FLOAT_TYPES(in.dtype(), normalize_rows_kernel<T><<<blocks_for(N), kThreads>>>(
                                       out.data<T>(), in.data<T>(), N, k));
  CUDA_CHECK_LAUNCH();
}

void normalize_rows_backward(Tensor& din, const Tensor& dout, const Tensor& in) {
  use_device(in);
  const int64_t N = in.size(0), k = in.size(1);
  SCALELAB_FLOAT_TYPES(in.dtype(), normalize_rows_backward_kernel<T><<<blocks_for(N), kThreads>>>(
                                       din.data<T>(), dout.data<T>(), in.data<T>(), N, k));
  CUDA_CHECK_LAUNCH();
}

void moe_route(Tensor& dest, Tensor& assigned, Tensor& kept, const Tensor& indices,
               int64_t n_expert, int64_t groups, int64_t capacity) {
  use_device(indices);
  const int64_t N = indices.size(0), k = indices.size(1), per = N / groups;
  moe_slots_kernel<<<blocks_for(groups), kThreads>>>(
      dest.data<int32_t>(), assigned.data<int32_t>(), kept.data<int32_t>(),
      indices.data<int32_t>(), groups, per, k, n_expert, capacity);
  CUDA_CHECK_LAUNCH();
  moe_rows_kernel<<<blocks_for(N * k), kThreads>>>(dest.data<int32_t>(), kept.data<int32_t>(),
                                                   indices.data<int32_t>(), N, groups, per, k,
                                                   n_expert);
  CUDA_CHECK_LAUNCH();
}

void multiply_rows(Tensor& x, const Tensor& w) {
  use_device(x);
  const int64_t M = x.size(0), C = x.size(1);
  SCALELAB_TRAIN_TYPES_AS(x.dtype(), scalar_t,
      multiply_rows_kernel<scalar_t, acc_t><<<blocks_for(M * C), kThreads>>>(
          x.data<scalar_t>(), w.data<acc_t>(), M, C));
  CUDA_CHECK_LAUNCH();
}

void row_dot(Tensor& out, const Tensor& a, const Tensor& b) {
  use_device(a);
  const int64_t M = a.size(0), C = a.size(1);
  SCALELAB_TRAIN_TYPES_AS(a.dtype(), scalar_t,
      row_dot_kernel<scalar_t, acc_t><<<blocks_for_rows(M), kThreads>>>(
          out.data<acc_t>(), a.data<scalar_t>(), b.data<scalar_t>(), M, C));
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda
