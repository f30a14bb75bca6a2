// Exits 0 when this build sees a CUDA device, 77 otherwise (what tests/common/gpu_program.sh
// reads to skip a program's GPU test).
#include <cstdio>

#include "common/device.hpp"

int main() {
  const int n = scalelab::cuda_device_count();
  std::printf("%d CUDA device(s)\n", n);
  return n > 0 ? 0 : 77;
}
