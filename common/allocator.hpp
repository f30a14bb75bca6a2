#pragma once
// The one place scalelab allocates tensor memory. It counts the bytes in use and the peak per
// device, so every memory figure a lab prints is measured, not guessed. Allocations are plain
// malloc / cudaMalloc (no caching), so "current" is exactly the bytes held by live tensors.
#include <cstddef>
#include <string>

namespace scalelab {

enum class DeviceType { cpu, cuda };

/// Where a tensor lives: the host, or CUDA device `index`.
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  /// "cpu" or "cuda:0".
  std::string str() const;
  /// Parses "cpu", "cuda" (device 0) or "cuda:N"; throws UsageError otherwise.
  static Device parse(const std::string& text);
  bool operator==(const Device& o) const { return type == o.type && (is_cpu() || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

/// Bytes held by live tensors on a device now, and the most held since start or the last reset.
struct MemoryStats {
  std::size_t current = 0, peak = 0;
};

/// The allocator's counters for `device`.
MemoryStats memory_stats(Device device);

/// Sets the peak to the current figure (call before the phase you want to measure).
void reset_peak_memory(Device device);

/// Allocates `nbytes` on `device` (64-byte aligned on the host) and counts them.
void* device_alloc(std::size_t nbytes, Device device);

/// Frees memory from device_alloc and uncounts its `nbytes`.
void device_free(void* ptr, std::size_t nbytes, Device device);

/// Copies `nbytes` between any two devices (synchronous: the data is there on return).
void device_copy(void* dst, Device dst_device, const void* src, Device src_device,
                 std::size_t nbytes);

/// Sets `nbytes` at `ptr` to zero on `device`.
void device_zero(void* ptr, std::size_t nbytes, Device device);

/// Waits for the work queued on a CUDA device (no-op for the host).
void device_synchronize(Device device);

namespace detail {
// Backend of the CUDA half, in allocator_cuda.cu (or allocator_nocuda.cpp, which throws).
void* cuda_malloc(std::size_t nbytes, int index);
void cuda_free(void* ptr, int index);
void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device,
               std::size_t nbytes);
void cuda_synchronize(int index);
void cuda_zero(void* ptr, std::size_t nbytes, int index);
}  // namespace detail

}  // namespace scalelab
