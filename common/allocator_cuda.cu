// The CUDA half of the allocator: a stream-ordered memory pool (cudaMallocFromPoolAsync /
// cudaFreeAsync), one pool per device, on the stream the tensor library's kernels run on.
//
// Why: cudaFree waits for the whole device, so freeing each temporary (every op's output that
// dies in backward) stalled the host behind the GPU, and lab 04's all-reduces could not overlap
// backward. A stream-ordered free returns at once; the memory is reused by a later allocation
// on the same stream, after the kernels queued before the free (the stream orders them).
//
// The stream: the legacy default stream (cudaStreamLegacy, "stream 0"). Every kernel of
// common/ops/cuda, cuBLAS (handles without a stream set), cudaMemcpy and cudaMemsetAsync(.., 0)
// run there, from any host thread. If the tensor library ever moves its kernels to another
// stream, allocations and frees must move with them.
//
// Other streams (the nccl backend's communication stream): a buffer must not be freed on the
// compute stream while work on another stream may still read or write it. The rule, which the
// nccl backend follows (common/comm/backend_nccl.cpp): an operation holds Tensor handles to its
// buffers (comm::detail::Op::in/out) until the backend's worker has seen the operation's "done"
// event fire (cudaEventQuery == cudaSuccess), i.e. until the GPU has finished it; only then can
// the last handle drop and the free be queued. Before launching, the communication stream waits
// for an event recorded on stream 0 at submission, so it also sees every allocation and write
// queued before. Code that uses tensor memory on a stream of its own must do the same: keep the
// Tensor alive until that stream's work is complete (or make stream 0 wait on an event of it).
//
// The pool keeps what it has reserved (release threshold UINT64_MAX): freed memory stays mapped
// for the next allocation instead of going back to the driver at each synchronisation. So
// nvidia-smi shows the pool's reservation, the high-water mark plus fragmentation, which is more
// than memory_stats(): those count the bytes of live tensors, exactly, as before.
//
// Devices without memory-pool support (cudaDevAttrMemoryPoolsSupported == 0) fall back to
// cudaMalloc / cudaFree, which synchronise.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "common/allocator.hpp"
#include "common/errors.hpp"
#include "common/ops/cuda/cuda_check.cuh"

namespace scalelab::detail {

namespace {
// The stream tensor memory is ordered on: where the tensor library's kernels run (see above).
const cudaStream_t kComputeStream = cudaStreamLegacy;

constexpr int kMaxDevices = 64;

struct DevicePool {
  bool ready = false;
  cudaMemPool_t pool = nullptr;  // null: no pool support, plain cudaMalloc / cudaFree
};

std::mutex g_pool_mutex;
DevicePool g_pools[kMaxDevices];

// The pool of device `index` (the current device), created on first use. Never destroyed: it
// lives as long as the CUDA context (tensors freed at exit still return memory to it).
const DevicePool& device_pool(int index) {
  SCALELAB_CHECK(index >= 0 && index < kMaxDevices, "device index {} out of range", index);
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  DevicePool& d = g_pools[index];
  if (d.ready) return d;
  int supported = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, index));
  if (supported) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;  // not shared between processes
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = index;
    CUDA_CHECK(cudaMemPoolCreate(&d.pool, &props));
    // Keep freed memory in the pool (the default threshold, 0, returns it to the driver at every
    // synchronisation, and the next allocation maps it again).
    std::uint64_t threshold = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(d.pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  d.ready = true;
  return d;
}

bool is_shutdown_error(cudaError_t e) {
  return e == cudaErrorCudartUnloading || e == cudaErrorContextIsDestroyed;
}
}  // namespace

void* cuda_malloc(std::size_t nbytes, int index) {
  CUDA_CHECK(cudaSetDevice(index));
  const DevicePool& d = device_pool(index);
  void* p = nullptr;
  if (!d.pool) {
    cudaError_t err = cudaMalloc(&p, nbytes);
    SCALELAB_CHECK(err == cudaSuccess, "cudaMalloc of {} bytes on cuda:{} failed: {}", nbytes,
                   index, cudaGetErrorString(err));
    return p;
  }
  cudaError_t err = cudaMallocFromPoolAsync(&p, nbytes, d.pool, kComputeStream);
  if (err == cudaErrorMemoryAllocation) {
    // Out of memory: let the queued frees complete, give the pool's unused (possibly fragmented)
    // memory back to the driver, and try once more.
    (void)cudaGetLastError();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemPoolTrimTo(d.pool, 0));
    err = cudaMallocFromPoolAsync(&p, nbytes, d.pool, kComputeStream);
  }
  SCALELAB_CHECK(err == cudaSuccess, "cudaMallocFromPoolAsync of {} bytes on cuda:{} failed: {}",
                 nbytes, index, cudaGetErrorString(err));
  return p;
}

void cuda_free(void* ptr, int index) {
  cudaError_t err = cudaSetDevice(index);
  if (is_shutdown_error(err)) return;  // a static tensor freed after the CUDA runtime
  CUDA_CHECK(err);
  const DevicePool& d = device_pool(index);
  // Stream-ordered: returns at once; the memory is reused only after the work queued on the
  // compute stream before this call.
  err = d.pool ? cudaFreeAsync(ptr, kComputeStream) : cudaFree(ptr);
  if (is_shutdown_error(err)) return;
  CUDA_CHECK(err);
}

void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device,
               std::size_t nbytes) {
  if (dst_device.is_cuda()) CUDA_CHECK(cudaSetDevice(dst_device.index));
  else CUDA_CHECK(cudaSetDevice(src_device.index));
  // cudaMemcpy with cudaMemcpyDefault (unified addressing) handles every direction and waits.
  // It runs on the legacy default stream, so it is ordered with the pool's allocations and frees.
  CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
}

void cuda_fill_bytes(void* ptr, std::size_t nbytes, unsigned char byte, int index) {
  CUDA_CHECK(cudaSetDevice(index));
  // on the compute stream, ordered with the kernels and with the allocation of `ptr`
  CUDA_CHECK(cudaMemsetAsync(ptr, byte, nbytes, kComputeStream));
}

void cuda_synchronize(int index) {
  CUDA_CHECK(cudaSetDevice(index));
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace scalelab::detail
