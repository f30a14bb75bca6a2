// Token + position embedding and the cross-entropy loss on the host.
#include <algorithm>
#include <cmath>

#include "common/ops/cpu/ops_cpu.hpp"

namespace scalelab::ops::cpu {

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  const int64_t B = out.size(0), T = out.size(1), C = out.size(2), V = wte.size(0);
  const int32_t* ids = tokens.data<int32_t>();
  SCALELAB_FLOAT_TYPES_AS(out.dtype(), scalar_t, {
    scalar_t* o = out.data<scalar_t>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int32_t id = ids[b * T + t];
        SCALELAB_CHECK(id >= 0 && id < V, "embedding: token {} outside vocabulary of {}", id, V);
        const scalar_t* e = wte.data<scalar_t>() + id * C;
        const scalar_t* p = wpe.data<scalar_t>() + t * C;
        scalar_t* on = o + (b * T + t) * C;
        for (int64_t c = 0; c < C; ++c) on[c] = e[c] + p[c];
      }
  });
}

void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  const int64_t B = dout.size(0), T = dout.size(1), C = dout.size(2);
  const int32_t* ids = tokens.data<int32_t>();
  SCALELAB_FLOAT_TYPES_AS(dout.dtype(), scalar_t, {
    const scalar_t* d = dout.data<scalar_t>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const scalar_t* dn = d + (b * T + t) * C;
        if (dwte.defined()) {
          scalar_t* e = dwte.data<scalar_t>() + ids[b * T + t] * C;
          for (int64_t c = 0; c < C; ++c) e[c] += dn[c];
        }
        if (dwpe.defined()) {
          scalar_t* p = dwpe.data<scalar_t>() + t * C;
          for (int64_t c = 0; c < C; ++c) p[c] += dn[c];
        }
      }
  });
}

void cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits,
                           const Tensor& targets) {
  const int64_t N = logits.size(0), V = logits.size(1);
  softmax_forward(probs, logits);
  const int32_t* ids = targets.data<int32_t>();
  SCALELAB_FLOAT_TYPES_AS(logits.dtype(), scalar_t, {
    for (int64_t n = 0; n < N; ++n) {
      SCALELAB_CHECK(ids[n] >= 0 && ids[n] < V, "cross_entropy: target {} outside {} classes",
                     ids[n], V);
      // log of the softmax from the logits (not log(probs)), so tiny probabilities stay finite
      const scalar_t* x = logits.data<scalar_t>() + n * V;
      scalar_t mx = *std::max_element(x, x + V);
      scalar_t total = 0;
      for (int64_t v = 0; v < V; ++v) total += std::exp(x[v] - mx);
      losses.data<scalar_t>()[n] = std::log(total) + mx - x[ids[n]];
    }
  });
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets,
                            double dloss) {
  const int64_t N = probs.size(0), V = probs.size(1);
  const int32_t* ids = targets.data<int32_t>();
  SCALELAB_FLOAT_TYPES_AS(probs.dtype(), scalar_t, {
    for (int64_t n = 0; n < N; ++n) {
      const scalar_t* p = probs.data<scalar_t>() + n * V;
      scalar_t* d = dlogits.data<scalar_t>() + n * V;
      for (int64_t v = 0; v < V; ++v) d[v] = scalar_t(dloss) * (p[v] - (v == ids[n] ? scalar_t(1) : scalar_t(0)));
    }
  });
}

}  // namespace scalelab::ops::cpu
