#pragma once
/// @file allocator.hpp
/// The one place scalelab allocates tensor memory. It counts the bytes in use and the peak per
/// device, so every memory figure a lab prints is measured, not guessed.
///
/// The counters are exact: "current" is the sum of the sizes of the live tensors' allocations
/// (counted when device_alloc returns, uncounted when device_free is called, in the host
/// program's order), "peak" its maximum. They are not what the operating system or the driver
/// report, which is more:
///   - host: aligned_alloc / free; glibc keeps freed memory for reuse, and the process also holds
///     code, MPI's buffers and the like, so its RSS is larger than "current".
///   - CUDA: a stream-ordered memory pool per device (cudaMallocFromPoolAsync / cudaFreeAsync on
///     the compute stream, the legacy default stream where the kernels run; allocator_cuda.cu).
///     A free does not synchronise the device; the pool keeps what it reserved (release threshold
///     UINT64_MAX) for the next allocation, so nvidia-smi shows the pool's reservation (about the
///     peak plus fragmentation, plus the CUDA context, cuBLAS and NCCL), larger than "current".
///     Rule for other streams: a tensor used by work on another stream (the nccl backend's) must
///     stay alive (a Tensor handle held) until that work has completed on the GPU; the nccl
///     backend's operations hold their tensors until their completion event has fired.
#include <cstddef>
#include <string>

namespace scalelab {

/// The kind of memory a tensor lives in.
enum class DeviceType { cpu, cuda, sim };

/// Where a tensor lives: the host, CUDA device `index`, or the simulated GPU.
///
/// The simulated GPU (`--device sim`) is host memory that only the ops may read and write, as a
/// GPU's memory is to host code: the ops run their CPU kernels on it, `to()`/`copy_from()` copy
/// it, the communicators stage it through the host as they stage a CUDA tensor, and `data<T>()`
/// anywhere else throws. On a machine without a GPU it shows what `--device cuda` would: a loop
/// over a tensor's elements on the host (right numbers on the CPU, a crash on a GPU), or a tensor
/// left on the host beside the model's (an op refuses mixed devices).
struct Device {
  DeviceType type = DeviceType::cpu;  ///< host, GPU or simulated GPU
  int index = 0;                      ///< which GPU (0 on the host and the simulated one)

  /// The host.
  static Device cpu() { return {DeviceType::cpu, 0}; }
  /// CUDA device `i`.
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  /// The simulated GPU (host memory closed to host code outside the ops).
  static Device sim() { return {DeviceType::sim, 0}; }
  /// True for a GPU.
  bool is_cuda() const { return type == DeviceType::cuda; }
  /// True for the host.
  bool is_cpu() const { return type == DeviceType::cpu; }
  /// True for the simulated GPU.
  bool is_sim() const { return type == DeviceType::sim; }
  /// True when the bytes are in host memory (the host or the simulated GPU): what the allocator
  /// and the ops' CPU kernels need to know; whether host code may read them is is_cpu().
  bool in_host_memory() const { return type != DeviceType::cuda; }
  /// "cpu", "cuda:0" or "sim".
  std::string str() const;
  /// Parses "cpu", "cuda" (device 0), "cuda:N" or "sim"; throws UsageError otherwise.
  static Device parse(const std::string& text);
  /// The same memory: both the host, the same GPU, or both the simulated GPU.
  bool operator==(const Device& o) const {
    return type == o.type && (!is_cuda() || index == o.index);
  }
  /// Not the same memory.
  bool operator!=(const Device& o) const { return !(*this == o); }
};

/// Bytes held by live tensors on a device now, and the most held since start or the last reset.
struct MemoryStats {
  std::size_t current = 0;  ///< bytes held now
  std::size_t peak = 0;     ///< the most held since the start or reset_peak_memory
};

/// The allocator's counters for `device`.
MemoryStats memory_stats(Device device);

/// Sets the peak to the current figure (call before the phase you want to measure).
void reset_peak_memory(Device device);

/// Allocates `nbytes` on `device` (64-byte aligned on the host) and counts them. CUDA memory is
/// ready for work queued on the compute stream (or ordered after it) from the return on.
void* device_alloc(std::size_t nbytes, Device device);

/// Frees memory from device_alloc and uncounts its `nbytes`. On CUDA the free is stream-ordered:
/// it returns at once, and the memory is reused only after the work already queued on the
/// compute stream (which may still read it).
void device_free(void* ptr, std::size_t nbytes, Device device);

/// Copies `nbytes` between any two devices (synchronous: the data is there on return).
void device_copy(void* dst, Device dst_device, const void* src, Device src_device,
                 std::size_t nbytes);

/// Sets `nbytes` at `ptr` to zero on `device`.
void device_zero(void* ptr, std::size_t nbytes, Device device);

/// Sets every one of `nbytes` at `ptr` to `byte` on `device` (0xFF: NaN in every float dtype,
/// what Tensor::empty's poisoning writes).
void device_fill_bytes(void* ptr, std::size_t nbytes, unsigned char byte, Device device);

/// Waits for the work queued on a CUDA device (no-op for the host).
void device_synchronize(Device device);

namespace detail {
// Backend of the CUDA half, in allocator_cuda.cu (or allocator_nocuda.cpp, which throws).
void* cuda_malloc(std::size_t nbytes, int index);
void cuda_free(void* ptr, int index);
void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device,
               std::size_t nbytes);
void cuda_synchronize(int index);
void cuda_fill_bytes(void* ptr, std::size_t nbytes, unsigned char byte, int index);
}  // namespace detail

}  // namespace scalelab
