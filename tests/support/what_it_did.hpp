#pragma once
/// @file what_it_did.hpp
/// What a call did, as graders read it beside its numbers: its work (ops::work_stats, the
/// matmul FLOPs and LayerNorm rows of every op it ran) and whether it waited for every
/// communication operation it started (the execution log, common/exec_log.hpp: each submission
/// and the waits on it share a group and a sequence number). Header-only.
#include <algorithm>
#include <string>
#include <vector>

#include "common/exec_log.hpp"
#include "common/ops/work.hpp"

namespace scalelab::labtest {

/// The work `run` did on this thread's ops (ops::work_stats before and after).
template <class Run>
ops::WorkCount work_of(Run&& run) {
  const ops::WorkCount before = ops::work_stats();
  run();
  return ops::work_stats() - before;
}

/// The communication operations of an execution log: how many were started, and those never
/// waited for (a Work dropped, or kept and not waited).
struct Waits {
  int started = 0;
  std::vector<exec_log::Event> unwaited;
};

/// Waits of `log`'s operations of kind `op` ("all_reduce", "send", ...; "" for every kind).
inline Waits waits_in(const std::vector<exec_log::Event>& log, const std::string& op = "") {
  Waits w;
  for (const exec_log::Event& e : log) {
    if (e.group.empty() || e.what == "wait") continue;  // compute, and the waits themselves
    if (!op.empty() && e.what != op) continue;
    ++w.started;
    const bool waited = std::any_of(log.begin(), log.end(), [&](const exec_log::Event& x) {
      return x.what == "wait" && x.group == e.group && x.seq == e.seq;
    });
    if (!waited) w.unwaited.push_back(e);
  }
  return w;
}

/// The execution log of `run` (an exec_log::Recording around it).
template <class Run>
std::vector<exec_log::Event> log_of(Run&& run) {
  exec_log::Recording rec;
  run();
  return rec.events();
}

}  // namespace scalelab::labtest
