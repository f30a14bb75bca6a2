// Reductions and optimizer updates. Sums are two-pass with a fixed grid (per-block partials in
// double, added in order: on the host for sum(), by one GPU thread for sum_into(), the same
// additions in the same order): deterministic, unlike atomics.
#include <vector>

#include "common/ops/cuda/kernels.cuh"
#include "common/ops/fused_backend.hpp"
#include "common/ops/trial_kernels.hpp"

namespace scalelab::ops::cuda {

namespace {
constexpr int kSumBlocks = 256;
// version 2's grid (the trial kernel "sums_16_bytes", below): twice the blocks
constexpr int kSumBlocks16 = 512;
int g_last_sum_blocks = 0;  // last_sum_blocks

// The block's threads' sums s added in a fixed tree, into partial[blockIdx.x].
__device__ inline void block_sum_to(double* partial, double s) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

template <class S, class A, bool kSquare>
__global__ void partial_sum_kernel(double* partial, const S* x, int64_t n) {
  double s = 0;
  SCALELAB_GRID_STRIDE(i, n) {
    const double v = static_cast<double>(A(x[i]));  // bf16 -> float -> double: exact
    s += kSquare ? v * v : v;
  }
  block_sum_to(partial, s);
}

// partial_sum_kernel for f32 in 16-byte pieces (the trial kernel "sums_16_bytes"): a thread adds
// the 4 elements of each of its float4s in order, in double, on kSumBlocks16 blocks. Why: 256
// blocks of one 4-byte load a thread keep few bytes in flight (clipping's sum of squares over
// gpt-85m's 86M f32 gradients, estimated ~1.5 TB/s); this keeps about 8 times as many. Other
// partials than version 1's (other bits of the sum), as fixed: deterministic.
template <bool kSquare>
__global__ void partial_sum_f32x4_kernel(double* partial, const float4* x, int64_t n4) {
  double s = 0;
  SCALELAB_GRID_STRIDE(i, n4) {
    const float4 q = x[i];
    const float e[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const double v = e[k];
      s += kSquare ? v * v : v;
    }
  }
  block_sum_to(partial, s);
}

// out[0] = (partial[0] + partial[1] + ...) / divisor, in that order: one thread, 256 additions
// (512 under "sums_16_bytes").
__global__ void add_partials_kernel(double* out, const double* partial, int n, double divisor) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += partial[i];
  *out = s / divisor;
}

// out[0] += partial[0] + partial[1] + ... (summed in that order first): the host's
// `s += sum_squares(x)`, the same additions.
__global__ void accumulate_partials_kernel(double* out, const double* partial, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += partial[i];
  *out += s;
}

// Clipping with the norm read on the device: every thread reads the one sum of squares (a
// cached load) and the whole grid leaves x untouched when norm <= max_norm. sqrt and the
// division are correctly rounded in double on both sides, so the factor has the host's bits.
template <class S, class A>
__global__ void clip_scale_kernel(S* x, const double* sum_squares, double max_norm, int64_t n) {
  const double norm = sqrt(*sum_squares);
  if (!(norm > max_norm)) return;
  const A f = A(max_norm / (norm + 1e-6));
  SCALELAB_GRID_STRIDE(i, n) x[i] = S(A(x[i]) * f);
}

template <class S, class A>
__global__ void sqrt_kernel(S* out, const S* x, int64_t n) {
  SCALELAB_GRID_STRIDE(i, n) out[i] = S(sqrt(A(x[i])));
}

// The per-block partial sums of x (or of its squares), in a scratch buffer of the device.
struct Partials {
  double* at;
  int n;  // how many: the grid's blocks
};
template <bool kSquare>
Partials partial_sums(const Tensor& x) {
  use_device(x);
  // a small scratch buffer per device, kept (cudaMalloc / cudaFree would synchronise each call);
  // kernels on the one stream use it one after the other
  static thread_local double* scratch[64] = {};
  double*& partial = scratch[x.device().index];
  if (!partial) CUDA_CHECK(cudaMalloc(&partial, kSumBlocks16 * sizeof(double)));
  const int64_t n = x.numel();
  // on trial: f32 in 16-byte pieces (above)
  if (x.dtype() == DType::f32 && n > 0 && n % 4 == 0 && aligned16(x.data_ptr()) &&
      trial_kernel("sums_16_bytes")) {
    partial_sum_f32x4_kernel<kSquare><<<kSumBlocks16, kThreads>>>(
        partial, static_cast<const float4*>(x.data_ptr()), n / 4);
    CUDA_CHECK_LAUNCH();
    g_last_sum_blocks = kSumBlocks16;
    return {partial, kSumBlocks16};
  }
  SCALELAB_TRAIN_TYPES(x.dtype(), partial_sum_kernel<T, acc_t, kSquare><<<kSumBlocks, kThreads>>>(
                                      partial, x.data<T>(), n));
  CUDA_CHECK_LAUNCH();
  g_last_sum_blocks = kSumBlocks;
  return {partial, kSumBlocks};
}

template <bool kSquare>
double reduce(const Tensor& x) {
  const Partials partial = partial_sums<kSquare>(x);
  std::vector<double> host(partial.n);
  CUDA_CHECK(cudaMemcpy(host.data(), partial.at, partial.n * sizeof(double),
                        cudaMemcpyDeviceToHost));
  double s = 0;
  for (double v : host) s += v;
  return s;
}

// One pass over the flat buffer (one launch per call): the master weights p, gradient g and
// AdamW's state m, v in f32 (or f64). With `compute` (R8) the same thread also writes the bf16
// copy of its new weight, so the mixed-precision model's compute copy is refreshed without a
// second pass over p (2 bytes written per parameter instead of 4 read + 2 written).
template <class S>
__global__ void adamw_kernel(S* p, const S* g, S* m, S* v, bf16* compute, int64_t n, S lr, S b1,
                             S b2, S eps, S wd, S c1, S c2) {
  SCALELAB_GRID_STRIDE(i, n) {
    m[i] = b1 * m[i] + (S(1) - b1) * g[i];
    v[i] = b2 * v[i] + (S(1) - b2) * g[i] * g[i];
    const S mhat = m[i] / c1, vhat = v[i] / c2;
    p[i] -= lr * (mhat / (sqrt(vhat) + eps) + wd * p[i]);
    if (compute) compute[i] = bf16(static_cast<float>(p[i]));
  }
}

// The decay segments of a flat buffer, passed by value as a kernel argument (no copy to the
// device, no allocation): 256 ends and flags fit the 4 KB of a launch's parameters.
struct SegmentTable {
  int n = 0;
  int64_t end[kMaxDecaySegments];
  unsigned char decay[kMaxDecaySegments];
};

// adamw_kernel over every parameter of a model at once: each element finds its segment (binary
// search over at most 256 ends: 8 steps) for its weight decay, then the same update.
template <class S>
__global__ void adamw_segments_kernel(S* p, const S* g, S* m, S* v, bf16* compute, int64_t n,
                                      SegmentTable table, S lr, S b1, S b2, S eps, S wd, S c1,
                                      S c2) {
  SCALELAB_GRID_STRIDE(i, n) {
    int lo = 0, hi = table.n - 1;  // the first segment whose end is beyond i
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (table.end[mid] > i) hi = mid;
      else lo = mid + 1;
    }
    const S w = table.decay[lo] ? wd : S(0);
    m[i] = b1 * m[i] + (S(1) - b1) * g[i];
    v[i] = b2 * v[i] + (S(1) - b2) * g[i] * g[i];
    const S mhat = m[i] / c1, vhat = v[i] / c2;
    p[i] -= lr * (mhat / (sqrt(vhat) + eps) + w * p[i]);
    if (compute) compute[i] = bf16(static_cast<float>(p[i]));
  }
}

