// The counting malloc of the test binaries (heap.hpp). Linked as an object into every test
// binary (tests/support/CMakeLists.txt), so these definitions replace glibc's for the whole
// process; each forwards to glibc's own implementation (__libc_malloc and friends) and counts
// the block's usable size, the same figure on allocation and on free.
#include "tests/support/heap.hpp"

#include <malloc.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {

std::atomic<int64_t> g_current{0}, g_peak{0}, g_allocations{0};

void counted(void* p) {
  if (!p) return;
  const int64_t now = g_current.fetch_add(static_cast<int64_t>(malloc_usable_size(p)),
                                          std::memory_order_relaxed) +
                      static_cast<int64_t>(malloc_usable_size(p));
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void uncounted(void* p) {
  if (p) g_current.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
}

}  // namespace

extern "C" {

void* malloc(size_t n) {
  void* p = __libc_malloc(n);
  counted(p);
  return p;
}

void* calloc(size_t n, size_t size) {
  void* p = __libc_calloc(n, size);
  counted(p);
  return p;
}

void* realloc(void* old, size_t n) {
  const int64_t before = old ? static_cast<int64_t>(malloc_usable_size(old)) : 0;
  void* p = __libc_realloc(old, n);
  if (p || n == 0) {  // moved, grown or freed: the old block is gone
    g_current.fetch_sub(before, std::memory_order_relaxed);
    counted(p);
  }
  return p;
}

void free(void* p) {
  uncounted(p);
  __libc_free(p);
}

void* memalign(size_t alignment, size_t n) {
  void* p = __libc_memalign(alignment, n);
  counted(p);
  return p;
}

void* aligned_alloc(size_t alignment, size_t n) { return memalign(alignment, n); }

int posix_memalign(void** out, size_t alignment, size_t n) {
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* p = memalign(alignment, n);
  if (!p && n != 0) return ENOMEM;
  *out = p;
  return 0;
}

}  // extern "C"

namespace scalelab::labtest {

HeapStats heap_stats() {
  return HeapStats{g_current.load(), g_peak.load(), g_allocations.load()};
}

void reset_heap_peak() { g_peak.store(g_current.load()); }

HeapGrowth heap_growth_of(const std::function<void()>& fn) {
  reset_heap_peak();
  const int64_t start = g_current.load();
  fn();
  return HeapGrowth{g_peak.load() - start, g_current.load() - start};
}

}  // namespace scalelab::labtest
