#pragma once
/// @file zero_observe.hpp
/// Issue 25, class 1 (labs 09 and 10): one step's traffic as an exact budget. Header-only.
/// A Budget is the payload bytes per (group, operation kind) that one step must submit, from the
/// library's byte counters (common/comm/stats.hpp): nothing else may be submitted, on the groups
/// the check covers, of any other kind. The counters do not record the reduction op (sum, avg,
/// max), so the op is not part of a budget.
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/comm/stats.hpp"

namespace scalelab::labtest {

using Budget = std::map<comm::CommKey, int64_t>;

/// `got` is exactly `budget` on `groups` (empty: every group): each (group, kind) of the budget
/// moved its bytes, and nothing else was submitted on those groups (a kind outside the budget
/// fails even at 0 bytes, e.g. a barrier).
inline testing::AssertionResult traffic_is(const comm::CommStats& got, const Budget& budget,
                                           const std::set<std::string>& groups = {}) {
  std::string problems;
  for (const auto& [key, bytes] : budget) {
    const auto it = got.find(key);
    const int64_t b = it == got.end() ? 0 : it->second.bytes;
    if (b != bytes)
      problems += fmt::format(" {} {}: {} bytes, the budget {};", key.group, key.op, b, bytes);
  }
  for (const auto& [key, count] : got)
    if ((groups.empty() || groups.count(key.group)) && !budget.count(key) && count.calls > 0)
      problems += fmt::format(" {} {}: {} calls, {} bytes, outside the budget;", key.group, key.op,
                              count.calls, count.bytes);
  if (problems.empty()) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "one step's traffic is not its budget:" << problems << "\n"
                                     << comm::format_comm_stats(got);
}

}  // namespace scalelab::labtest
