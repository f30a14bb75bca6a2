// Matmuls on the host: OpenBLAS sgemm/dgemm, row-major. bf16 matmuls (R2) convert a and b to
// float and call sgemm: the products and sums are fp32, as on tensor cores. OpenBLAS has a
// bf16-in, fp32-out cblas_sbgemm, and Debian's cblas.h declares it, but Debian's libopenblas
// 0.3.21 is built without BUILD_BFLOAT16 and does not export it (the link fails), so the
// conversion is ours: O(MK + KN) extra work beside the O(MNK) product.
#include <cblas.h>

#include <mutex>
#include <vector>

#include "common/ops/cpu/ops_cpu.hpp"
#include "common/runtime.hpp"

namespace scalelab::ops::cpu {

namespace {
// With more than one rank per machine, each rank gets one BLAS thread: ranks do not fight over
// cores, and results do not depend on how many threads OpenBLAS picked.
void configure_blas_threads() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (world_size() > 1) openblas_set_num_threads(1);
  });
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
          const float* b, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, a, ta ? M : K, b, tb ? K : N, beta, c, N);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* a,
          const double* b, double beta, double* c) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, a, ta ? M : K, b, tb ? K : N, beta, c, N);
}
}  // namespace

namespace {
void to_float(std::vector<float>& dst, const bf16* src, int64_t n) {
  dst.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) dst[i] = float(src[i]);
}

// a, b bf16; out f32 (accumulated into with beta, R2) or bf16 (rounded once at the end).
void matmul_bf16(Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha,
                 double beta, int64_t batch, int64_t M, int64_t N, int64_t K) {
  const bf16* pa = a.data<bf16>();
  const bf16* pb = b.data<bf16>();
  const bool out_f32 = out.dtype() == DType::f32;
  std::vector<float> fa, fb, fc;
  for (int64_t i = 0; i < batch; ++i) {
    to_float(fa, pa + i * M * K, M * K);
    to_float(fb, pb + i * K * N, K * N);
    float* c;
    if (out_f32) {
      c = out.data<float>() + i * M * N;
    } else {
      to_float(fc, out.data<bf16>() + i * M * N, M * N);
      c = fc.data();
    }
    if (K == 0) {  // out = beta * out; beta 0 never reads out (it may be uninitialised)
      for (int64_t j = 0; j < M * N; ++j)
        c[j] = beta == 0.0 ? 0.0f : c[j] * static_cast<float>(beta);
    } else {
      gemm(ta, tb, M, N, K, static_cast<float>(alpha), fa.data(), fb.data(),
           static_cast<float>(beta), c);
    }
    if (!out_f32) {
      bf16* o = out.data<bf16>() + i * M * N;
      for (int64_t j = 0; j < M * N; ++j) o[j] = bf16(fc[j]);
    }
  }
}
}  // namespace

void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha,
            double beta, int64_t batch, int64_t M, int64_t N, int64_t K) {
  configure_blas_threads();
  if (a.dtype() == DType::bf16)
    return matmul_bf16(out, a, b, ta, tb, alpha, beta, batch, M, N, K);
  SCALELAB_FLOAT_TYPES(out.dtype(), {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pc = out.data<T>();
    for (int64_t i = 0; i < batch; ++i) {
      if (K == 0) {  // BLAS may not touch C when K = 0; beta still applies (0: never read)
        for (int64_t j = 0; j < M * N; ++j)
          pc[i * M * N + j] = beta == 0.0 ? T(0) : pc[i * M * N + j] * static_cast<T>(beta);
        continue;
      }
      gemm(ta, tb, M, N, K, static_cast<T>(alpha), pa + i * M * K, pb + i * K * N,
           static_cast<T>(beta), pc + i * M * N);
    }
  });
}

}  // namespace scalelab::ops::cpu
