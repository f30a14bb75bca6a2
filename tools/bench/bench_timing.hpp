#pragma once
// What the GPU benches share: timing a call the same way (scalelab_bench_attention,
// scalelab_bench_kernels).
#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "common/device.hpp"
#include "common/metrics.hpp"

namespace scalelab::bench {

/// Best and median ms of `repeats` timed calls of f after `warmup` untimed ones; each call is
/// timed on `device`'s queue (metrics::Timer waits for the GPU).
inline std::pair<double, double> time_ms(Device device, int warmup, int repeats,
                                         const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    metrics::Timer t(device);
    f();
    ms.push_back(t.elapsed() * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  return {ms.front(), ms[ms.size() / 2]};
}

}  // namespace scalelab::bench
