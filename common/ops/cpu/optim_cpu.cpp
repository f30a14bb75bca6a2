// Reductions and optimizer updates on the host.
#include <algorithm>
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/ops/cpu/ops_cpu.hpp"

namespace scalelab::ops::cpu {

double sum(const Tensor& x) {
  double total = 0;
  SCALELAB_TRAIN_TYPES(x.dtype(), {
    const T* p = x.data<T>();
    for (int64_t i = 0, n_ = x.numel(); i < n_; ++i) total += static_cast<double>(acc_t(p[i]));
  });
  return total;
}

void sum_into(Tensor& out, const Tensor& x, double divisor) {
  out.data<double>()[0] = sum(x) / divisor;
}

double sum_squares(const Tensor& x) {
  double total = 0;
  SCALELAB_TRAIN_TYPES(x.dtype(), {
    const T* p = x.data<T>();
    for (int64_t i = 0, n_ = x.numel(); i < n_; ++i) {
      const double xi = static_cast<double>(acc_t(p[i]));
      total += xi * xi;
    }
  });
  return total;
}

void sum_squares_into(Tensor& out, const Tensor& x) { out.data<double>()[0] += sum_squares(x); }

void clip_scale(Tensor& x, const Tensor& sum_squares, double max_norm) {
  const double norm = std::sqrt(sum_squares.data<double>()[0]);  // host memory: not a read back
  if (norm > max_norm) scale(x, max_norm / (norm + 1e-6));
}

void sqrt_into(Tensor& out, const Tensor& x) {
  SCALELAB_TRAIN_TYPES(x.dtype(), {
    const T* p = x.data<T>();
    T* o = out.data<T>();
    for (int64_t i = 0, n_ = x.numel(); i < n_; ++i) o[i] = T(std::sqrt(acc_t(p[i])));
  });
}

namespace {
// AdamW's constants for one call, converted once to the element type (as the loop used to do
// per element: T(beta1), T(1 - beta1), T(c1), ...), so every path below computes the same
// operations in the same order and gives bitwise the same result.
template <typename T>
struct AdamWConst {
  T b1, ob1, b2, ob2, c1, c2, lr, eps, wd;
  explicit AdamWConst(const AdamWArgs& a)
      : b1(T(a.beta1)), ob1(T(1 - a.beta1)), b2(T(a.beta2)), ob2(T(1 - a.beta2)),
        c1(T(1.0 - std::pow(a.beta1, static_cast<double>(a.step)))),
        c2(T(1.0 - std::pow(a.beta2, static_cast<double>(a.step)))), lr(T(a.lr)), eps(T(a.eps)),
        wd(T(a.weight_decay)) {}
};

// The reference loop (and the tail of the vector loop): elements [i, n).
template <typename T>
void adamw_scalar(T* __restrict p, const T* __restrict g, T* __restrict pm, T* __restrict pv,
                  int64_t i, int64_t n, const AdamWConst<T>& k) {
  for (; i < n; ++i) {
    const T gi = g[i];
    const T m = k.b1 * pm[i] + k.ob1 * gi;
    const T v = k.b2 * pv[i] + k.ob2 * gi * gi;
    pm[i] = m;
    pv[i] = v;
    const T mhat = m / k.c1, vhat = v / k.c2;
    p[i] -= k.lr * (mhat / (std::sqrt(vhat) + k.eps) + k.wd * p[i]);
  }
}

// float32, the training dtype: one pass over p, g, m, v. GCC does not auto-vectorise std::sqrt
// without -fno-math-errno (sqrtf may set errno), and the scalar loop is then 4-6x slower, so the
// loop is written with intrinsics: 8 floats at a time with AVX where the CPU has it (chosen at
// run time: the function alone is compiled for AVX, so the build needs no -march flag and runs on
// any x86-64), else 4 with SSE2 (part of every x86-64 CPU), else the scalar loop (other CPUs).
// All three do the operations of adamw_scalar in the same order (no FMA; division by c1 and c2
// as before), so the result is bitwise the same whichever runs. The update is bound by memory
// bandwidth (16 bytes read and 12 written per parameter): one fused pass is why it beats
// PyTorch's default foreach implementation, which makes several passes over the state.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SCALELAB_ADAMW_X86 1
#define SCALELAB_ADAMW_LOOP(W, VEC, SET1, LOAD, STORE, ADD, SUB, MUL, DIV, SQRT)                  \
  const VEC b1 = SET1(k.b1), ob1 = SET1(k.ob1), b2 = SET1(k.b2), ob2 = SET1(k.ob2),              \
            c1 = SET1(k.c1), c2 = SET1(k.c2), lr = SET1(k.lr), eps = SET1(k.eps), wd = SET1(k.wd); \
  for (; i + W <= n; i += W) {                                                                   \
    const VEC gi = LOAD(g + i);                                                                  \
    const VEC m = ADD(MUL(b1, LOAD(pm + i)), MUL(ob1, gi));                                      \
    const VEC v = ADD(MUL(b2, LOAD(pv + i)), MUL(MUL(ob2, gi), gi));                             \
    STORE(pm + i, m);                                                                            \
    STORE(pv + i, v);                                                                            \
    const VEC mhat = DIV(m, c1), vhat = DIV(v, c2);                                              \
    const VEC pi = LOAD(p + i);                                                                  \
    STORE(p + i, SUB(pi, MUL(lr, ADD(DIV(mhat, ADD(SQRT(vhat), eps)), MUL(wd, pi)))));           \
  }

__attribute__((target("avx"))) int64_t adamw_f32_avx(float* __restrict p,
                                                     const float* __restrict g,
                                                     float* __restrict pm, float* __restrict pv,
                                                     int64_t n, const AdamWConst<float>& k) {
  int64_t i = 0;
  SCALELAB_ADAMW_LOOP(8, __m256, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps,
                      _mm256_add_ps, _mm256_sub_ps, _mm256_mul_ps, _mm256_div_ps, _mm256_sqrt_ps)
  return i;
}

int64_t adamw_f32_sse2(float* __restrict p, const float* __restrict g, float* __restrict pm,
                       float* __restrict pv, int64_t n, const AdamWConst<float>& k) {
  int64_t i = 0;
  SCALELAB_ADAMW_LOOP(4, __m128, _mm_set1_ps, _mm_loadu_ps, _mm_storeu_ps, _mm_add_ps,
                      _mm_sub_ps, _mm_mul_ps, _mm_div_ps, _mm_sqrt_ps)
  return i;
}
#undef SCALELAB_ADAMW_LOOP
#endif

void adamw_f32(float* p, const float* g, float* pm, float* pv, int64_t n,
               const AdamWConst<float>& k) {
  int64_t done = 0;
#if defined(SCALELAB_ADAMW_X86)
  static const bool avx = __builtin_cpu_supports("avx");
  done = avx ? adamw_f32_avx(p, g, pm, pv, n, k) : adamw_f32_sse2(p, g, pm, pv, n, k);
#endif
  adamw_scalar(p, g, pm, pv, done, n, k);  // the tail, or everything on other CPUs
}
}  // namespace

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& a,
                  Tensor* compute) {
  const int64_t n = param.numel();
  bf16* copy = compute ? compute->data<bf16>() : nullptr;
  if (param.dtype() == DType::f32) {
    const AdamWConst<float> k(a);
    float *p = param.data<float>(), *pm = m.data<float>(), *pv = v.data<float>();
    const float* g = grad.data<float>();
    if (!copy) return adamw_f32(p, g, pm, pv, n, k);
    // With a compute copy (R8): update a block of the master weights, then round that block,
    // still in cache, into the bf16 copy -- one pass over memory, the vector loop unchanged.
    constexpr int64_t kBlock = 4096;
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t len = std::min(kBlock, n - i);
      adamw_f32(p + i, g + i, pm + i, pv + i, len, k);
      for (int64_t j = i; j < i + len; ++j) copy[j] = bf16(p[j]);
    }
    return;
  }
  SCALELAB_FLOAT_TYPES(param.dtype(), {
    T* p = param.data<T>();
    adamw_scalar(p, grad.data<T>(), m.data<T>(), v.data<T>(), 0, n, AdamWConst<T>(a));
    if (copy)
      for (int64_t i = 0; i < n; ++i) copy[i] = bf16(static_cast<float>(p[i]));
  });
}

void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, double lr, double momentum,
                double weight_decay, bool first_step) {
  SCALELAB_FLOAT_TYPES(param.dtype(), {
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* b = momentum > 0 ? buf.data<T>() : nullptr;
    for (int64_t i = 0, n_ = param.numel(); i < n_; ++i) {
      T d = g[i] + T(weight_decay) * p[i];
      if (b) {
        b[i] = first_step ? d : T(momentum) * b[i] + d;
        d = b[i];
      }
      p[i] -= T(lr) * d;
    }
  });
}

}  // namespace scalelab::ops::cpu
