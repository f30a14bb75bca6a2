#pragma once
/// @file memory_use.hpp
/// A step's memory, by both counters at once: the Tensor allocator's (common/allocator.hpp) and
/// the rank's whole heap (heap.hpp: std::vector, new[], a heap cache, a function-local static's
/// buffer, and the Tensors' host memory too). A step's bound is asserted on the tensors; the heap
/// may hold more than the tensors only by bookkeeping (the library's records, the allocator's
/// rounding), so a copy kept outside the allocator fails the same check as one kept in a Tensor:
///
///   const labtest::MemoryUse m = labtest::memory_use_of([&] { ring_attention_forward(...); });
///   EXPECT_LE(m.tensor_peak, bound);
///   EXPECT_TRUE(labtest::nothing_beside_tensors(m, kBookkeeping, "ring forward"));
///
/// Memory on a device is the allocator's alone (the heap sees host memory only).
#include <cstdint>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/heap.hpp"

namespace scalelab::labtest {

/// What a call held above what was alive when it started: at its worst and on return.
struct MemoryUse {
  int64_t tensor_peak = 0, tensor_held = 0;  ///< the CPU Tensor allocator's bytes
  HeapGrowth heap;                           ///< the rank's heap (the Tensors' host memory too)
};

/// Runs `fn` and measures it with both counters (not nestable: each resets the peaks).
MemoryUse memory_use_of(const std::function<void()>& fn);

/// The heap held no more than the tensors and `bookkeeping` bytes, at the peak and on return:
/// else what was held outside the allocator, named with `what` and this rank. Not collective.
testing::AssertionResult nothing_beside_tensors(const MemoryUse& m, int64_t bookkeeping,
                                                const std::string& what);

}  // namespace scalelab::labtest
