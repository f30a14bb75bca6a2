// Communication accounting (stats.hpp): one table per process, guarded by a mutex, filled by
// Communicator::submit through detail::count_op.
#include "common/comm/stats.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/comm/op.hpp"
#include "common/comm/transports.hpp"

namespace scalelab::comm {

namespace {

std::mutex g_mutex;
CommStats g_stats;
Traffic g_traffic;
TransportTraffic g_by_transport;

}  // namespace

namespace detail {

void count_op(const std::string& group, const std::vector<int>& members, OpKind kind,
              const char* reduce, int peer, std::size_t bytes, const char* transport) {
  std::lock_guard lock(g_mutex);
  const TrafficKey row{group, members, op_kind_name(kind), reduce, peer};
  for (CommCount* c : {&g_stats[CommKey{group, op_kind_name(kind)}], &g_traffic[row],
                       &g_by_transport[TransportKey{row, transport}]}) {
    c->calls += 1;
    c->bytes += static_cast<std::int64_t>(bytes);
  }
}

}  // namespace detail

CommStats comm_stats() {
  std::lock_guard lock(g_mutex);
  return g_stats;
}

void reset_comm_stats() {
  std::lock_guard lock(g_mutex);
  g_stats.clear();
  g_traffic.clear();
  g_by_transport.clear();
}

Traffic traffic() {
  std::lock_guard lock(g_mutex);
  return g_traffic;
}

namespace {
template <class Map>
Map difference(const Map& after, const Map& before) {
  Map diff;
  for (const auto& [key, count] : after) {
    CommCount d = count;
    auto it = before.find(key);
    if (it != before.end()) {
      d.calls -= it->second.calls;
      d.bytes -= it->second.bytes;
    }
    if (d.calls != 0) diff[key] = d;
  }
  return diff;
}
}  // namespace

Traffic operator-(const Traffic& after, const Traffic& before) { return difference(after, before); }

TransportTraffic traffic_by_transport() {
  std::lock_guard lock(g_mutex);
  return g_by_transport;
}

TransportTraffic operator-(const TransportTraffic& after, const TransportTraffic& before) {
  return difference(after, before);
}

std::string transport_key_str(const TransportKey& key) {
  return traffic_key_str(key.row) + " over " + key.transport;
}

std::string traffic_key_str(const TrafficKey& k) {
  std::string s = k.op;
  if (!k.reduce.empty()) s += "(" + k.reduce + ")";
  if (k.op == "send") s += fmt::format(" to world rank {}", k.peer);
  else if (k.op == "recv") s += fmt::format(" from world rank {}", k.peer);
  else if (k.peer >= 0) s += fmt::format(" root world rank {}", k.peer);
  return s + fmt::format(" on {} [{}]", k.group, fmt::join(k.members, " "));
}

CommStats operator-(const CommStats& after, const CommStats& before) {
  return difference(after, before);
}

CommCount comm_total(const CommStats& stats, const std::string& group, const std::string& op) {
  CommCount total;
  for (const auto& [key, count] : stats) {
    if (!group.empty() && key.group != group) continue;
    if (!op.empty() && key.op != op) continue;
    total.calls += count.calls;
    total.bytes += count.bytes;
  }
  return total;
}

std::string format_comm_stats(const CommStats& stats) {
  if (stats.empty()) return "(no communication)\n";
  const double mib = 1024.0 * 1024.0;

  // Rows as text first, then pad every column to its widest cell.
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"group", "op", "calls", "bytes", "MiB"});
  for (const auto& [key, count] : stats)
    rows.push_back({key.group, key.op, fmt::format("{}", count.calls),
                    fmt::format("{}", count.bytes), fmt::format("{:.2f}", count.bytes / mib)});
  const CommCount total = comm_total(stats);
  rows.push_back({"total", "", fmt::format("{}", total.calls), fmt::format("{}", total.bytes),
                  fmt::format("{:.2f}", total.bytes / mib)});

  std::vector<std::size_t> width(5, 0);
  for (const auto& row : rows)
    for (std::size_t k = 0; k < row.size(); ++k) width[k] = std::max(width[k], row[k].size());

  std::string out;
  for (const auto& row : rows)  // names left-aligned, numbers right-aligned
    out += fmt::format("{:<{}}  {:<{}}  {:>{}}  {:>{}}  {:>{}}\n", row[0], width[0], row[1],
                       width[1], row[2], width[2], row[3], width[3], row[4], width[4]);
  return out;
}

}  // namespace scalelab::comm
