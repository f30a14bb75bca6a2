// Built when scalelab is configured without CUDA: no GPUs, ever.
#include "common/device.hpp"

namespace scalelab {
bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_device_name(int) { return ""; }
std::string cuda_device_uuid(int) { return ""; }
int cuda_compute_capability(int) { return 0; }
}  // namespace scalelab
