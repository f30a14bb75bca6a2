// Matmuls on the host: OpenBLAS sgemm/dgemm, row-major.
#include <cblas.h>

#include <mutex>

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

void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha,
            double beta, int64_t batch, int64_t M, int64_t N, int64_t K) {
  configure_blas_threads();
  SCALELAB_FLOAT_TYPES(out.dtype(), {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pc = out.data<T>();
    for (int64_t i = 0; i < batch; ++i) {
      if (K == 0) {  // BLAS may not touch C when K = 0; beta still applies
        for (int64_t j = 0; j < M * N; ++j) pc[i * M * N + j] *= static_cast<T>(beta);
        continue;
      }
      gemm(ta, tb, M, N, K, static_cast<T>(alpha), pa + i * M * K, pb + i * K * N,
           static_cast<T>(beta), pc + i * M * N);
    }
  });
}

}  // namespace scalelab::ops::cpu
