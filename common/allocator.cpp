#include "common/allocator.hpp"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "common/errors.hpp"

namespace scalelab {

namespace {
// Counters per device. A mutex, not atomics: peak must be updated together with current, and
// communication backends may allocate from a worker thread.
std::mutex g_mutex;
std::map<int, MemoryStats> g_stats;  // key: -1 the host, -2 the simulated GPU, else CUDA index

int key(Device d) { return d.is_cpu() ? -1 : d.is_sim() ? -2 : d.index; }
}  // namespace

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  if (is_sim()) return "sim";
  return fmt::format("cuda:{}", index);
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "sim") return sim();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    long i = std::strtol(text.c_str() + 5, &end, 10);
    if (end && *end == 0 && i >= 0 && text.size() > 5) return cuda(static_cast<int>(i));
  }
  throw UsageError(fmt::format("unknown device '{}' (expected cpu, cuda, cuda:N or sim)", text));
}

MemoryStats memory_stats(Device device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_stats[key(device)];
}

void reset_peak_memory(Device device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& s = g_stats[key(device)];
  s.peak = s.current;
}

void* device_alloc(std::size_t nbytes, Device device) {
  void* p = nullptr;
  if (nbytes > 0) {
    if (device.in_host_memory()) {
      // aligned_alloc wants a multiple of the alignment
      p = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
      SCALELAB_CHECK(p != nullptr, "out of host memory allocating {} bytes", nbytes);
    } else {
      p = detail::cuda_malloc(nbytes, device.index);
    }
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& s = g_stats[key(device)];
  s.current += nbytes;
  if (s.current > s.peak) s.peak = s.current;
  return p;
}

void device_free(void* ptr, std::size_t nbytes, Device device) {
  if (ptr) {
    if (device.in_host_memory()) std::free(ptr);
    else detail::cuda_free(ptr, device.index);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_stats[key(device)].current -= nbytes;
}

void device_copy(void* dst, Device dst_device, const void* src, Device src_device,
                 std::size_t nbytes) {
  if (nbytes == 0 || dst == src) return;
  if (dst_device.in_host_memory() && src_device.in_host_memory()) {
    std::memmove(dst, src, nbytes);
    return;
  }
  detail::cuda_copy(dst, dst_device, src, src_device, nbytes);
}

void device_zero(void* ptr, std::size_t nbytes, Device device) {
  device_fill_bytes(ptr, nbytes, 0, device);
}

void device_fill_bytes(void* ptr, std::size_t nbytes, unsigned char byte, Device device) {
  if (nbytes == 0) return;
  if (device.in_host_memory()) std::memset(ptr, byte, nbytes);
  else detail::cuda_fill_bytes(ptr, nbytes, byte, device.index);
}

void device_synchronize(Device device) {
  if (device.is_cuda()) detail::cuda_synchronize(device.index);
}

}  // namespace scalelab
