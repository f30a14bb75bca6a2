// LayerNorm backward, version 2: dx, dweight and dbias from one read of x and dout.
//
// Version 1 (norm_cuda.cu) is the readable one: a dx kernel (one warp per row), then dbias and
// dweight as two GPU-wide column sums (column_sums.cuh), which read dout, and x and dout, again:
// five (N, C) reads besides din's. Here each block takes a slice of the rows, one warp per row
// at a time. The warp computes the row's dx as version 1 does and, while it holds the row's
// normalised values, adds norm * dout and dout into its own per-column sums in shared memory.
// Each lane owns the columns c = lane + 32 j of its warp's sums, so no two threads write one
// place and nothing waits until the block's rows are done. The block then adds its warps' sums
// in warp order, one row of partial sums per block, and add_column_sums adds those rows in a
// fixed order into dweight and dbias (llm.c's layernorm_backward takes the same road).
//
// The grid depends on N only and the warps per block on C and the dtype only, so the bits do
// not depend on the GPU, and two runs give the same bits (no atomics). They differ from version
// 1's in the order of the column sums (a few float ulps). Where one warp's sums (2 C of the
// accumulation type) do not fit the 48 KiB of shared memory a block gets without asking (C > 6144
// in f32 and bf16, whose sums are float; C > 3072 in f64) it returns false and version 1 runs.
#include <algorithm>

#include "common/ops/cuda/column_sums.cuh"
#include "common/ops/cuda/kernels.cuh"
#include "common/ops/fused_backend.hpp"

namespace scalelab::ops::cuda {

namespace {
constexpr int64_t kRowsPerBlock = 32;           // a block's slice of the rows (8 warps: 4 rows each)
constexpr int64_t kMaxBlocks = 1024;            // and at most this many slices
constexpr int64_t kSharedBytes = 48 << 10;      // shared memory a launch may take without opting in

template <class S, class A>
__global__ void layernorm_backward_v2_kernel(S* din, A* partial_dw, A* partial_db,
                                             const S* base, const S* dout, const S* in,
                                             const S* w, const A* mean, const A* rstd, int64_t N,
                                             int64_t C) {
  extern __shared__ unsigned char shared[];
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp;
  A* sums = reinterpret_cast<A*>(shared);  // per warp: dweight's C sums, then dbias's C
  A* dw = sums + 2 * C * warp;
  A* db = dw + C;
  for (int64_t c = lane(); c < C; c += kWarp) dw[c] = 0, db[c] = 0;
  const int64_t lo = N * blockIdx.x / gridDim.x, hi = N * (blockIdx.x + 1) / gridDim.x;
  for (int64_t row = lo + warp; row < hi; row += warps) {
    const A m = mean[row], r = rstd[row];
    const S* x = in + row * C;
    const S* dy = dout + row * C;
    A a, b;
    warp_layernorm_backward_means(a, b, x, dy, w, m, r, C);  // as version 1
    for (int64_t c = lane(); c < C; c += kWarp) {
      const A g = A(dy[c]), norm = (A(x[c]) - m) * r, dnorm = A(w[c]) * g;
      din[row * C + c] = S(A(base[row * C + c]) + r * (dnorm - a - norm * b));  // as version 1
      dw[c] += norm * g;  // this lane's own columns: no other thread touches them
      db[c] += g;
    }
  }
  __syncthreads();  // every warp's sums are in: add them in warp order
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    A sw = 0, sb = 0;
    for (int k = 0; k < warps; ++k) sw += sums[2 * C * k + c], sb += sums[2 * C * k + C + c];
    partial_dw[blockIdx.x * C + c] = sw;
    partial_db[blockIdx.x * C + c] = sb;
  }
}
}  // namespace

bool layernorm_backward_v2(Tensor& din, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                           const Tensor& in, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, const Tensor& base) {
  use_device(din);
  const int64_t C = in.size(-1), N = in.numel() / C;
  if (N == 0 || C == 0) return false;
  bool ran = false;
  SCALELAB_TRAIN_TYPES(in.dtype(), {
    const int64_t per_warp = 2 * C * static_cast<int64_t>(sizeof(acc_t));
    const int64_t warps = std::min<int64_t>(kThreads / kWarp, kSharedBytes / per_warp);
    if (warps >= 1) {
      const int64_t blocks = std::clamp<int64_t>((N + kRowsPerBlock - 1) / kRowsPerBlock, 1, kMaxBlocks);
      Tensor partial = Tensor::empty({2, blocks, C}, dtype_of<acc_t>(), din.device());
      acc_t* pdw = partial.data<acc_t>();
      acc_t* pdb = pdw + blocks * C;
      layernorm_backward_v2_kernel<T, acc_t>
          <<<static_cast<int>(blocks), static_cast<int>(warps * kWarp),
             static_cast<size_t>(warps * per_warp)>>>(
              din.data<T>(), pdw, pdb, base.data<T>(), dout.data<T>(), in.data<T>(),
              weight.data<T>(),
              mean.data<acc_t>(), rstd.data<acc_t>(), N, C);
      CUDA_CHECK_LAUNCH();
      with_grad_type<T>(dweight.dtype(), [&](auto g_tag) {
        using G = decltype(g_tag);
        add_column_sums<G, acc_t>(dweight.data<G>(), blocks, C, Element<acc_t>{pdw, C},
                                  dweight.device());
        add_column_sums<G, acc_t>(dbias.data<G>(), blocks, C, Element<acc_t>{pdb, C},
                                  dbias.device());
      });
      ran = true;
    }
  });
  return ran;
}

}  // namespace scalelab::ops::cuda
