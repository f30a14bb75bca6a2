// The counting malloc of the test binaries (heap.hpp). Linked as an object into every test
// binary (tests/support/CMakeLists.txt), so these definitions replace glibc's for the whole
// process; each forwards to glibc's own implementation (__libc_malloc and friends) and counts
// the block's usable size, the same figure on allocation and on free.
//
// Per thread: a block counts when one of the rank's threads allocates it (rank_threads.hpp).
// The blocks the other threads allocate (MPI's progress threads, a communicator's worker, the
// watchdog) are remembered in a table of their own, so that a free, whichever thread makes it,
// takes back exactly what the allocation added: a block the rank allocated and a worker freed
// leaves the rank's figure; a block MPI allocated and the rank's thread freed never entered it.
#include "tests/support/heap.hpp"

#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tests/support/rank_threads.hpp"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {

std::atomic<int64_t> g_current{0}, g_peak{0}, g_allocations{0};

// The live blocks of the threads that are not the rank's: an open-addressing set of addresses
// (linear probing, tombstones), its slots from glibc's malloc directly, under one lock. Those
// threads hold few blocks (hundreds), so it stays small; the rank's frees look it up.
class OtherThreadsBlocks {
 public:
  void insert(void* p) {
    std::lock_guard lock(mutex_);
    if ((used_ + 1) * 2 > capacity_) grow();
    std::size_t i = slot_of(p);
    while (slots_[i] > kTombstone) i = (i + 1) & (capacity_ - 1);
    if (slots_[i] == kEmpty) ++used_;
    slots_[i] = reinterpret_cast<uintptr_t>(p);
    ++live_;
  }

  // True (and forgotten) when `p` is one of theirs.
  bool erase(void* p) {
    if (live_.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard lock(mutex_);
    if (capacity_ == 0) return false;
    for (std::size_t i = slot_of(p);; i = (i + 1) & (capacity_ - 1)) {
      if (slots_[i] == kEmpty) return false;
      if (slots_[i] == reinterpret_cast<uintptr_t>(p)) {
        slots_[i] = kTombstone;
        --live_;
        return true;
      }
    }
  }

  // fork(): the child gets one thread and must not inherit a held lock.
  void lock() { mutex_.lock(); }
  void unlock() { mutex_.unlock(); }

 private:
  static constexpr uintptr_t kEmpty = 0, kTombstone = 1;

  std::size_t slot_of(void* p) const {
    return static_cast<std::size_t>((reinterpret_cast<uintptr_t>(p) >> 4) *
                                    0x9E3779B97F4A7C15ull >> 20) & (capacity_ - 1);
  }

  void grow() {  // to four times the live blocks, tombstones dropped
    const std::size_t old_capacity = capacity_;
    uintptr_t* old = slots_;
    capacity_ = 1024;
    while (capacity_ < 4 * (live_ + 1)) capacity_ *= 2;
    slots_ = static_cast<uintptr_t*>(__libc_calloc(capacity_, sizeof(uintptr_t)));
    if (!slots_) std::abort();
    used_ = 0;
    for (std::size_t j = 0; j < old_capacity; ++j) {
      if (old[j] <= kTombstone) continue;
      std::size_t i = slot_of(reinterpret_cast<void*>(old[j]));
      while (slots_[i] != kEmpty) i = (i + 1) & (capacity_ - 1);
      slots_[i] = old[j];
      ++used_;
    }
    __libc_free(old);
  }

  std::mutex mutex_;
  uintptr_t* slots_ = nullptr;
  std::size_t capacity_ = 0, used_ = 0;
  std::atomic<std::size_t> live_{0};
};

OtherThreadsBlocks g_others;

__attribute__((constructor)) void keep_the_table_across_fork() {
  pthread_atfork([] { g_others.lock(); }, [] { g_others.unlock(); }, [] { g_others.unlock(); });
}

int64_t usable(void* p) { return static_cast<int64_t>(malloc_usable_size(p)); }

// A new block: the rank's (counted) or another thread's (remembered).
void allocated(void* p) {
  if (!p) return;
  if (!scalelab::labtest::on_rank_thread()) {
    g_others.insert(p);
    return;
  }
  const int64_t size = usable(p);
  const int64_t now = g_current.fetch_add(size, std::memory_order_relaxed) + size;
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// A block about to be freed (or moved by realloc), whichever thread frees it.
void released(void* p, int64_t size) {
  if (p && !g_others.erase(p)) g_current.fetch_sub(size, std::memory_order_relaxed);
}

}  // namespace

extern "C" {

void* malloc(size_t n) {
  void* p = __libc_malloc(n);
  allocated(p);
  return p;
}

void* calloc(size_t n, size_t size) {
  void* p = __libc_calloc(n, size);
  allocated(p);
  return p;
}

void* realloc(void* old, size_t n) {
  if (!old) return malloc(n);
  const int64_t before = usable(old);
  const bool theirs = g_others.erase(old);
  void* p = __libc_realloc(old, n);
  if (!p && n != 0) {  // failed: the old block is untouched
    if (theirs) g_others.insert(old);
    return p;
  }
  if (!theirs) g_current.fetch_sub(before, std::memory_order_relaxed);  // moved, grown or freed
  allocated(p);
  return p;
}

// glibc's reallocarray calls its realloc internally, around ours: forwarded here instead.
void* reallocarray(void* old, size_t n, size_t size) {
  size_t bytes = 0;
  if (__builtin_mul_overflow(n, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  return realloc(old, bytes);
}

void free(void* p) {
  if (p) released(p, usable(p));
  __libc_free(p);
}

void* memalign(size_t alignment, size_t n) {
  void* p = __libc_memalign(alignment, n);
  allocated(p);
  return p;
}

void* aligned_alloc(size_t alignment, size_t n) { return memalign(alignment, n); }

void* valloc(size_t n) { return memalign(static_cast<size_t>(sysconf(_SC_PAGESIZE)), n); }

void* pvalloc(size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return memalign(page, (n + page - 1) / page * page);
}

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
