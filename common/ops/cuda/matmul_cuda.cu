// Matmuls on a GPU: cuBLAS (column-major) computing row-major products. A row-major (M, N)
// matrix is a column-major (N, M) one, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T.
#include "common/ops/cuda/kernels.cuh"

namespace scalelab::ops::cuda {

namespace {
cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t tb, cublasOperation_t ta, int n, int m,
                    int k, const float* alpha, const float* b, int ldb, long long sb,
                    const float* a, int lda, long long sa, const float* beta, float* c, int ldc,
                    long long sc, int batch) {
  return cublasSgemmStridedBatched(h, tb, ta, n, m, k, alpha, b, ldb, sb, a, lda, sa, beta, c,
                                   ldc, sc, batch);
}
cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t tb, cublasOperation_t ta, int n, int m,
                    int k, const double* alpha, const double* b, int ldb, long long sb,
                    const double* a, int lda, long long sa, const double* beta, double* c,
                    int ldc, long long sc, int batch) {
  return cublasDgemmStridedBatched(h, tb, ta, n, m, k, alpha, b, ldb, sb, a, lda, sa, beta, c,
                                   ldc, sc, batch);
}
}  // namespace

void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha,
            double beta, int64_t batch, int64_t M, int64_t N, int64_t K) {
  use_device(out);
  SCALELAB_FLOAT_TYPES(out.dtype(), {
    const T al = static_cast<T>(alpha), be = static_cast<T>(beta);
    CUBLAS_CHECK(gemm(cublas_handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                      static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &al,
                      b.data<T>(), static_cast<int>(tb ? K : N), K * N, a.data<T>(),
                      static_cast<int>(ta ? M : K), M * K, &be, out.data<T>(),
                      static_cast<int>(N), M * N, static_cast<int>(batch)));
  });
}

}  // namespace scalelab::ops::cuda
