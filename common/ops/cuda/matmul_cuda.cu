// Matmuls on a GPU, row-major products computed by column-major BLAS: a row-major (M, N) matrix
// is a column-major (N, M) one, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T.
//  - f32 and f64: cuBLAS sgemm/dgemm (strided batched). f32 stays full fp32 (TF32 off) unless
//    set_allow_tf32 (context.cu), so CUDA agrees with the host to 1e-4.
//  - bf16 (R2): cuBLASLt on tensor cores: bf16 A and B, fp32 accumulation (CUBLAS_COMPUTE_32F,
//    fp32 alpha/beta), output bf16 or f32 (weight gradients accumulate into fp32 buffers with
//    beta = 1). The algorithm is chosen once per shape by cuBLASLt's heuristic and cached.
#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <optional>
#include <mutex>
#include <tuple>

#include "common/ops/cuda/kernels.cuh"
#include "common/ops/fused_backend.hpp"

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

// ---- bf16 through cuBLASLt --------------------------------------------------------------------
constexpr size_t kWorkspaceBytes = 32u << 20;  // what cuBLASLt may use for split-K etc. (H100: 32 MiB)
constexpr int kMaxDevices = 64;

// One cuBLASLt handle and workspace per device, made on first use and kept for the process (like
// the cuBLAS handles). The workspace is a plain cudaMalloc: not tensor memory, not counted.
struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// What the heuristic's choice depends on: the problem and the operands' alignment.
using ShapeKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int, int, int>;

std::mutex g_lt_mutex;
LtDevice g_lt[kMaxDevices];
std::map<ShapeKey, std::optional<cublasLtMatmulAlgo_t>> g_algos;  // nullopt: none for that shape

LtDevice& lt_device(int device) {
  SCALELAB_CHECK(device < kMaxDevices, "device index {} too large", device);
  LtDevice& d = g_lt[device];
  if (!d.handle) {
    CUBLAS_CHECK(cublasLtCreate(&d.handle));
    CUDA_CHECK(cudaMalloc(&d.workspace, kWorkspaceBytes));
  }
  return d;
}

// The largest power of two (up to 16) dividing the address: cuBLASLt's kernels need aligned
// operands for vector loads, and an algorithm picked for 16-byte aligned tensors may not run on a
// view that starts 2 bytes further.
int alignment(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  int a = 16;
  while (a > 1 && u % a) a /= 2;
  return a;
}

// RAII owners of the cuBLASLt descriptors of one call.
struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t batch, int64_t stride) {
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, type, rows, cols, rows));  // column-major, ld = rows
    const int32_t count = static_cast<int32_t>(batch);
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof count));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof stride));
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(d); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  MatmulDesc(cublasOperation_t op_first, cublasOperation_t op_second) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
  }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(d); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
};

// What cuBLASLt applies to the product before storing it (fused_linear.hpp): nothing, + bias
// per output column, + bias then GELU with the pre-GELU values also stored in `aux`, or (DGELU)
// a multiplication by GELU' of the values read from `aux`.
struct Epilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;  // (M, N) row-major, ld N
};

// out = alpha op(a) op(b) + beta out, then the epilogue; a and b bf16, out bf16 or f32. Returns
// false (nothing done) when cuBLASLt has no algorithm for the problem.
bool lt_matmul(Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha,
               double beta, int64_t batch, int64_t M, int64_t N, int64_t K, const Epilogue& e = {}) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const cudaDataType_t out_type = out.dtype() == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  // Column-major view (see the top): the first operand is b, (N, K) after its op; the second is
  // a, (K, M) after its op; the result is (N, M) with ld N, and a bias of N entries is added to
  // each of its columns: one entry per column of the row-major out.
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  MatmulDesc desc(op_b, op_a);
  if (e.kind != CUBLASLT_EPILOGUE_DEFAULT) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &e.kind, sizeof e.kind));
    if (e.bias)
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof e.bias));
  }
  if (e.aux) {
    const int64_t ld = N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof e.aux));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }
  Layout lb(CUDA_R_16BF, tb ? K : N, tb ? N : K, batch, K * N);
  Layout la(CUDA_R_16BF, ta ? M : K, ta ? K : M, batch, M * K);
  Layout lc(out_type, N, M, batch, M * N);
  const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
  const int align = std::min({alignment(a.data_ptr()), alignment(b.data_ptr()), alignment(out.data_ptr())});

  std::lock_guard<std::mutex> lock(g_lt_mutex);
  LtDevice& lt = lt_device(device);
  const ShapeKey key{device, ta, tb, M, N, K, batch, static_cast<int>(out_type), align,
                     static_cast<int>(e.kind)};
  auto it = g_algos.find(key);
  if (it == g_algos.end()) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspaceBytes;
    const uint32_t al32 = static_cast<uint32_t>(align);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al32, sizeof al32));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt.handle, desc.d, lb.d, la.d, lc.d, lc.d,
                                                             pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) algo = result.algo;
    it = g_algos.emplace(key, algo).first;
  }
  if (!it->second) return false;
  // C and D are the same tensor (in place, beta accumulates).
  CUBLAS_CHECK(cublasLtMatmul(lt.handle, desc.d, &al, b.data_ptr(), lb.d, a.data_ptr(), la.d, &be,
                              out.data_ptr(), lc.d, out.data_ptr(), lc.d, &*it->second,
                              lt.workspace, kWorkspaceBytes, /*stream=*/0));
  return true;
}

