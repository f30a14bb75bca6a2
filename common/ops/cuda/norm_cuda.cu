// LayerNorm and row softmax: one warp per row. Storage S (float, double, bf16), compute A (float,
// or double for f64); LayerNorm's mean and rstd are A (f32 for bf16 data: R3); its parameter
// gradients G are S or f32 for bf16 data (R3), summed in A and rounded once. LayerNorm's backward
// here is version 1, the readable one (version 2: layernorm_backward_v2_cuda.cu).
#include "common/ops/cuda/column_sums.cuh"
#include "common/ops/cuda/kernels.cuh"
#include "common/ops/fused_backend.hpp"
#include "common/ops/trial_kernels.hpp"

namespace scalelab::ops::cuda {

namespace {
template <class S, class A>
__global__ void layernorm_forward_kernel(S* out, A* mean, A* rstd, const S* in, const S* w,
                                         const S* b, int64_t N, int64_t C, A eps) {
  const int64_t row = warp_row();
  if (row >= N) return;
  warp_layernorm_row(out + row * C, mean + row, rstd + row, in + row * C, w, b, C, eps);
}

// dx per row (one warp per row): din = base + ..., base being din itself or the residual's
// gradient (then the residual's backward costs no pass of its own)
template <class S, class A>
__global__ void layernorm_backward_dx_kernel(S* din, const S* base, const S* dout, const S* in,
                                             const S* w, const A* mean, const A* rstd, int64_t N,
                                             int64_t C) {
  const int64_t row = warp_row();
  if (row >= N) return;
  const A m = mean[row], r = rstd[row];
  const S* x = in + row * C;
  const S* dy = dout + row * C;
  A a, b;
  warp_layernorm_backward_means(a, b, x, dy, w, m, r, C);
  for (int64_t c = lane(); c < C; c += kWarp) {
    const A norm = (A(x[c]) - m) * r, dnorm = A(w[c]) * A(dy[c]);
    din[row * C + c] = S(A(base[row * C + c]) + r * (dnorm - a - norm * b));
  }
}

// the summand of dweight: norm(x) * dout
template <class S, class A>
struct NormTimesGrad {
  const S *in, *dout;
  const A *mean, *rstd;
  int64_t C;
  __device__ A operator()(int64_t n, int64_t c) const {
    return (A(in[n * C + c]) - mean[n]) * rstd[n] * A(dout[n * C + c]);
  }
};

// one warp per row; the exponentials are recomputed for the quotient (no row-sized scratch)
template <class S, class A>
__global__ void softmax_kernel(S* out, const S* in, int64_t N, int64_t C) {
  const int64_t row = warp_row();
  if (row >= N) return;
  warp_softmax_row<S, A>(out + row * C, in + row * C, C);
}
}  // namespace

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& in,
                       const Tensor& weight, const Tensor& bias, double eps) {
  use_device(out);
  const int64_t C = in.size(-1), N = in.numel() / C;
  SCALELAB_TRAIN_TYPES(in.dtype(), layernorm_forward_kernel<T, acc_t><<<blocks_for_rows(N), kThreads>>>(
                                       out.data<T>(), mean.data<acc_t>(), rstd.data<acc_t>(),
                                       in.data<T>(), weight.data<T>(), bias.data<T>(), N, C,
                                       acc_t(eps)));
  CUDA_CHECK_LAUNCH();
}

void layernorm_backward(Tensor& din, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& in, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& base) {
  use_device(din);
  // version 3 (layernorm_backward_v3_cuda.cu): one read, the column sums in registers, on trial
  // (written without a GPU)
  if (trial_kernel("layernorm_backward_v3") &&
      layernorm_backward_v3(din, dweight, dbias, dout, in, weight, mean, rstd, base))
    return;
  // version 2 (layernorm_backward_v2_cuda.cu): one read of x and dout, on trial (checked on an
  // H200, but 3x slower than version 1 there: scalelab_bench_kernels)
  if (trial_kernel("layernorm_backward_v2") &&
      layernorm_backward_v2(din, dweight, dbias, dout, in, weight, mean, rstd, base))
    return;
  const int64_t C = in.size(-1), N = in.numel() / C;
  SCALELAB_TRAIN_TYPES(in.dtype(), {
    layernorm_backward_dx_kernel<T, acc_t><<<blocks_for_rows(N), kThreads>>>(
        din.data<T>(), base.data<T>(), dout.data<T>(), in.data<T>(), weight.data<T>(),
        mean.data<acc_t>(), rstd.data<acc_t>(), N, C);
    CUDA_CHECK_LAUNCH();
    // dweight, dbias: column sums in a fixed order (deterministic)
    with_grad_type<T>(dweight.dtype(), [&](auto g_tag) {
      using G = decltype(g_tag);
      add_column_sums<G, acc_t>(dbias.data<G>(), N, C, Element<T, acc_t>{dout.data<T>(), C},
                                dbias.device());
      add_column_sums<G, acc_t>(dweight.data<G>(), N, C,
                                NormTimesGrad<T, acc_t>{in.data<T>(), dout.data<T>(),
                                                        mean.data<acc_t>(), rstd.data<acc_t>(), C},
                                dweight.device());
    });
  });
}

void softmax_forward(Tensor& out, const Tensor& in) {
  use_device(out);
  const int64_t C = in.size(-1), N = in.numel() / C;
  SCALELAB_TRAIN_TYPES(in.dtype(), softmax_kernel<T, acc_t><<<blocks_for_rows(N), kThreads>>>(
                                       out.data<T>(), in.data<T>(), N, C));
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda
