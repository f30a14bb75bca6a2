// Per-row pieces of a softmax and masked indexing (ops.hpp) in CUDA: what lab 07's
// vocabulary-parallel embedding and cross-entropy are built from. Row reductions use one warp
// per row (as the softmax kernels); the index add groups the positions by id first and adds each
// row's in order (rows_by_id.cuh), with no atomics, so its sums are deterministic like
// embedding_backward's.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "common/ops/cuda/kernels.cuh"
#include "common/ops/cuda/rows_by_id.cuh"
#include "common/ops/trial_kernels.hpp"

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
  add_grouped_rows(table, src, group_rows_by_id(ids, lo, table.size(0)), /*onto_table=*/true);
}

namespace {
constexpr int32_t kGroupChunk = 64;  // positions a thread sums, at most, in chunks

// A CUB device algorithm's two calls: the first (no scratch) says how many bytes of scratch it
// needs, the second runs with them. `call(void* scratch, std::size_t& bytes)` makes the call.
template <class F>
void with_cub_scratch(Device dev, F call) {
  std::size_t bytes = 0;
  CUDA_CHECK(call(nullptr, bytes));
  Tensor scratch = Tensor::empty({static_cast<int64_t>(bytes / 4) + 1}, DType::i32, dev);
  CUDA_CHECK(call(scratch.data_ptr(), bytes));
}

// counts[r] = row r's chunks (r < R); counts[R] = 0, so that the exclusive scan of R + 1
// counts ends with the total
__global__ void chunk_counts_kernel(int32_t* counts, const int32_t* starts, int64_t R) {
  SCALELAB_GRID_STRIDE(r, R + 1) {
    counts[r] = r < R ? (starts[r + 1] - starts[r] + kGroupChunk - 1) / kGroupChunk : 0;
  }
}

// partial[j, c] = the sum of chunk j's positions (in order) of src's column c. Chunk j belongs
// to the row r with chunk_starts[r] <= j < chunk_starts[r + 1] (a binary search: no row index
// per chunk is stored); threads past the last chunk (the grid is sized for the most there can
// be, without reading the count back to the host) do nothing.
template <class S, class A>
__global__ void chunk_sums_kernel(A* partial, const S* src, const int32_t* order,
                                  const int32_t* starts, const int32_t* chunk_starts, int64_t R,
                                  int64_t C, int64_t max_chunks) {
  SCALELAB_GRID_STRIDE(i, max_chunks * C) {
    const int64_t j = i / C, c = i % C;
    if (j >= chunk_starts[R]) continue;
    int64_t lo = 0, hi = R;  // chunk_starts[lo] <= j < chunk_starts[hi]
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (chunk_starts[mid] <= j) lo = mid;
      else hi = mid;
    }
    const int32_t first = starts[lo] + static_cast<int32_t>(j - chunk_starts[lo]) * kGroupChunk;
    const int32_t last = min(first + kGroupChunk, starts[lo + 1]);
    A s = 0;
    for (int32_t k = first; k < last; ++k) s += A(src[int64_t{order[k]} * C + c]);
    partial[i] = s;
  }
}

// table[r, c] (+)= row r's chunk sums, in order (onto_table as add_grouped_rows_kernel's)
template <class G, class A>
__global__ void add_chunk_sums_kernel(G* table, const A* partial, const int32_t* chunk_starts,
                                      int64_t R, int64_t C, bool onto_table) {
  SCALELAB_GRID_STRIDE(i, R * C) {
    const int64_t r = i / C, c = i % C;
    A s = onto_table ? A(table[i]) : A(0);
    for (int32_t j = chunk_starts[r]; j < chunk_starts[r + 1]; ++j) s += partial[j * C + c];
    table[i] = onto_table ? G(s) : G(A(table[i]) + s);
  }
}
}  // namespace

