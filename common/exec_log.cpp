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
std::atomic<std::int64_t> g_batches{0};
thread_local std::int64_t t_batch = 0;  // the batch this thread is submitting (0: none)

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

BatchScope::BatchScope() { t_batch = g_batches.fetch_add(1, std::memory_order_relaxed) + 1; }
BatchScope::~BatchScope() { t_batch = 0; }

bool recording() { return g_on.load(std::memory_order_relaxed); }

void record_piece(const char* what, const void* object) {
  if (!recording()) return;
  Event e;
  e.what = what;
  e.object = object;
  append(std::move(e));
}

void record_comm(const char* what, const std::string& group, int peer, int tag,
                 std::int64_t bytes, std::int64_t seq, const char* transport) {
  if (!recording()) return;
  Event e;
  e.what = what;
  e.transport = transport;
  e.group = group;
  e.peer = peer;
  e.tag = tag;
  e.bytes = bytes;
  e.seq = seq;
  e.batch = t_batch;
  append(std::move(e));
}

void record_wait(const char* op, const std::string& group, int peer, int tag, std::int64_t seq,
                 const char* transport) {
  if (!recording()) return;
  Event e;
  e.what = "wait";
  e.transport = transport;
  e.op = op;
  e.group = group;
  e.peer = peer;
  e.tag = tag;
  e.seq = seq;
  append(std::move(e));
}

namespace {
std::atomic<bool> g_hooked{false};
std::function<void()> g_hook;  // set while no compute runs (between steps), read by the caller
}  // namespace

void record_compute(const char* what) {
  if (g_hooked.load(std::memory_order_acquire) && g_hook) g_hook();
  record_piece(what, nullptr);
}

void set_compute_hook(std::function<void()> hook) {
  g_hooked = false;
  g_hook = std::move(hook);
  g_hooked = static_cast<bool>(g_hook);
}

}  // namespace scalelab::exec_log
