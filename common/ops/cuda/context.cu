// cuBLAS handles, one per device, with the math mode set explicitly: fp32 matmuls stay fp32
// (CUBLAS_DEFAULT_MATH, TF32 not allowed) unless set_allow_tf32(true), so CUDA results agree with
// the host's to 1e-4 relative.
#include <mutex>

#include "common/ops/cuda/kernels.cuh"

namespace scalelab::ops::cuda {

namespace {
constexpr int kMaxDevices = 64;
cublasHandle_t g_handles[kMaxDevices] = {};
bool g_tf32 = false;
std::mutex g_mutex;

void apply_math_mode(cublasHandle_t h) {
  CUBLAS_CHECK(cublasSetMathMode(h, g_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}
}  // namespace

cublasHandle_t cublas_handle() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  SCALELAB_CHECK(device < kMaxDevices, "device index {} too large", device);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_handles[device]) {
    CUBLAS_CHECK(cublasCreate(&g_handles[device]));
    apply_math_mode(g_handles[device]);
  }
  return g_handles[device];
}

void set_allow_tf32(bool allow) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_tf32 = allow;
  for (cublasHandle_t h : g_handles)
    if (h) apply_math_mode(h);
}

}  // namespace scalelab::ops::cuda
