// Built when scalelab is configured with CUDA. A machine without a driver or a GPU (a CI runner)
// reports zero devices instead of failing, so CPU runs work from a CUDA build too.
#include <cuda_runtime.h>

#include "common/device.hpp"

namespace scalelab {
bool cuda_compiled() { return true; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver"/"no device" error
    return 0;
  }
  return count;
}

std::string cuda_device_name(int device) {
  cudaDeviceProp prop{};
  if (device < 0 || device >= cuda_device_count()) return "";
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

std::string cuda_device_uuid(int device) {
  cudaDeviceProp prop{};
  if (device < 0 || device >= cuda_device_count()) return "";
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  // 16 bytes, printed in nvidia-smi's groups: GPU-8-4-4-4-12 hex digits
  std::string out = "GPU-";
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    const auto b = static_cast<unsigned char>(prop.uuid.bytes[i]);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

int cuda_compute_capability(int device) {
  // two attributes, not cudaGetDeviceProperties (which fills every field: slow enough to matter
  // when a kernel launch asks)
  int major = 0, minor = 0;
  if (device < 0 || device >= cuda_device_count()) return 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return 0;
  return 10 * major + minor;
}
}  // namespace scalelab
