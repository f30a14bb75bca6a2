#pragma once
/// @file background_thread.hpp
/// The library's own background threads (a communicator's worker, the watchdog) say what they
/// are when they start, so that an observer can tell their work from the rank's: the test
/// binaries' counting malloc (tests/support/heap.hpp) leaves what such a thread allocates out of
/// the rank's heap, as it leaves out MPI's own threads. A program never needs to call these.

namespace scalelab {

/// Marks the calling thread, for the rest of its life, as one of the library's background
/// threads. Each calls it first, before it allocates anything.
void mark_background_thread() noexcept;

/// True on a thread that called mark_background_thread(). Allocates nothing (the counting
/// malloc asks it on every allocation).
bool is_background_thread() noexcept;

}  // namespace scalelab
