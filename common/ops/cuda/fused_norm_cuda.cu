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
  for (int64_t c = lane(); c < C; c += kWarp)
    res[c] = S(A(x[row * C + c]) + A(residual[row * C + c]));
  // the LayerNorm of the stored (rounded) row, as layernorm_forward would read it; each lane
  // reads back only the columns it wrote, so no synchronisation is needed
  warp_layernorm_row(ln_out + row * C, mean + row, rstd + row, res, w, b, C, eps);
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
