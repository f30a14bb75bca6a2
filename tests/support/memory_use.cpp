#include "tests/support/memory_use.hpp"

#include "common/allocator.hpp"
#include "common/runtime.hpp"

namespace scalelab::labtest {

MemoryUse memory_use_of(const std::function<void()>& fn) {
  const Device cpu = Device::cpu();
  reset_peak_memory(cpu);
  const auto start = static_cast<int64_t>(memory_stats(cpu).current);
  MemoryUse m;
  m.heap = heap_growth_of(fn);
  const MemoryStats after = memory_stats(cpu);
  m.tensor_peak = static_cast<int64_t>(after.peak) - start;
  m.tensor_held = static_cast<int64_t>(after.current) - start;
  return m;
}

testing::AssertionResult nothing_beside_tensors(const MemoryUse& m, int64_t bookkeeping,
                                                const std::string& what) {
  const auto beside = [&](const char* when, int64_t heap, int64_t tensors) {
    return testing::AssertionFailure()
           << what << " on rank " << world_rank() << ": the heap grew by " << heap << " bytes "
           << when << ", its tensors by " << tensors << ": " << heap - tensors
           << " bytes held outside the Tensor allocator, more than the " << bookkeeping
           << " allowed for the library's own records and scratch (a copy kept in a std::vector,"
           << " new[], a cache or a static would show here)";
  };
  if (m.heap.peak > m.tensor_peak + bookkeeping)
    return beside("at its peak", m.heap.peak, m.tensor_peak);
  if (m.heap.held > m.tensor_held + bookkeeping)
    return beside("and kept it", m.heap.held, m.tensor_held);
  return testing::AssertionSuccess();
}

}  // namespace scalelab::labtest