void add_grouped_rows(Tensor& table, const Tensor& src, const RowsById& rows, bool onto_table) {
  const int64_t C = src.size(-1), R = table.size(0), N = rows.order.numel();
  const Device dev = src.device();
  const bool chunks = trial_kernel("grouped_rows_in_chunks");
  Tensor chunk_starts;
  if (chunks) {  // each row's first chunk: an exclusive scan of the rows' chunk counts (CUB)
    Tensor counts = Tensor::empty({R + 1}, DType::i32, dev);
    chunk_starts = Tensor::empty({R + 1}, DType::i32, dev);
    chunk_counts_kernel<<<blocks_for(R + 1), kThreads>>>(counts.data<int32_t>(),
                                                         rows.starts.data<int32_t>(), R);
    CUDA_CHECK_LAUNCH();
    with_cub_scratch(dev, [&](void* scratch, std::size_t& bytes) {
      return cub::DeviceScan::ExclusiveSum(scratch, bytes, counts.data<int32_t>(),
                                           chunk_starts.data<int32_t>(), static_cast<int>(R + 1));
    });
  }
  SCALELAB_TRAIN_TYPES_AS(src.dtype(), scalar_t, with_grad_type<scalar_t>(table.dtype(), [&](auto g_tag) {
    using G = decltype(g_tag);
    if (!chunks) {
      add_grouped_rows_kernel<G, scalar_t, acc_t><<<blocks_for(R * C), kThreads>>>(
          table.data<G>(), src.data<scalar_t>(), rows.order.data<int32_t>(),
          rows.starts.data<int32_t>(), R, C, onto_table);
      CUDA_CHECK_LAUNCH();
      return;
    }
    // at most one partly filled chunk per row beyond N / kGroupChunk full ones
    const int64_t max_chunks = N / kGroupChunk + R;
    Tensor partial = Tensor::empty({max_chunks * C}, dtype_of<acc_t>(), dev);
    chunk_sums_kernel<scalar_t, acc_t><<<blocks_for(max_chunks * C), kThreads>>>(
        partial.data<acc_t>(), src.data<scalar_t>(), rows.order.data<int32_t>(),
        rows.starts.data<int32_t>(), chunk_starts.data<int32_t>(), R, C, max_chunks);
    CUDA_CHECK_LAUNCH();
    add_chunk_sums_kernel<G, acc_t><<<blocks_for(R * C), kThreads>>>(
        table.data<G>(), partial.data<acc_t>(), chunk_starts.data<int32_t>(), R, C, onto_table);
    CUDA_CHECK_LAUNCH();
  }));
}

namespace {
// key n = the table row of position n, or R for an id outside [lo, lo + R)
__global__ void keys_kernel(int32_t* keys, int32_t* positions, const int32_t* ids, int64_t lo,
                            int64_t N, int64_t R) {
  SCALELAB_GRID_STRIDE(n, N) {
    const int64_t r = static_cast<int64_t>(ids[n]) - lo;
    keys[n] = static_cast<int32_t>(r >= 0 && r < R ? r : R);
    positions[n] = static_cast<int32_t>(n);
  }
}

// starts[r] = the first sorted position whose key is >= r (a binary search per row)
__global__ void starts_kernel(int32_t* starts, const int32_t* sorted_keys, int64_t N, int64_t R) {
  SCALELAB_GRID_STRIDE(r, R + 1) {
    int64_t a = 0, b = N;
    while (a < b) {
      const int64_t m = (a + b) / 2;
      if (sorted_keys[m] < r) a = m + 1;
      else b = m;
    }
    starts[r] = static_cast<int32_t>(a);
  }
}
}  // namespace

RowsById group_rows_by_id(const Tensor& ids, int64_t lo, int64_t R) {
  const int64_t N = ids.numel();
  SCALELAB_CHECK(N < (int64_t{1} << 31) && R < (int64_t{1} << 31) - 1,
                 "rows by id: {} positions, {} rows (i32 keys)", N, R);
  const Device dev = ids.device();
  Tensor keys = Tensor::empty({N}, DType::i32, dev);
  Tensor positions = Tensor::empty({N}, DType::i32, dev);
  RowsById g{Tensor::empty({N}, DType::i32, dev), Tensor::empty({R + 1}, DType::i32, dev)};
  Tensor sorted_keys = Tensor::empty({N}, DType::i32, dev);
  keys_kernel<<<blocks_for(N), kThreads>>>(keys.data<int32_t>(), positions.data<int32_t>(),
                                           ids.data<int32_t>(), lo, N, R);
  CUDA_CHECK_LAUNCH();
  int end_bit = 1;  // keys are 0..R: sort only the bits they use
  while ((int64_t{1} << end_bit) <= R) ++end_bit;
  with_cub_scratch(dev, [&](void* scratch, std::size_t& bytes) {
    return cub::DeviceRadixSort::SortPairs(scratch, bytes, keys.data<int32_t>(),
                                           sorted_keys.data<int32_t>(), positions.data<int32_t>(),
                                           g.order.data<int32_t>(), static_cast<int>(N), 0,
                                           end_bit);
  });
  starts_kernel<<<blocks_for(R + 1), kThreads>>>(g.starts.data<int32_t>(),
                                                 sorted_keys.data<int32_t>(), N, R);
  CUDA_CHECK_LAUNCH();
  return g;
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
