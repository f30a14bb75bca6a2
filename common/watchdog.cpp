#include "common/watchdog.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/runtime.hpp"

namespace scalelab::watchdog {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Seconds on CLOCK_MONOTONIC: the same clock in every process of a node, so a rank can tell how
// long a peer has waited from the start time in the peer's status file.
double mono_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

struct Entry {
  int group;
  std::string kind, detail;
  std::int64_t seq;
  std::size_t bytes;
  bool collective;
  double start_s;
};

struct Group {
  std::string name;
  std::vector<int> ranks;
  std::int64_t last_seq = 0;
  std::string last_kind = "-";
};

// Never destroyed: the watchdog thread may still run while static destructors do.
struct State {
  std::mutex mutex;
  std::map<std::uint64_t, Entry> inflight;  // token order == entry order
  std::vector<Group> groups;
  std::uint64_t next_token = 1;
  std::uint64_t version = 1;
  double timeout_s = kDefaultTimeout;
  bool started = false;
  std::atomic<bool> stopping{false};
  std::string dir;
};

State& state() {
  static State* s = new State;
  return *s;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// The job's key, the same on every rank of one job (see watchdog.hpp).
std::string job_key() {
  if (const char* v = std::getenv("SCALELAB_JOB_ID"); v && *v) return v;
  if (const char* v = std::getenv("PMIX_NAMESPACE"); v && *v) return v;
  if (const char* v = std::getenv("SLURM_JOB_ID"); v && *v)
    return fmt::format("slurm{}.{}", v, env_or("SLURM_STEP_ID", "0"));
  if (world_size() > 1) return fmt::format("ppid{}", static_cast<long>(getppid()));
  return fmt::format("pid{}", static_cast<long>(getpid()));
}

std::string sanitize(std::string s) {
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) c = '_';
  return s;
}

std::string status_path(const std::string& dir, int rank) {
  return fmt::format("{}/rank-{}.txt", dir, rank);
}

// ---- owners: which processes a run directory belongs to ------------------------------------

std::string owner_path(const std::string& dir, int rank) {
  return fmt::format("{}/owner-{}.txt", dir, rank);
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// Fields 3 (state: R, S, ..., Z for a zombie) and 22 (start time in clock ticks since boot) of
// /proc/PID/stat: with the pid, the start time names one process even after the pid is reused.
// Empty strings where /proc is not there.
std::pair<std::string, std::string> proc_state_start(long pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  if (!std::getline(f, stat)) return {};
  const std::size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos || close + 2 > stat.size()) return {};
  std::istringstream rest(stat.substr(close + 2));
  std::string field, state;
  for (int i = 3; i <= 22 && (rest >> field); ++i) {
    if (i == 3) state = field;
    if (i == 22) return {state, field};
  }
  return {state, ""};
}

std::string start_time(long pid) { return proc_state_start(pid).second; }

// "host\tpid\tstart": what owner-RANK.txt holds.
std::string owner_line(long pid) {
  return fmt::format("{}\t{}\t{}\n", host_name(), pid, start_time(pid));
}

}  // namespace

bool owner_alive(const std::string& line) {
  std::istringstream in(line);
  std::string host, start;
  long pid = 0;
  std::getline(in, host, '\t');
  if (!(in >> pid)) return true;  // unreadable (being written?): assume alive
  in.ignore(1);
  std::getline(in, start);
  if (host != host_name()) return true;  // another node's process: cannot tell, keep
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  const auto [state, now] = proc_state_start(pid);
  if (state == "Z" || state == "X") return false;  // killed, not yet reaped: it never runs again
  return start.empty() || now.empty() || now == start;  // the same pid, another process: gone
}

