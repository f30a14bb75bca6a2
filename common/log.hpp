#pragma once
/// @file log.hpp
/// Logging through fmt, the way every lab's program prints. info() prints once (rank 0),
/// every_rank() prints on each rank with its rank as prefix, error() goes to stderr on rank 0.
/// Each line is flushed at once, so the lines of several ranks interleave whole under mpirun.
///
///     log::info("step {} loss {:.4f}", step, loss);        // not collective: only rank 0 prints
#include <cstdio>

#include <fmt/format.h>

#include "common/runtime.hpp"

namespace scalelab::log {

/// Prints one line (format and arguments as fmt::format) to stdout on world rank 0; the other
/// ranks print nothing. Not collective: a rank may call it alone.
template <class... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  if (world_rank() != 0) return;
  fmt::print("{}\n", fmt::format(format, std::forward<Args>(args)...));
  std::fflush(stdout);
}

/// Prints one line, prefixed "[rank R] ", to stdout on every rank that calls it: for what differs
/// between ranks (lab 00's hello, a rank's shard).
template <class... Args>
void every_rank(fmt::format_string<Args...> format, Args&&... args) {
  fmt::print("[rank {}] {}\n", world_rank(), fmt::format(format, std::forward<Args>(args)...));
  std::fflush(stdout);
}

/// Prints one line to stderr on world rank 0 (the "error: ..." line of a usage error is printed
/// once, not once per rank).
template <class... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  if (world_rank() != 0) return;
  fmt::print(stderr, "{}\n", fmt::format(format, std::forward<Args>(args)...));
  std::fflush(stderr);
}

}  // namespace scalelab::log
