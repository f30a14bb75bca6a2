// Embedding and cross-entropy kernels. The embedding backward sums in a fixed order (one thread
// per column, tokens in order; the token embedding's rows grouped by token first:
// rows_by_id.cuh) rather than with atomics, so results are deterministic.
#include "common/ops/cuda/kernels.cuh"
#include "common/ops/cuda/rows_by_id.cuh"

namespace scalelab::ops::cuda {

namespace {
template <class S, class A>
__global__ void embedding_forward_kernel(S* out, const int32_t* ids, const S* wte, const S* wpe,
                                         int64_t n, int64_t T, int64_t C) {
  SCALELAB_GRID_STRIDE(i, n) {
    const int64_t c = i % C, bt = i / C, t = bt % T;
    out[i] = S(A(wte[ids[bt] * C + c]) + A(wpe[t * C + c]));
  }
}

// G: the gradients' type (dout's, or f32 for bf16 dout: R4); sums in A, rounded into G once.
template <class G, class S, class A>
__global__ void embedding_backward_wpe_kernel(G* dwpe, const S* dout, int64_t B, int64_t T,
                                              int64_t C) {
  SCALELAB_GRID_STRIDE(i, T * C) {
    const int64_t t = i / C, c = i % C;
    A s = 0;
    for (int64_t b = 0; b < B; ++b) s += A(dout[(b * T + t) * C + c]);
    dwpe[i] = G(A(dwpe[i]) + s);
  }
}

// Version 1 of the token-embedding gradient (embedding_backward_v1): one thread per (vocabulary
// row v, column c) walks the tokens in order and adds the rows of the tokens equal to v. No
// atomics, so the sum's order (and result) is fixed; but every thread reads all N ids: O(V N C).
template <class G, class S, class A>
__global__ void embedding_backward_wte_v1_kernel(G* dwte, const S* dout, const int32_t* ids,
                                                 int64_t N, int64_t V, int64_t C) {
  SCALELAB_GRID_STRIDE(i, V * C) {
    const int64_t v = i / C, c = i % C;
    A s = 0;
    for (int64_t n = 0; n < N; ++n)
      if (ids[n] == v) s += A(dout[n * C + c]);
    dwte[i] = G(A(dwte[i]) + s);
  }
}

// probs: the logits' storage type S; losses: A (f32 for bf16 logits: R5). The log-sum-exp is
// taken from the logits, not log(probs), so tiny probabilities stay finite.
template <class S, class A>
__global__ void cross_entropy_forward_kernel(A* losses, S* probs, const S* logits,
                                             const int32_t* targets, int64_t N, int64_t V) {
  const int64_t row = warp_row();
  if (row >= N) return;
  const S* x = logits + row * V;
  const A lse = warp_softmax_row<S, A>(probs + row * V, x, V);
  if (lane() == 0) losses[row] = lse - A(x[targets[row]]);
}

template <class S, class A>
__global__ void cross_entropy_backward_kernel(S* dlogits, const S* probs, const int32_t* targets,
                                              int64_t N, int64_t V, A dloss, int64_t lo) {
  SCALELAB_GRID_STRIDE(i, N * V) {
    const int64_t n = i / V, v = i % V;
    dlogits[i] = S(dloss * (A(probs[i]) - (v == targets[n] - lo ? A(1) : A(0))));
  }
}
}  // namespace

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  use_device(out);
  const int64_t n = out.numel(), T = out.size(1), C = out.size(2);
  SCALELAB_TRAIN_TYPES_AS(out.dtype(), scalar_t,
      embedding_forward_kernel<scalar_t, acc_t><<<blocks_for(n), kThreads>>>(
          out.data<scalar_t>(), tokens.data<int32_t>(), wte.data<scalar_t>(),
          wpe.data<scalar_t>(), n, T, C));
  CUDA_CHECK_LAUNCH();
}

namespace {
// embedding_backward at `version` (1 or 2: how the token-embedding gradient is summed).
void embedding_backward_at(int version, Tensor& dwte, Tensor& dwpe, const Tensor& dout,
                           const Tensor& tokens) {
  use_device(dout);
  const int64_t B = dout.size(0), T = dout.size(1), C = dout.size(2);
  const DType grad_dtype = dwte.defined() ? dwte.dtype() : dwpe.dtype();
  SCALELAB_TRAIN_TYPES_AS(dout.dtype(), scalar_t, with_grad_type<scalar_t>(grad_dtype, [&](auto g_tag) {
    using G = decltype(g_tag);
    if (dwpe.defined()) {
      embedding_backward_wpe_kernel<G, scalar_t, acc_t><<<blocks_for(T * C), kThreads>>>(
          dwpe.data<G>(), dout.data<scalar_t>(), B, T, C);
      CUDA_CHECK_LAUNCH();
    }
    if (version == 1 && dwte.defined()) {
      const int64_t V = dwte.size(0);
      embedding_backward_wte_v1_kernel<G, scalar_t, acc_t><<<blocks_for(V * C), kThreads>>>(
          dwte.data<G>(), dout.data<scalar_t>(), tokens.data<int32_t>(), B * T, V, C);
      CUDA_CHECK_LAUNCH();
    }
  }));
  // version 2: each vocabulary row sums the dout rows of its own tokens, in order
  if (version == 2 && dwte.defined())
    add_grouped_rows(dwte, dout.view({B * T, C}), group_rows_by_id(tokens, 0, dwte.size(0)),
                     /*onto_table=*/false);
}
}  // namespace

void embedding_backward(Tensor& dwte, Tensor& dwpe, Tensor const& dout, const Tensor& tokens) {
  embedding_backward_at(2, dwte, dwpe, dout, tokens);
}

void embedding_backward_v1(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  embedding_backward_at(1, dwte, dwpe, dout, tokens);
}

void cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits,
                           const Tensor& targets) {
  use_device(losses);
  const int64_t N = logits.size(0), V = logits.size(1);
  SCALELAB_TRAIN_TYPES_AS(logits.dtype(), scalar_t,
      cross_entropy_forward_kernel<scalar_t, acc_t><<<blocks_for_rows(N), kThreads>>>(
          losses.data<acc_t>(), probs.data<scalar_t>(), logits.data<scalar_t>(),
          targets.data<int32_t>(), N, V));
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets,
                            double dloss, int64_t lo) {
  use_device(dlogits);
  const int64_t N = probs.size(0), V = probs.size(1);
  SCALELAB_TRAIN_TYPES_AS(probs.dtype(), scalar_t,
      cross_entropy_backward_kernel<scalar_t, acc_t><<<blocks_for(N * V), kThreads>>>(
          dlogits.data<scalar_t>(), probs.data<scalar_t>(), targets.data<int32_t>(), N, V,
          acc_t(dloss), lo));
  CUDA_CHECK_LAUNCH();
}

}  // namespace scalelab::ops::cuda