int remove_stale_run_dirs(const std::string& base, const std::string& keep,
                          double ownerless_age_s) {
  int removed = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& entry : fs::directory_iterator(base, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("scalelab-watchdog-", 0) != 0) continue;
    std::error_code e2;
    if (!entry.is_directory(e2) || entry.is_symlink(e2)) continue;
    if (!keep.empty() && fs::equivalent(entry.path(), keep, e2)) continue;
    int owners = 0;
    bool alive = false;
    for (const auto& f : fs::directory_iterator(entry.path(), e2)) {
      const std::string fname = f.path().filename().string();
      if (fname.rfind("owner-", 0) != 0 || fname.find(".tmp") != std::string::npos) continue;
      ++owners;
      std::ifstream in(f.path());
      std::string line;
      std::getline(in, line);
      if (owner_alive(line)) {
        alive = true;
        break;
      }
    }
    if (alive) continue;
    if (owners == 0) {
      // No owner recorded: a directory of an older build, or one whose first rank has not
      // written its owner file yet. Only once nothing has changed in it for a while.
      const auto mtime = fs::last_write_time(entry.path(), e2);
      if (e2) continue;
      const double age = std::chrono::duration<double>(now - mtime).count();
      if (age < ownerless_age_s) continue;
    }
    fs::remove_all(entry.path(), e2);
    if (!e2) ++removed;
  }
  return removed;
}

namespace {

// One line per fact, tab-separated fields (names never contain tabs).
std::string serialize(State& s) {
  std::string out = fmt::format("rank\t{}\n", world_rank());
  for (auto& [token, e] : s.inflight)
    out += fmt::format("wait\t{}\t{}\t{}\t{}\t{:.6f}\t{}\n", e.kind, e.seq, e.bytes,
                       s.groups[e.group].name, e.start_s, e.detail);
  for (auto& g : s.groups) {
    std::string members;
    for (int r : g.ranks) {
      if (!members.empty()) members += ',';
      members += std::to_string(r);
    }
    out += fmt::format("group\t{}\t{}\t{}\t{}\n", g.name, members, g.last_seq, g.last_kind);
  }
  return out;
}

void write_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return;  // the report will say "no status"; never fail the program for this
    f << text;
  }
  std::rename(tmp.c_str(), path.c_str());
}

[[noreturn]] void fire() {
  State& s = state();
  {
    std::lock_guard lock(s.mutex);
    write_file(status_path(s.dir, world_rank()), serialize(s));
  }
  // Only one rank reports; the others that time out at the same moment leave it the stage.
  std::string lock_path = s.dir + "/report.lock";
  int fd = ::open(lock_path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  if (fd < 0) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    std::_Exit(kExitHang);
  }
  ::close(fd);
  // Give the peers' watchdog threads one period to write their latest state.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string report = build_report(s.dir, world_rank(), world_size());
  std::fprintf(stderr, "%s\n", report.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  // Ranks that time out with us find the lock within a watchdog period; then clean up, so hangs
  // leave nothing behind either (the launcher ends the other ranks once we exit).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::error_code ec;
  fs::remove_all(s.dir, ec);
  std::_Exit(kExitHang);
}

void thread_main() {
  State& s = state();
  std::uint64_t written = 0;
  while (!s.stopping) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (s.stopping) break;
    bool expired = false;
    {
      // Written under the lock, so that no write can follow stop() (which removes the file).
      std::lock_guard lock(s.mutex);
      if (s.stopping) break;
      if (s.version != written) {
        write_file(status_path(s.dir, world_rank()), serialize(s));
        written = s.version;
      }
      if (!s.inflight.empty()) {
        double oldest = s.inflight.begin()->second.start_s;
        for (auto& [t, e] : s.inflight) oldest = std::min(oldest, e.start_s);
        expired = mono_s() - oldest > s.timeout_s;
      }
    }
    if (expired) fire();
  }
}

// ---- reading the status files ----------------------------------------------------------------

struct Wait {
  std::string kind, group, detail;
  std::int64_t seq = 0;
  std::size_t bytes = 0;
  double start_s = 0;
};
struct GroupInfo {
  std::string name, members;
  std::int64_t last_seq = 0;
  std::string last_kind;
};
struct RankStatus {
  bool found = false;
  std::vector<Wait> waits;
  std::vector<GroupInfo> groups;
};

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == '\t') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

