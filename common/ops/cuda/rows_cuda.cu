// Per-row pieces of a softmax and masked indexing (ops.hpp) in CUDA: what lab 07's
// vocabulary-parallel embedding and cross-entropy are built from. Row reductions use one warp
// per row (as the softmax kernels); the index add walks the ids in order per (row, column), with
// no atomics, so its sums are deterministic like embedding_backward's.
#include "common/ops/cuda/kernels.cuh"

namespace scalelab::ops::cuda {

namespace {
// The column (or table row) an id names on a rank holding [lo, lo + n), or -1 if another's.
__device__ inline int64_t local_index(int32_t id, int64_t lo, int64_t n) {
  const int64_t i = static_cast<int64_t>(id) - lo;
  return i >= 0 && i < n ? i : -1;
}

template <class S, class A>
__global__ void row_max_kernel(A* max, const S* x, int64_t N, int64_t V) {
  const int64_t row = warp_row();
  if (row >= N) return;
  A m = -INFINITY;
  for (int64_t v = lane(); v < V; v += kWarp) m = fmax(m, A(x[row * V + v]));
  m = warp_max(m);
  if (lane() == 0) max[row] = m;
}

template <class S, class A>
__global__ void exp_rows_kernel(S* x, A* sum, const A* max, int64_t N, int64_t V) {
  const int64_t row = warp_row();
  if (row >= N) return;
  A s = 0;
  for (int64_t v = lane(); v < V; v += kWarp) {
    const A e = exp(A(x[row * V + v]) - max[row]);
    x[row * V + v] = S(e);
    s += e;  // the unrounded exponential
  }
  s = warp_sum(s);
  if (lane() == 0) sum[row] = s;
}

template <class S, class A>
__global__ void divide_rows_kernel(S* x, const A* s, int64_t N, int64_t V) {
  SCALELAB_GRID_STRIDE(i, N * V) x[i] = S(A(x[i]) / s[i / V]);
}

template <class S, class A>
__global__ void pick_columns_kernel(A* out, const S* x, const int32_t* ids, int64_t lo, int64_t N,
                                    int64_t V) {
  SCALELAB_GRID_STRIDE(n, N) {
    const int64_t v = local_index(ids[n], lo, V);
    out[n] = v < 0 ? A(0) : A(x[n * V + v]);
  }
}

template <class S>
__global__ void gather_rows_kernel(S* out, const S* table, const int32_t* ids, int64_t lo,
                                   int64_t N, int64_t R, int64_t C) {
  SCALELAB_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C, r = local_index(ids[n], lo, R);
    out[i] = r < 0 ? S(0.0f) : table[r * C + c];
  }
}

// one thread per (table row r, column c): walks the ids in order, adding the rows naming r.
template <class G, class S, class A>
__global__ void index_add_rows_kernel(G* table, const S* src, const int32_t* ids, int64_t lo,
                                      int64_t N, int64_t R, int64_t C) {
  SCALELAB_GRID_STRIDE(i, R * C) {
    const int64_t r = i / C, c = i % C;
    A s = A(table[i]);
    for (int64_t n = 0; n < N; ++n)
      if (local_index(ids[n], lo, R) == r) s += A(src[n * C + c]);
    table[i] = G(s);
  }
}

template <class S>
__global__ void logarithm_kernel(S* out, const S* in, int64_t n) {
  SCALELAB_GRID_STRIDE(i, n) out[i] = log(in[i]);
}
}  // namespace

void row_max(Tensor& max, const Tensor& x) {
  use_device(x);
  const int64_t N = x.size(0), V = x.size(1);
  SCALELAB_TRAIN_TYPES_AS(x.dtype(), scalar_t,
      row_max_kernel<scalar_t, acc_t><<<blocks_for_rows(N), kThreads>>>(
          max.data<acc_t>(), x.data<scalar_t>(), N, V));
  CUDA_CHECK_LAUNCH();
}

void exp_rows(Tensor& x, Tensor& sum, const Tensor& max) {
  use_device(x);
  const int64_t N = x.size(0), V = x.size(1);
  SCALELAB_TRAIN_TYPES_AS(x.dtype(), scalar_t,
      exp_rows_kernel<scalar_t, acc_t><<<blocks_for_rows(N), kThreads>>>(
          x.data<scalar_t>(), sum.data<acc_t>(), max.data<acc_t>(), N, V));
  CUDA_CHECK_LAUNCH();
}

void divide_rows(Tensor& x, const Tensor& s) {
  use_device(x);
  const int64_t N = x.size(0), V = x.size(1);
  SCALELAB_TRAIN_TYPES_AS(x.dtype(), scalar_t,
      divide_rows_kernel<scalar_t, acc_t><<<blocks_for(N * V), kThreads>>>(
          x.data<scalar_t>(), s.data<acc_t>(), N, V));
  CUDA_CHECK_LAUNCH();
}

void pick_columns(Tensor& out, const Tensor& x, const Tensor& ids, int64_t lo) {
  use_device(x);
  const int64_t N = x.size(0), V = x.size(1);
  SCALELAB_TRAIN_TYPES_AS(x.dtype(), scalar_t,
      pick_columns_kernel<scalar_t, acc_t><<<blocks_for(N), kThreads>>>(
          out.data<acc_t>(), x.data<scalar_t>(), ids.data<int32_t>(), lo, N, V));
  CUDA_CHECK_LAUNCH();
}

void gather_rows(Tensor& out, const Tensor& table, const Tensor& ids, int64_t lo) {
  use_device(out);
  const int64_t N = out.size(0), C = out.size(1), R = table.size(0);
  SCALELAB_TRAIN_TYPES_AS(out.dtype(), scalar_t,
      gather_rows_kernel<scalar_t><<<blocks_for(N * C), kThreads>>>(
          out.data<scalar_t>(), table.data<scalar_t>(), ids.data<int32_t>(), lo, N, R, C));
  CUDA_CHECK_LAUNCH();
}

void index_add_rows(Tensor& table, const Tensor& src, const Tensor& ids, int64_t lo) {
  use_device(src);
  const int64_t N = src.size(0), C = src.size(1), R = table.size(0);
  SCALELAB_TRAIN_TYPES_AS(src.dtype(), scalar_t, with_grad_type<scalar_t>(table.dtype(), [&](auto g_tag) {
    using G = decltype(g_tag);
    index_add_rows_kernel<G, scalar_t, acc_t><<<blocks_for(R * C), kThreads>>>(
        table.data<G>(), src.data<scalar_t>(), ids.data<int32_t>(), lo, N, R, C);
    CUDA_CHECK_LAUNCH();
  }));
}

void logarithm(Tensor& out, const Tensor& in) {
  use_device(in);
  const int64_t n = in.numel();
  SCALELAB_FLOAT_TYPES_AS(in.dtype(), scalar_t,
      logarithm_kernel<scalar_t><<<blocks_for(n), kThreads>>>(out.data<scalar_t>(),
                                                               in.data<scalar_t>(), n));
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda
