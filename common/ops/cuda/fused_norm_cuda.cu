// Residual + LayerNorm on a GPU: one warp per row (as layernorm_forward in norm_cuda.cu). Each
// lane adds its columns of x and residual, stores the sum (rounded to the storage type) and
// normalises the stored values, so the result is ops::add then ops::layernorm_forward's up to the
// order of the warp's sums.
#include "common/ops/cuda/kernels.cuh"
#include "common/ops/fused_backend.hpp"

namespace scalelab::ops::cuda {

namespace {
template <class S, class A>
__global__ void residual_layernorm_kernel(S* res_out, S* ln_out, A* mean, A* rstd, const S* x,
                                          const S* residual, const S* w, const S* b, int64_t N,
                                          int64_t C, A eps) {
  const int64_t row = warp_row();
  if (row >= N) return;
  S* res = res_out + row * C;
  A s = 0;
  for (int64_t c = lane(); c < C; c += kWarp) {
    res[c] = S(A(x[row * C + c]) + A(residual[row * C + c]));
    s += A(res[c]);  // the stored (rounded) value: what layernorm_forward would read
  }
  const A m = warp_sum(s) / C;
  A v = 0;
  for (int64_t c = lane(); c < C; c += kWarp) v += (A(res[c]) - m) * (A(res[c]) - m);
  const A r = A(1) / sqrt(warp_sum(v) / C + eps);
  for (int64_t c = lane(); c < C; c += kWarp)
    ln_out[row * C + c] = S((A(res[c]) - m) * r * A(w[c]) + A(b[c]));
  if (lane() == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}
}  // namespace

void residual_layernorm_forward(Tensor& res_out, Tensor& ln_out, Tensor& mean, Tensor& rstd,
                                const Tensor& x, const Tensor& residual, const Tensor& weight,
                                const Tensor& bias, double eps) {
  use_device(x);
  const int64_t C = x.size(-1), N = x.numel() / C;
  SCALELAB_TRAIN_TYPES(x.dtype(), {
    residual_layernorm_kernel<T, acc_t><<<blocks_for_rows(N), kThreads>>>(
        res_out.data<T>(), ln_out.data<T>(), mean.data<acc_t>(), rstd.data<acc_t>(),
        x.data<T>(), residual.data<T>(), weight.data<T>(), bias.data<T>(), N, C, acc_t(eps));
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda
