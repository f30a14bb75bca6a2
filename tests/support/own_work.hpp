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

#include <fstream>
#include <string>
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
/// argument list, e.g. "scalelab::nn::shard_range("); a failure naming each one it calls, or
/// saying that the list is missing (never a pass on nothing). Same on every rank.
inline testing::AssertionResult calls_none_of(const std::vector<std::string>& forbidden,
                                              const std::string& why) {
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
    return testing::AssertionFailure() << "the attendee's file calls the library's reference, "
                                       << why << ":" << calls;
  return testing::AssertionSuccess();
}

}  // namespace scalelab::labtest
