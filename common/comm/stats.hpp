#pragma once
/// @file stats.hpp
/// Communication accounting: every Communicator counts, per group (the communicator's name:
/// "world", "tp0", "dp1", ...) and per operation kind, the calls and the payload bytes this rank
/// submitted. Labs print it per step next to the formulas (TP: all-reduces of B*T*C per block;
/// ZeRO: 2 Psi, 2 Psi, 3 Psi):
///
///   comm::reset_comm_stats();
///   train_step(...);
///   if (rank == 0) fmt::print("{}", comm::format_comm_stats(comm::comm_stats()));
///
/// Payload: the bytes of the operation's whole buffer, the same number on every rank of the
/// group (it is also the size the trace and the watchdog show):
///   all_reduce, reduce, broadcast   the tensor's bytes
///   all_gather                      the output's bytes  (size x the input's)
///   reduce_scatter                  the input's bytes   (size x the output's)
///   scatter, gather                 size x the chunk's bytes (root's whole buffer, on every rank)
///   all_to_all                      the input's bytes (= the output's)
///   send, recv                      the message's bytes
///   barrier                         0
/// So a reduce_scatter of a gradient of Psi bytes and an all_gather of the parameters back count
/// Psi bytes each: ZeRO-1's "2 Psi". This is the payload, not what crosses the wire: a ring
/// all_reduce sends about 2(n-1)/n x payload per rank, a ring all_gather or reduce_scatter
/// (n-1)/n x payload, so DDP's one all_reduce of Psi moves as much as ZeRO's two collectives.
///
/// What is counted: every call of the Communicator's operations, blocking or not (an *_async
/// call counts under the same kind as the blocking one; the blocking ones are async + wait), at
/// submission, on the calling thread. split() and the library's own bookkeeping (the matching
/// check's small all-gathers, NCCL's bootstrap) are not counted. A call rejected by its argument
/// checks is not counted. Groups with the same name share one row.
///
/// The ledger (traffic()) counts the same calls finer, for graders that hold a step to an exact
/// budget (tests/support/traffic_budget.hpp): per group name AND members (a communicator a
/// submission splits or duplicates itself is its own row, even under a name it borrowed), per
/// reduction (a max all-reduce is not the sum a technique needs) and per peer or root.
#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace scalelab::comm {

/// How often one kind of operation ran on one group, and how many payload bytes it moved.
struct CommCount {
  std::int64_t calls = 0;  ///< operations submitted
  std::int64_t bytes = 0;  ///< their payload (see the top of this file for what counts)
  /// Equal calls and bytes.
  bool operator==(const CommCount&) const = default;
};

/// What a count is of: an operation kind on a named group.
struct CommKey {
  std::string group;  ///< the communicator's name ("world", "tp0", "dp1", ...)
  /// all_reduce, reduce, broadcast, all_gather, reduce_scatter, scatter, gather, all_to_all,
  /// send, recv, barrier.
  std::string op;
  /// Ordered by group, then op.
  auto operator<=>(const CommKey&) const = default;
};

/// Sorted by group, then op.
using CommStats = std::map<CommKey, CommCount>;

/// This rank's counters, over all its communicators, since the start or the last reset. Thread
/// safe.
CommStats comm_stats();

/// Sets every counter of this rank to zero.
void reset_comm_stats();

/// `after - before`, per key (keys whose difference is zero calls are left out): the traffic of
/// one step without resetting counters someone else may be reading.
CommStats operator-(const CommStats& after, const CommStats& before);

/// The sum over the entries that match `group` and `op` (an empty string matches any).
CommCount comm_total(const CommStats& stats, const std::string& group = "",
                     const std::string& op = "");

/// One row of the ledger: which group (name and members), which operation, which reduction, which
/// peer. Sorted by group, members, op, reduce, peer.
struct TrafficKey {
  std::string group;         ///< the communicator's name
  std::vector<int> members;  ///< its ranks as world ranks, in the group's order
  std::string op;            ///< as CommKey::op
  std::string reduce;        ///< all_reduce, reduce, reduce_scatter: sum, max, min or avg; else ""
  /// send: destination, recv: source, rooted collectives: the root; a world rank. -1 for the
  /// others.
  int peer = -1;
  /// Ordered by group, members, op, reduce, peer.
  auto operator<=>(const TrafficKey&) const = default;
};
/// The ledger: calls and payload bytes per row.
using Traffic = std::map<TrafficKey, CommCount>;

/// This rank's ledger since the start or the last reset_comm_stats(). Thread safe.
Traffic traffic();

/// `after - before`, per key (zero-call differences left out).
Traffic operator-(const Traffic& after, const Traffic& before);

/// "all_reduce(sum) on world [0 1 2 3]", "send to world rank 1 on pp [0 1]".
std::string traffic_key_str(const TrafficKey& key);

/// A small table, one line per (group, op) and a total:
///   group  op          calls    bytes   MiB
///   tp0    all_reduce     24  3145728  3.00
///   total                 24  3145728  3.00
/// "(no communication)" when empty.
std::string format_comm_stats(const CommStats& stats);

}  // namespace scalelab::comm
