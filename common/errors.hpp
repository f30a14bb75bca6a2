#pragma once
/// @file errors.hpp
/// The three kinds of error a scalelab program can raise, and the exit code each one ends with:
/// 0 ok, 1 check failed, 2 bad input or usage, 3 watchdog timeout.
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace scalelab {

/// Every program's exit codes: 0 ok, 1 a check failed, 2 bad input or usage, 3 a hang (the
/// watchdog).
enum ExitCode : int { kExitOk = 0, kExitFailed = 1, kExitUsage = 2, kExitHang = 3 };

/// Bad input or usage: one clear line on rank 0, exit code 2 on every rank.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// An internal check failed (a bug, or a wrong answer): exit code 1. The message names file:line.
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Thrown by a starter where the attendee has not written a step yet. The message names the lab,
/// the step and the README anchor, e.g. "lab 03 step 2: average the gradients (README.md#step-2)".
struct NotImplemented : std::logic_error {
  using std::logic_error::logic_error;
};

}  // namespace scalelab

/// SCALELAB_CHECK(cond, "fmt", args...): throws CheckFailed naming file and line (llm.c style).
#define SCALELAB_CHECK(cond, ...)                                                             \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw ::scalelab::CheckFailed(fmt::format("{}:{}: check failed: {}: {}", __FILE__,    \
                                                __LINE__, #cond, fmt::format(__VA_ARGS__))); \
  } while (0)

/// SCALELAB_REQUIRE(cond, "fmt", args...): validates user input; throws UsageError (exit 2).
#define SCALELAB_REQUIRE(cond, ...)                                        \
  do {                                                                     \
    if (!(cond)) throw ::scalelab::UsageError(fmt::format(__VA_ARGS__)); \
  } while (0)
