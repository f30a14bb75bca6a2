// The execution log (exec_log.hpp): one list per process, guarded by a mutex, filled only while
// a Recording is alive.
#include "common/exec_log.hpp"

#include <atomic>
#include <mutex>

#include "common/errors.hpp"

namespace scalelab::exec_log {

namespace {
std::atomic<bool> g_on{false};
std::mutex g_mutex;
std::vector<Event> g_events;

void append(Event e) {
  std::lock_guard lock(g_mutex);
  if (g_on.load(std::memory_order_relaxed)) g_events.push_back(std::move(e));
}
}  // namespace

Recording::Recording() {
  std::lock_guard lock(g_mutex);
  SCALELAB_CHECK(!g_on.load(), "exec_log: a Recording is already alive");
  g_events.clear();
  g_on = true;
}

Recording::~Recording() {
  std::lock_guard lock(g_mutex);
  g_on = false;
  g_events.clear();
}

std::vector<Event> Recording::events() const {
  std::lock_guard lock(g_mutex);
  return g_events;
}

bool recording() { return g_on.load(std::memory_order_relaxed); }

void record_piece(const char* what, const void* object) {
  if (!recording()) return;
  Event e;
  e.what = what;
  e.object = object;
  append(std::move(e));
}

void record_comm(const char* what, const std::string& group, int peer, int tag,
                 std::int64_t bytes) {
  if (!recording()) return;
  Event e;
  e.what = what;
  e.group = group;
  e.peer = peer;
  e.tag = tag;
  e.bytes = bytes;
  append(std::move(e));
}

}  // namespace scalelab::exec_log