template <class S>
__global__ void sgd_kernel(S* p, const S* g, S* buf, int64_t n, S lr, S momentum, S wd,
                           bool first) {
  SCALELAB_GRID_STRIDE(i, n) {
    S d = g[i] + wd * p[i];
    if (buf) {
      buf[i] = first ? d : momentum * buf[i] + d;
      d = buf[i];
    }
    p[i] -= lr * d;
  }
}
}  // namespace

int last_sum_blocks() { return g_last_sum_blocks; }

double sum(const Tensor& x) { return reduce<false>(x); }

void sum_into(Tensor& out, const Tensor& x, double divisor) {
  const Partials partial = partial_sums<false>(x);
  add_partials_kernel<<<1, 1>>>(out.data<double>(), partial.at, partial.n, divisor);
  CUDA_CHECK_LAUNCH();
}
double sum_squares(const Tensor& x) { return reduce<true>(x); }

void sum_squares_into(Tensor& out, const Tensor& x) {
  const Partials partial = partial_sums<true>(x);
  accumulate_partials_kernel<<<1, 1>>>(out.data<double>(), partial.at, partial.n);
  CUDA_CHECK_LAUNCH();
}

void clip_scale(Tensor& x, const Tensor& sum_squares, double max_norm) {
  use_device(x);
  const int64_t n = x.numel();
  SCALELAB_TRAIN_TYPES(x.dtype(), clip_scale_kernel<T, acc_t><<<blocks_for(n), kThreads>>>(
                                      x.data<T>(), sum_squares.data<double>(), max_norm, n));
  CUDA_CHECK_LAUNCH();
}

