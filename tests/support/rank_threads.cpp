// Which threads are the rank's (rank_threads.hpp): a thread-local standing, given to each new
// thread by the pthread_create of the test binaries, which wraps glibc's. Defined in the
// executable, it replaces glibc's for every caller (libstdc++'s std::thread, Open MPI and its
// plug-ins, OpenBLAS), as the counting malloc replaces malloc.
#include "tests/support/rank_threads.hpp"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "common/background_thread.hpp"

extern "C" {
void* __libc_malloc(size_t);
void __libc_free(void*);
}

namespace scalelab::labtest {
namespace {

enum Standing : signed char { kUnknown = 0, kRanks = 1, kOthers = 2 };

// initial-exec: read at a fixed offset from the thread pointer, never through __tls_get_addr
// (which may allocate): these are read inside malloc.
__attribute__((tls_model("initial-exec"))) thread_local signed char t_standing = kUnknown;
__attribute__((tls_model("initial-exec"))) thread_local int t_not_the_ranks = 0;
std::atomic<bool> g_counting_new_threads{false};

// A thread no pthread_create of ours started: the main thread (the one whose id is the
// process's), or one started by a raw clone (not the rank's).
signed char standing() noexcept {
  if (t_standing == kUnknown)
    t_standing = syscall(SYS_gettid) == getpid() ? kRanks : kOthers;
  return t_standing;
}

struct Start {
  void* (*routine)(void*);
  void* arg;
  signed char standing;
};

void* start_with_standing(void* p) {
  const Start s = *static_cast<Start*>(p);
  __libc_free(p);  // ours, not counted (see below)
  t_standing = s.standing;
  return s.routine(s.arg);
}

}  // namespace

bool on_rank_thread() noexcept { return standing() == kRanks && !is_background_thread(); }

void count_threads_started_from_now() noexcept { g_counting_new_threads.store(true); }

NotTheRanksThreads::NotTheRanksThreads() noexcept { ++t_not_the_ranks; }
NotTheRanksThreads::~NotTheRanksThreads() { --t_not_the_ranks; }

}  // namespace scalelab::labtest

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                              void* (*routine)(void*), void* arg) {
  using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const Create glibc = reinterpret_cast<Create>(dlsym(RTLD_NEXT, "pthread_create"));
  using namespace scalelab::labtest;
  const bool ranks = g_counting_new_threads.load() && on_rank_thread() && t_not_the_ranks == 0;
  // The trampoline's record comes from glibc's malloc directly: bookkeeping of the hook, never
  // a block of the rank's (it is freed on the new thread before the routine runs).
  auto* s = static_cast<Start*>(__libc_malloc(sizeof(Start)));
  if (!s) return EAGAIN;
  *s = Start{routine, arg, ranks ? kRanks : kOthers};
  const int rc = glibc(thread, attr, &start_with_standing, s);
  if (rc != 0) __libc_free(s);
  return rc;
}