void matmul_bf16(Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha,
                 double beta, int64_t batch, int64_t M, int64_t N, int64_t K) {
  // an empty sum: out = beta * out (beta 0: out never read, it may be uninitialised)
  if (K == 0) return beta == 0.0 ? fill(out, 0.0) : scale(out, beta);
  SCALELAB_CHECK(lt_matmul(out, a, b, ta, tb, alpha, beta, batch, M, N, K),
                 "cuBLASLt found no bf16 algorithm for batch {} M {} N {} K {}", batch, M, N, K);
}
}  // namespace

void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha,
            double beta, int64_t batch, int64_t M, int64_t N, int64_t K) {
  use_device(out);
  if (a.dtype() == DType::bf16) return matmul_bf16(out, a, b, ta, tb, alpha, beta, batch, M, N, K);
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

namespace scalelab::ops::cuda {

bool linear_epilogue(Tensor& out, Tensor* pre_gelu, const Tensor& in, const Tensor& weight,
                     const Tensor& bias) {
  use_device(out);
  const int64_t N = in.size(0), C = in.size(1), OC = weight.size(0);
  if (in.dtype() != DType::bf16 || C == 0) return false;
  // The epilogue reads bias and writes aux with vector accesses: aligned pointers, OC % 8 == 0.
  const bool aligned = alignment(bias.data_ptr()) == 16 &&
                       (!pre_gelu || (alignment(pre_gelu->data_ptr()) == 16 && OC % 8 == 0));
  if (!aligned) return false;
  Epilogue e;
  e.kind = pre_gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
  e.bias = bias.data_ptr();
  e.aux = pre_gelu ? pre_gelu->data_ptr() : nullptr;
  return lt_matmul(out, in, weight, false, true, 1.0, 0.0, 1, N, OC, C, e);
}

bool linear_dgelu_epilogue(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                           const Tensor& pre) {
  use_device(dpre);
  const int64_t N = dout.size(0), OC = dout.size(1), C = weight.size(1);
  if (dout.dtype() != DType::bf16 || OC == 0) return false;
  // the epilogue reads aux with vector accesses: aligned, C % 8 == 0 (as the GELU_AUX forward)
  if (alignment(pre.data_ptr()) != 16 || C % 8 != 0) return false;
  Epilogue e;
  e.kind = CUBLASLT_EPILOGUE_DGELU;  // D = (dout @ weight) * GELU'(aux), then the one rounding
  e.aux = const_cast<void*>(pre.data_ptr());  // read only
  return lt_matmul(dpre, dout, weight, false, false, 1.0, 0.0, 1, N, C, OC, e);
}

bool linear_bgrad_epilogue(Tensor& dweight, Tensor& dbias_sum, const Tensor& dout,
                           const Tensor& in) {
  use_device(dweight);
  const int64_t N = dout.size(0), OC = dout.size(1), C = in.size(1);
  if (dout.dtype() != DType::bf16 || N == 0 || dbias_sum.dtype() != dweight.dtype()) return false;
  if (alignment(dbias_sum.data_ptr()) != 16 || OC % 8 != 0) return false;  // vector stores
  // dweight (OC, C) = dout^T (OC, N) @ in (N, C). In the column-major view (see the top) that is
  // in^T (C, N) times dout (N, OC): dout is the second operand, reduced over the GEMM's k (the
  // N tokens) per column of the result: BGRADB, one sum per output row of dweight.
  Epilogue e;
  e.kind = CUBLASLT_EPILOGUE_BGRADB;
  e.bias = dbias_sum.data_ptr();  // written, not read: the epilogue's output
  return lt_matmul(dweight, dout, in, true, false, 1.0, 1.0, 1, OC, C, N, e);
}

}  // namespace scalelab::ops::cuda
