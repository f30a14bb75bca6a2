#pragma once
/// @file rank_threads.hpp
/// Which threads' work is the rank's own, for the instruments that attribute by thread: the
/// counting malloc (heap.hpp) and the raw-MPI counter (raw_mpi.hpp). A rank's threads are
///  - the main thread, which runs the tests and so the attendee's code;
///  - every thread one of them starts once the tests begin (count_threads_started_from_now(),
///    called by the test main): a copy hidden in a thread the attendee's code starts is counted,
///    and so is everything that thread starts in turn.
/// Not the rank's: the threads started before the tests (MPI's progress threads, OpenBLAS's pool,
/// the watchdog), the library's background threads (a communicator's worker, which makes every
/// MPI call of the communicator: common/background_thread.hpp), threads started inside an MPI
/// call, and whatever any of those start. Every thread starts through pthread_create, which the
/// test binaries interpose (rank_threads.cpp) to give the new thread its creator's standing.

namespace scalelab::labtest {

/// True when the calling thread's allocations and MPI calls are the rank's own. Allocates
/// nothing: the counting malloc asks it on every allocation.
bool on_rank_thread() noexcept;

/// From now on a thread started by one of the rank's threads is one of the rank's threads too.
/// The test main calls it once MPI and the watchdog are up.
void count_threads_started_from_now() noexcept;

/// While one lives on a thread, the threads that thread starts are not the rank's (an MPI call
/// that starts a progress thread lazily). The raw-MPI counter opens one around every call.
class NotTheRanksThreads {
 public:
  NotTheRanksThreads() noexcept;
  ~NotTheRanksThreads();
  NotTheRanksThreads(const NotTheRanksThreads&) = delete;
  NotTheRanksThreads& operator=(const NotTheRanksThreads&) = delete;
};

}  // namespace scalelab::labtest
