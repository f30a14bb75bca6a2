#pragma once
// Error checks for CUDA runtime and cuBLAS calls: a failure throws CheckFailed naming file:line.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/errors.hpp"

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    cudaError_t err_ = (call);                                                            \
    SCALELAB_CHECK(err_ == cudaSuccess, "{} failed: {}", #call, cudaGetErrorString(err_)); \
  } while (0)

#define CUBLAS_CHECK(call)                                                          \
  do {                                                                              \
    cublasStatus_t st_ = (call);                                                    \
    SCALELAB_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "{} failed: status {}", #call,     \
                   static_cast<int>(st_));                                          \
  } while (0)

// Launch errors surface at the next call; check right after each launch.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