RankStatus read_status(const std::string& path) {
  RankStatus st;
  std::ifstream f(path);
  if (!f) return st;
  st.found = true;
  std::string line;
  while (std::getline(f, line)) {
    auto v = split_tabs(line);
    try {
      if (v[0] == "wait" && v.size() >= 7) {
        st.waits.push_back(Wait{v[1], v[4], v[6], std::stoll(v[2]), std::stoull(v[3]),
                                std::stod(v[5])});
      } else if (v[0] == "group" && v.size() >= 5) {
        st.groups.push_back(GroupInfo{v[1], v[2], std::stoll(v[3]), v[4]});
      }
    } catch (const std::exception&) {
      // a torn or foreign line: skip it, the report is best effort
    }
  }
  return st;
}

std::string describe(const Wait& w) {
  return fmt::format("{} #{} ({}, group {}{}{})", w.kind, w.seq, format_bytes(w.bytes), w.group,
                     w.detail.empty() ? "" : ", ", w.detail);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {
    if (!s.empty()) s += ',';
    s += std::to_string(r);
  }
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", s);
}

}  // namespace

std::string format_bytes(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", bytes);
  if (v == static_cast<double>(static_cast<long long>(v))) return fmt::format("{:.0f} {}", v, units[u]);
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string build_report(const std::string& dir, int rank, int world_size) {
  std::vector<RankStatus> all(world_size);
  for (int r = 0; r < world_size; ++r) all[r] = read_status(status_path(dir, r));
  const RankStatus& me = all[rank];
  if (me.waits.empty())
    return fmt::format("[scalelab] watchdog: rank {} timed out (no status recorded)", rank);
  // The operation this rank has waited in longest is the one that blocks it.
  const Wait* w = &me.waits.front();
  for (auto& x : me.waits)
    if (x.start_s < w->start_s) w = &x;
  double waited = mono_s() - w->start_s;
  std::string out = fmt::format("[scalelab] watchdog: rank {} waits in {} for {:.1f} s", rank,
                                describe(*w), waited);

  // What each other rank does, ranks doing the same thing listed together.
  std::map<std::string, std::vector<int>> doing;  // description -> ranks
  std::vector<std::string> order;
  for (int r = 0; r < world_size; ++r) {
    if (r == rank) continue;
    const RankStatus& st = all[r];
    std::string d;
    if (!st.found) {
      d = "have exited (or not started)";
    } else if (!st.waits.empty()) {
      const Wait* o = &st.waits.front();
      for (auto& x : st.waits)
        if (x.start_s < o->start_s) o = &x;
      d = "in " + describe(*o);
    } else {
      d = "not in a collective";
      for (auto& g : st.groups)
        if (g.name == w->group)
          d += g.last_seq == 0
                   ? fmt::format(" (none of group {} finished yet)", g.name)
                   : fmt::format(" (last finished in group {}: {} #{})", g.name, g.last_kind,
                                 g.last_seq);
    }
    if (!doing.count(d)) order.push_back(d);
    doing[d].push_back(r);
  }
  for (auto& d : order) {
    const auto& ranks = doing[d];
    std::string verb = ranks.size() == 1 ? "is" : "are";
    if (d.rfind("have ", 0) == 0 && ranks.size() == 1) d = "has " + d.substr(5);
    out += fmt::format(";\n  {} {} {}", rank_list(ranks), verb, d);
  }

  // The waiting group's sequence numbers, member by member: a rank behind the others skipped a
  // collective (or has not got there yet).
  std::string members;
  for (auto& g : me.groups)
    if (g.name == w->group) members = g.members;
  if (!members.empty() && w->kind != "send" && w->kind != "recv") {
    std::string seqs;
    std::vector<int> behind;
    std::string mismatch;  // same sequence number, different collective
    std::stringstream ss(members);
    std::string item;
    while (std::getline(ss, item, ',')) {
      int r = std::stoi(item);
      if (r < 0 || r >= world_size) continue;
      const RankStatus& st = all[r];
      std::string at;
      bool waiting_here = false;
      for (auto& x : st.waits)
        if (x.group == w->group && x.kind != "send" && x.kind != "recv") {
          at = fmt::format("in {} #{}", x.kind, x.seq);
          waiting_here = true;
          if (x.seq == w->seq && x.kind != w->kind && mismatch.empty())
            mismatch = fmt::format("\n  rank {} entered {} #{} where rank {} entered {} #{}: the "
                                   "ranks called different collectives",
                                   r, x.kind, x.seq, rank, w->kind, w->seq);
          if (x.seq < w->seq) behind.push_back(r);
          break;
        }
      if (!waiting_here) {
        for (auto& g : st.groups)
          if (g.name == w->group && g.members == members) {
            at = g.last_seq == 0 ? std::string("finished none")
                                 : fmt::format("finished #{} ({})", g.last_seq, g.last_kind);
            if (g.last_seq < w->seq) behind.push_back(r);
          }
        if (at.empty()) {
          at = st.found ? "unknown" : "exited";
          if (!st.found) behind.push_back(r);
        }
      }
      seqs += fmt::format("{}rank {} {}", seqs.empty() ? "" : ", ", r, at);
    }
    out += fmt::format("\n  group {} sequence numbers: {}", w->group, seqs);
    out += mismatch;
    if (!behind.empty())
      out += fmt::format("\n  {} did not reach {} #{} of group {} (skipped a collective, or still "
                         "computing)",
                         rank_list(behind), w->kind, w->seq, w->group);
  }
  return out;
}

void set_timeout(double timeout_s) {
  SCALELAB_REQUIRE(timeout_s > 0, "the watchdog timeout must be positive, got {}", timeout_s);
  std::lock_guard lock(state().mutex);
  state().timeout_s = timeout_s;
}

double timeout() { return state().timeout_s; }

double timeout_from_env(double fallback) {
  const char* v = std::getenv("SCALELAB_TIMEOUT");
  if (!v || !*v) return fallback;
  char* end = nullptr;
  double t = std::strtod(v, &end);
  SCALELAB_REQUIRE(end != v && *end == 0 && t > 0,
                   "SCALELAB_TIMEOUT must be a positive number of seconds, got '{}'", v);
  return t;
}

void start(double timeout_s) {
  set_timeout(timeout_s);
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (s.started) return;
  std::string base = env_or("SCALELAB_RUN_DIR", env_or("TMPDIR", "/tmp"));
  s.dir = fmt::format("{}/scalelab-watchdog-{}", base, sanitize(job_key()));
  std::error_code ec;
  fs::create_directories(s.dir, ec);
  SCALELAB_REQUIRE(fs::is_directory(s.dir), "watchdog: cannot create the run directory '{}'",
                   s.dir);
  // Who owns this directory: when every owner is gone (killed, crashed, aborted), a later start
  // of any job removes it; while one lives, nobody does.
  write_file(owner_path(s.dir, world_rank()), owner_line(static_cast<long>(::getpid())));
  remove_stale_run_dirs(base, s.dir, kOwnerlessAge);
  s.started = true;
  s.version++;
  std::thread(thread_main).detach();
  std::atexit([] { stop(); });
}

std::string run_dir() { return state().dir; }

int register_group(std::string_view name, std::vector<int> world_ranks) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.groups.push_back(Group{std::string(name), std::move(world_ranks)});
  s.version++;
  return static_cast<int>(s.groups.size()) - 1;
}

std::uint64_t enter(int group, std::string_view kind, std::int64_t seq, std::size_t bytes,
                    bool collective, std::string_view detail) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  std::uint64_t token = s.next_token++;
  s.inflight.emplace(token, Entry{group, std::string(kind), std::string(detail), seq, bytes,
                                  collective, mono_s()});
  s.version++;
  return token;
}

void leave(std::uint64_t token) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto it = s.inflight.find(token);
  if (it == s.inflight.end()) return;
  const Entry& e = it->second;
  if (e.collective) {
    Group& g = s.groups[e.group];
    if (e.seq > g.last_seq) {
      g.last_seq = e.seq;
      g.last_kind = e.kind;
    }
  }
  s.inflight.erase(it);
  s.version++;
}

void stop() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.started || s.stopping) return;
  s.stopping = true;
  // A rank that has exited has no status file (the report says so); the last rank out finds the
  // directory empty and removes it.
  std::remove(status_path(s.dir, world_rank()).c_str());
  std::remove(owner_path(s.dir, world_rank()).c_str());
  ::rmdir(s.dir.c_str());
}

}  // namespace scalelab::watchdog
