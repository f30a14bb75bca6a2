#pragma once
// Logging through fmt. info() prints once (rank 0), every_rank() prints on each rank with its
// rank as prefix, error() goes to stderr on rank 0.
#include <cstdio>

#include <fmt/format.h>

#include "common/runtime.hpp"

namespace scalelab::log {

template <class... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  if (world_rank() != 0) return;
  fmt::print("{}\n", fmt::format(format, std::forward<Args>(args)...));
  std::fflush(stdout);
}

template <class... Args>
void every_rank(fmt::format_string<Args...> format, Args&&... args) {
  fmt::print("[rank {}] {}\n", world_rank(), fmt::format(format, std::forward<Args>(args)...));
  std::fflush(stdout);
}

template <class... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  if (world_rank() != 0) return;
  fmt::print(stderr, "{}\n", fmt::format(format, std::forward<Args>(args)...));
  std::fflush(stderr);
}

}  // namespace scalelab::log
