#pragma once
/// @file transports.hpp
/// The traffic ledger (stats.hpp: comm::traffic()) split by transport: on an nccl group CUDA
/// tensors travel over NCCL and host values (a loss, a twin check, a table's numbers) over the
/// group's MPI communicator; a message to oneself is a copy (common/comm/route.hpp). Each row of
/// comm::traffic() is here once per transport that carried it, with the same calls and bytes in
/// total. What a GPU run's grader reads to see that the gradients went over NCCL and nothing
/// else was staged through host memory:
///
///   const comm::TransportTraffic before = comm::traffic_by_transport();
///   step();
///   for (const auto& [key, count] : comm::traffic_by_transport() - before) ...
///
/// Counted with the ledger, at submission, on the calling thread; reset_comm_stats() clears it.
#include <compare>
#include <map>
#include <string>

#include "common/comm/stats.hpp"

namespace scalelab::comm {

/// A ledger row and the transport that carried it.
struct TransportKey {
  TrafficKey row;         ///< as in comm::traffic()
  std::string transport;  ///< "mpi", "nccl" or "self"
  /// Ordered by row, then transport.
  auto operator<=>(const TransportKey&) const = default;
};
/// Calls and payload bytes per row and transport.
using TransportTraffic = std::map<TransportKey, CommCount>;

/// This rank's ledger by transport since the start or the last reset_comm_stats(). Thread safe.
TransportTraffic traffic_by_transport();

/// `after - before`, per key (zero-call differences left out).
TransportTraffic operator-(const TransportTraffic& after, const TransportTraffic& before);

/// "all_reduce(sum) on world [0 1] over nccl".
std::string transport_key_str(const TransportKey& key);

}  // namespace scalelab::comm
