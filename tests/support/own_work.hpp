#pragma once
/// @file own_work.hpp
/// Issue 25, class 7 ("own work, not the reference"): which of the library's reference functions
/// the attendee's file calls. cmake/ScalelabOwnWork.cmake writes, before this test binary links,
/// `<this binary>.undefined.txt` next to it: `nm -C --undefined-only` of the object compiled from
/// the attendee's file, i.e. every function that file calls and does not define. A step whose
/// README says "write your own" checks that none of its forbidden references is in that list;
/// the check reads the object, not what the code prints, so a solution that forwards to the
/// reference (directly, through a lambda or a function pointer) is flagged whatever it returns.
/// Header-only (nothing of tests/support's libraries changes).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace scalelab::labtest {

/// The list's path: this executable's path + ".undefined.txt".
inline std::string undefined_symbols_path() {
  std::string exe(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  exe.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return exe + ".undefined.txt";
}

/// Success when the attendee's object calls none of `forbidden` (demangled names up to their
/// argument list, e.g. "scalelab::nn::shard_range("); a failure naming each one it calls ("the
/// attendee's file calls <what>, <why>:"), or saying that the list is missing (never a pass on
/// nothing). Same on every rank.
inline testing::AssertionResult calls_none_of(const std::vector<std::string>& forbidden,
                                              const std::string& why,
                                              const std::string& what = "the library's reference") {
  const std::string path = undefined_symbols_path();
  std::ifstream in(path);
  if (!in) return testing::AssertionFailure() << "no list of the attendee's calls at " << path;
  std::string line, calls;
  bool object_seen = false;
  while (std::getline(in, line)) {
    if (line.rfind("error:", 0) == 0) return testing::AssertionFailure() << path << ": " << line;
    if (line.rfind("object:", 0) == 0) object_seen = true;
    for (const std::string& f : forbidden)
      if (line.find(f) != std::string::npos) calls += "\n  " + line.substr(line.find(f));
  }
  if (!object_seen) return testing::AssertionFailure() << path << " names no object";
  if (!calls.empty())
    return testing::AssertionFailure() << "the attendee's file calls " << what << ", " << why
                                       << ":" << calls;
  return testing::AssertionSuccess();
}

/// Success when the attendee's file opens no SimKernelScope (tensor.hpp): the ops' own key to the
/// simulated GPU's memory, which would let a host loop through data<T>() pass a grader's run on
/// Device::sim that a GPU would fail.
inline testing::AssertionResult opens_no_sim_kernel_scope() {
  return calls_none_of({"scalelab::SimKernelScope::SimKernelScope("},
                       "which only the ops may: on a GPU no call opens its memory to host code",
                       "SimKernelScope (the ops' key to the simulated GPU's memory)");
}

/// What the attendee's file may hold in static storage: counters and small tables, never a
/// buffer a step's data would fit in (the references hold none).
inline constexpr int64_t kStaticStorageBytes = 4096;

/// The attendee's static storage, from `<this binary>.static.txt` (cmake/ScalelabOwnWork.cmake:
/// the .bss and .data symbols of the object compiled from the attendee's file, with their
/// sizes): at most `bytes` in all, else a failure naming the largest ones (a static array of
/// logits, a function-local static buffer), or saying that the list is missing. The heap and
/// the allocator see no static array; this does. Same on every rank.
inline testing::AssertionResult static_storage_at_most(int64_t bytes, const std::string& what) {
  const std::string undefined = undefined_symbols_path();
  const std::string path = undefined.substr(0, undefined.size() - 14) + ".static.txt";
  std::ifstream in(path);
  if (!in) return testing::AssertionFailure() << "no list of the attendee's statics at " << path;
  std::string line;
  bool object_seen = false;
  int64_t total = 0;
  std::vector<std::pair<int64_t, std::string>> symbols;
  while (std::getline(in, line)) {
    if (line.rfind("error:", 0) == 0) return testing::AssertionFailure() << path << ": " << line;
    if (line.rfind("object:", 0) == 0) {
      object_seen = true;
      continue;
    }
    std::istringstream fields(line);
    std::string address, size, type, name;
    if (!(fields >> address >> size >> type) || !std::getline(fields >> std::ws, name)) continue;
    const int64_t n = std::stoll(size, nullptr, 16);
    total += n;
    symbols.emplace_back(n, name);
  }
  if (!object_seen) return testing::AssertionFailure() << path << " names no object";
  if (total <= bytes) return testing::AssertionSuccess();
  std::sort(symbols.rbegin(), symbols.rend());
  testing::AssertionResult failed = testing::AssertionFailure();
  failed << what << ": the attendee's file holds " << total << " bytes of static storage, more "
         << "than " << bytes << " (what a step holds belongs in tensors, not static arrays):";
  for (std::size_t k = 0; k < std::min<std::size_t>(3, symbols.size()); ++k)
    failed << "\n  " << symbols[k].second << ": " << symbols[k].first << " bytes";
  return failed;
}

}  // namespace scalelab::labtest
