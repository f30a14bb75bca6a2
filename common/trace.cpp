#include "common/trace.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <mpi.h>

#include "common/errors.hpp"

namespace scalelab::trace {
namespace {

struct Event {
  std::string name, category, args;
  double begin_us, end_us;
  int track;
};

std::mutex g_mutex;
bool g_enabled = false;
std::string g_path;
std::vector<Event> g_events;

// JSON string escaping for the few characters a name can carry.
std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out;
}

std::vector<bool> g_lanes;  // acquire_comm_lane: which comm lanes are held (under g_mutex)

}  // namespace

int acquire_comm_lane() {
  std::lock_guard lock(g_mutex);
  for (std::size_t i = 0; i < g_lanes.size(); ++i)
    if (!g_lanes[i]) {
      g_lanes[i] = true;
      return static_cast<int>(i);
    }
  g_lanes.push_back(true);
  return static_cast<int>(g_lanes.size()) - 1;
}

void release_comm_lane(int lane) {
  std::lock_guard lock(g_mutex);
  if (lane >= 0 && lane < static_cast<int>(g_lanes.size())) g_lanes[lane] = false;
}

void enable(const std::string& path) {
  std::lock_guard lock(g_mutex);
  g_path = path;
  g_events.clear();
  g_enabled = true;
}

bool enabled() { return g_enabled; }

double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

void event(std::string_view name, std::string_view category, double begin_us, double end_us,
           int track, std::string_view args_json) {
  if (!g_enabled) return;
  std::lock_guard lock(g_mutex);
  if (!g_enabled) return;
  g_events.push_back(Event{std::string(name), std::string(category), std::string(args_json),
                           begin_us, end_us, track});
}

Scope::Scope(std::string_view name, std::string_view category) {
  if (!g_enabled) return;
  name_ = name;
  category_ = category;
  begin_us_ = now_us();
}

Scope::~Scope() {
  if (begin_us_ >= 0) event(name_, category_, begin_us_, now_us(), kCompute);
}

std::string path() {
  std::lock_guard lock(g_mutex);
  return g_enabled ? g_path : std::string();
}

std::size_t finish() {
  std::vector<Event> events;
  std::string path;
  {
    std::lock_guard lock(g_mutex);
    if (!g_enabled) return 0;
    g_enabled = false;
    events.swap(g_events);
    path = g_path;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  // This rank's events as JSON objects (pid = rank), one per line, plus the earliest timestamp
  // so rank 0 can shift the whole job to start at 0.
  double t0 = events.empty() ? 1e300 : events.front().begin_us;
  for (auto& e : events) t0 = std::min(t0, e.begin_us);
  double global_t0 = t0;
  MPI_Allreduce(&t0, &global_t0, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);

  // Metadata first: name each rank's process and its two tracks.
  std::string mine = fmt::format(
        "{{\"ph\":\"M\",\"pid\":{0},\"name\":\"process_name\",\"args\":{{\"name\":\"rank {0}\"}}}},\n"
        "{{\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"name\":\"thread_name\",\"args\":{{\"name\":\"compute\"}}}},\n"
        "{{\"ph\":\"M\",\"pid\":{0},\"tid\":1,\"name\":\"thread_name\",\"args\":{{\"name\":\"comm\"}}}},\n",
        rank);
  int tracks = kComm;  // the comm lanes beyond the first, named "comm 2", "comm 3", ...
  for (auto& e : events) tracks = std::max(tracks, e.track);
  for (int t = kComm + 1; t <= tracks; ++t)
    mine += fmt::format("{{\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"thread_name\","
                        "\"args\":{{\"name\":\"comm {}\"}}}},\n", rank, t, t - kComm + 1);
  for (auto& e : events) {
    mine += fmt::format(
        "{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},"
        "\"dur\":{:.3f},\"args\":{{{}}}}},\n",
        escape(e.name), escape(e.category), rank, e.track, e.begin_us - global_t0,
        std::max(0.0, e.end_us - e.begin_us), e.args);
  }

  // Gather every rank's text to rank 0.
  int my_len = static_cast<int>(mine.size());
  std::vector<int> lens(size), displs(size);
  MPI_Gather(&my_len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (rank == 0) {
    long long total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = static_cast<int>(total);
      total += lens[r];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  MPI_Gatherv(mine.data(), my_len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0,
              MPI_COMM_WORLD);
  long long count = static_cast<long long>(events.size());
  long long total_count = count;
  MPI_Reduce(&count, &total_count, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank != 0) return 0;

  // Drop the last ",\n" so the array is valid JSON.
  while (!all.empty() && (all.back() == '\n' || all.back() == ',')) all.pop_back();
  std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  SCALELAB_REQUIRE(f != nullptr, "cannot write the trace file '{}'", path);
  std::fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n%s\n]}\n", all.c_str());
  std::fclose(f);
  SCALELAB_REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot write the trace file '{}'",
                   path);
  return static_cast<std::size_t>(total_count);
}

void reset() {
  std::lock_guard lock(g_mutex);
  g_enabled = false;
  g_events.clear();
  g_path.clear();
}

}  // namespace scalelab::trace
