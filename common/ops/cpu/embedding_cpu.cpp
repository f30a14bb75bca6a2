// Token + position embedding and the cross-entropy loss on the host.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "common/ops/cpu/ops_cpu.hpp"

namespace scalelab::ops::cpu {

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  const int64_t B = out.size(0), T = out.size(1), C = out.size(2), V = wte.size(0);
  const int32_t* ids = tokens.data<int32_t>();
  SCALELAB_TRAIN_TYPES_AS(out.dtype(), scalar_t, {
    scalar_t* o = out.data<scalar_t>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int32_t id = ids[b * T + t];
        SCALELAB_CHECK(id >= 0 && id < V, "embedding: token {} outside vocabulary of {}", id, V);
        const scalar_t* e = wte.data<scalar_t>() + id * C;
        const scalar_t* p = wpe.data<scalar_t>() + t * C;
        scalar_t* on = o + (b * T + t) * C;
        for (int64_t c = 0; c < C; ++c) on[c] = scalar_t(acc_t(e[c]) + acc_t(p[c]));
      }
  });
}

namespace {
// dwte[ids] += dout, dwpe[t] += dout for dout of element type D and gradients of type G (the
// same, or f32 gradients for bf16 dout: R4), summed in G's precision. bf16 gradients would round
// at every token (a frequent token's row sums thousands of terms): mixed precision uses f32 ones.
template <class G, class D>
void embedding_backward_typed(Tensor& dwte, Tensor& dwpe, const Tensor& dout,
                              const Tensor& tokens) {
  const int64_t B = dout.size(0), T = dout.size(1), C = dout.size(2);
  const int32_t* ids = tokens.data<int32_t>();
  using A = std::conditional_t<std::is_same_v<G, double>, double, float>;
  const D* d = dout.data<D>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const D* dn = d + (b * T + t) * C;
      if (dwte.defined()) {
        G* e = dwte.data<G>() + ids[b * T + t] * C;
        for (int64_t c = 0; c < C; ++c) e[c] = G(A(e[c]) + A(dn[c]));
      }
      if (dwpe.defined()) {
        G* p = dwpe.data<G>() + t * C;
        for (int64_t c = 0; c < C; ++c) p[c] = G(A(p[c]) + A(dn[c]));
      }
    }
}
}  // namespace

void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  const DType grad_dtype = dwte.defined() ? dwte.dtype() : dwpe.dtype();
  if (dout.dtype() == DType::bf16 && grad_dtype == DType::f32)
    return embedding_backward_typed<float, bf16>(dwte, dwpe, dout, tokens);
  SCALELAB_TRAIN_TYPES_AS(dout.dtype(), scalar_t, {
    embedding_backward_typed<scalar_t, scalar_t>(dwte, dwpe, dout, tokens);
  });
}

void cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits,
                           const Tensor& targets) {
  const int64_t N = logits.size(0), V = logits.size(1);
  softmax_forward(probs, logits);
  const int32_t* ids = targets.data<int32_t>();
  SCALELAB_TRAIN_TYPES_AS(logits.dtype(), scalar_t, {
    // losses are the logits' dtype, or f32 for bf16 logits (R5): acc_t is exactly that
    acc_t* loss = losses.data<acc_t>();
    for (int64_t n = 0; n < N; ++n) {
      SCALELAB_CHECK(ids[n] >= 0 && ids[n] < V, "cross_entropy: target {} outside {} classes",
                     ids[n], V);
      // log of the softmax from the logits (not log(probs)), so tiny probabilities stay finite
      const scalar_t* x = logits.data<scalar_t>() + n * V;
      acc_t mx = -std::numeric_limits<acc_t>::infinity();
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, acc_t(x[v]));
      acc_t total = 0;
      for (int64_t v = 0; v < V; ++v) total += std::exp(acc_t(x[v]) - mx);
      loss[n] = std::log(total) + mx - acc_t(x[ids[n]]);
    }
  });
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets,
                            double dloss, int64_t lo) {
  const int64_t N = probs.size(0), V = probs.size(1);
  const int32_t* ids = targets.data<int32_t>();
  SCALELAB_TRAIN_TYPES_AS(probs.dtype(), scalar_t, {
    using A = acc_t;
    for (int64_t n = 0; n < N; ++n) {
      const scalar_t* p = probs.data<scalar_t>() + n * V;
      scalar_t* d = dlogits.data<scalar_t>() + n * V;
      for (int64_t v = 0; v < V; ++v)
        d[v] = scalar_t(A(dloss) * (A(p[v]) - (v == ids[n] - lo ? A(1) : A(0))));
    }
  });
}

}  // namespace scalelab::ops::cpu