void sqrt_into(Tensor& out, const Tensor& x) {
  use_device(out);
  const int64_t n = x.numel();
  SCALELAB_TRAIN_TYPES(x.dtype(), sqrt_kernel<T, acc_t><<<blocks_for(n), kThreads>>>(
                                      out.data<T>(), x.data<T>(), n));
  CUDA_CHECK_LAUNCH();
}

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& a,
                  Tensor* compute) {
  use_device(param);
  const int64_t n = param.numel();
  const double c1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double c2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  SCALELAB_FLOAT_TYPES(param.dtype(), adamw_kernel<<<blocks_for(n), kThreads>>>(
      param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(),
      compute ? compute->data<bf16>() : nullptr, n, T(a.lr), T(a.beta1),
      T(a.beta2), T(a.eps), T(a.weight_decay), T(c1), T(c2)));
  CUDA_CHECK_LAUNCH();
}

void adamw_update_segments(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                           const DecaySegments& segments, const AdamWArgs& a, Tensor* compute) {
  const std::size_t k = segments.ends.size();  // at most kMaxDecaySegments (the dispatcher)
  use_device(param);
  SegmentTable table;
  table.n = static_cast<int>(k);
  for (std::size_t i = 0; i < k; ++i) {
    table.end[i] = segments.ends[i];
    table.decay[i] = segments.decay[i] ? 1 : 0;
  }
  const int64_t n = param.numel();
  const double c1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double c2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  SCALELAB_FLOAT_TYPES(param.dtype(), adamw_segments_kernel<<<blocks_for(n), kThreads>>>(
      param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(),
      compute ? compute->data<bf16>() : nullptr, n, table, T(a.lr), T(a.beta1), T(a.beta2),
      T(a.eps), T(a.weight_decay), T(c1), T(c2)));
  CUDA_CHECK_LAUNCH();
}

void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, double lr, double momentum,
                double weight_decay, bool first_step) {
  use_device(param);
  const int64_t n = param.numel();
  SCALELAB_FLOAT_TYPES(param.dtype(), sgd_kernel<<<blocks_for(n), kThreads>>>(
      param.data<T>(), grad.data<T>(), momentum > 0 ? buf.data<T>() : nullptr, n, T(lr),
      T(momentum), T(weight_decay), first_step));
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda
