#pragma once
/// @file route.hpp
/// Internal to common/comm (namespace detail: not for labs): which transport moves an
/// operation's bytes, decided from the group's backend and where the operation's tensors live,
/// PyTorch's "cuda:nccl,cpu:gloo". One pure function, so the whole table is tested on a CPU
/// (tests/common/test_comm_route.cpp), and Communicator::submit only acts on its answer.
///
///   backend   host tensors         CUDA tensors                     no tensor (barrier, split)
///   self      self                 self                             self
///   mpi       mpi                  mpi (staged through host memory)  mpi
///   nccl      mpi (the group's)    nccl; a send/recv to oneself: a   mpi
///                                  copy (self); NCCL refusing ranks
///                                  that share a GPU: an error
///   auto      mpi                  as nccl when NCCL is built in and  mpi
///                                  accepts the ranks, else mpi
///                                  (staged)
/// An operation whose tensors are on both (in on the GPU, out on the host) can only be staged:
/// mpi takes it, nccl cannot (an error), auto stages it.
#include <string_view>

#include "common/comm/op.hpp"

namespace scalelab::comm::detail {

/// What moves the bytes: a copy inside this process, the group's MPI communicator (host
/// memory; CUDA tensors are staged), or NCCL (device memory).
enum class Transport { self, mpi, nccl };
/// "self", "mpi" or "nccl": what the ledger, the execution log and the watchdog show.
const char* transport_name(Transport t);

/// Where an operation's tensors live.
enum class Residence {
  none,   ///< no tensor: barrier, split
  host,   ///< every defined tensor in host memory
  cuda,   ///< every defined tensor on a GPU
  mixed   ///< one on each
};
/// The residence of `op`'s defined tensors (in and out).
Residence residence_of(const Op& op);

/// Why an operation has no transport.
enum class RouteError {
  none,           ///< a transport was found
  no_nccl,        ///< backend nccl in a build without NCCL
  gpu_shared,     ///< backend nccl, a CUDA tensor, and NCCL refuses the ranks sharing a GPU
  mixed_devices   ///< backend nccl, one tensor on the GPU and one on the host
};

/// The inputs of the decision: what the group is and what the operation touches.
struct RouteQuery {
  std::string_view backend;    ///< the group's: self, mpi, nccl or auto
  OpKind kind;                 ///< the operation
  Residence where;             ///< where its tensors live
  bool to_self = false;        ///< send/recv: the peer is this rank
  bool nccl_built = false;     ///< nccl_compiled()
  bool nccl_refused = false;   ///< gpu_sharing(...).refused: NCCL will not take these ranks
};

/// The answer: a transport, or (transport ignored) the error.
struct Route {
  Transport transport = Transport::mpi;  ///< who moves the bytes
  RouteError error = RouteError::none;   ///< none, or why nobody can
  /// auto chose mpi for CUDA tensors because NCCL refuses ranks that share a GPU (the caller
  /// says so once).
  bool staged_for_sharing = false;
};

/// The routing table at the top of this file. Pure: no MPI, no CUDA.
Route route(const RouteQuery& q);

}  // namespace scalelab::comm::detail
