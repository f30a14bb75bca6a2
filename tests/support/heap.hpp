#pragma once
/// @file heap.hpp
/// Every byte this process holds on its heap, not only Tensors: the test binaries link a counting
/// malloc (tests/support/heap_hook.cpp: malloc, calloc, realloc, aligned_alloc, posix_memalign,
/// memalign and free, so operator new / new[], std::vector, a static container, a Tensor's host
/// memory and malloc itself), measured with malloc_usable_size. A grader bounds what a call holds
/// at its worst however it holds it:
///
///   const labtest::HeapGrowth grew = labtest::heap_growth_of([&] { ce(logits, targets, lo, tp); });
///   EXPECT_LT(grew.peak, N * V * 8) << "the full (N, V) logits were held";
///
/// Whose: the rank's threads only (rank_threads.hpp): the main thread, which runs the tests and
/// the attendee's code, and every thread those start during the tests (a copy kept by a thread
/// the attendee starts counts). MPI's progress threads, a communicator's worker and the watchdog
/// do not: what they allocate meanwhile would make a bound depend on the machine's load. A free
/// takes back what its allocation added, whichever thread frees: a block the rank allocated and
/// a worker frees leaves the figure; a block MPI's thread allocated never enters it, wherever
/// it is freed. So the figure is the rank's own, the same run after run.
///
/// What it cannot see: memory that is not from the heap (the stack, mmap called directly; a
/// fixed-size static array is bounded apart, from the object's symbols) and other processes.
#include <cstddef>
#include <cstdint>
#include <functional>

namespace scalelab::labtest {

struct HeapStats {
  int64_t current = 0;  ///< bytes held now (usable sizes of live blocks; relative to start-up)
  int64_t peak = 0;     ///< the most held since start-up or reset_heap_peak()
  int64_t allocations = 0;  ///< blocks allocated since start-up
};

HeapStats heap_stats();
/// Sets the peak to the current figure.
void reset_heap_peak();
/// What a call did to the heap: the most bytes held at once during it above what was held when
/// it started, and what it still holds on return (negative: it freed more than it kept).
struct HeapGrowth {
  int64_t peak = 0;
  int64_t held = 0;
};
/// Runs `fn` and measures it.
HeapGrowth heap_growth_of(const std::function<void()>& fn);

}  // namespace scalelab::labtest
