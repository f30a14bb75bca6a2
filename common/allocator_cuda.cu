// The CUDA half of the allocator: cudaMalloc/cudaFree without caching, so the counters are exact.
#include <cuda_runtime.h>

#include "common/allocator.hpp"
#include "common/errors.hpp"
#include "common/ops/cuda/cuda_check.cuh"

namespace scalelab::detail {

void* cuda_malloc(std::size_t nbytes, int index) {
  CUDA_CHECK(cudaSetDevice(index));
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, nbytes);
  SCALELAB_CHECK(err == cudaSuccess, "cudaMalloc of {} bytes on cuda:{} failed: {}", nbytes, index,
                 cudaGetErrorString(err));
  return p;
}

void cuda_free(void* ptr, int index) {
  CUDA_CHECK(cudaSetDevice(index));
  CUDA_CHECK(cudaFree(ptr));
}

void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device,
               std::size_t nbytes) {
  if (dst_device.is_cuda()) CUDA_CHECK(cudaSetDevice(dst_device.index));
  else CUDA_CHECK(cudaSetDevice(src_device.index));
  // cudaMemcpy with cudaMemcpyDefault (unified addressing) handles every direction and waits.
  CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
}

void cuda_zero(void* ptr, std::size_t nbytes, int index) {
  CUDA_CHECK(cudaSetDevice(index));
  CUDA_CHECK(cudaMemsetAsync(ptr, 0, nbytes));  // on the default stream, ordered with the kernels
}

void cuda_synchronize(int index) {
  CUDA_CHECK(cudaSetDevice(index));
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace scalelab::detail
