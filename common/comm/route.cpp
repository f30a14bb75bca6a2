// Which transport moves an operation (route.hpp's table).
#include "common/comm/route.hpp"

namespace scalelab::comm::detail {

const char* transport_name(Transport t) {
  switch (t) {
    case Transport::self: return "self";
    case Transport::mpi: return "mpi";
    case Transport::nccl: return "nccl";
  }
  return "?";
}

Residence residence_of(const Op& op) {
  bool host = false, cuda = false;
  for (const Tensor* t : {&op.in, &op.out}) {
    if (!t->defined()) continue;
    (t->device().is_cuda() ? cuda : host) = true;
  }
  if (host && cuda) return Residence::mixed;
  return cuda ? Residence::cuda : host ? Residence::host : Residence::none;
}

namespace {

// Operations that carry no tensor: the group's MPI communicator runs them on every backend but
// self. A new operation with tensors is a collective or a point-to-point one: it needs no entry.
bool structural(OpKind k) {
  switch (k) {
    case OpKind::barrier:
    case OpKind::split: return true;
    case OpKind::all_reduce:
    case OpKind::reduce:
    case OpKind::broadcast:
    case OpKind::all_gather:
    case OpKind::reduce_scatter:
    case OpKind::scatter:
    case OpKind::gather:
    case OpKind::all_to_all:
    case OpKind::send:
    case OpKind::recv: return false;
  }
  return false;
}

}  // namespace

Route route(const RouteQuery& q) {
  if (q.backend == "self") return {Transport::self};
  if (structural(q.kind) || q.where == Residence::none || q.where == Residence::host ||
      q.backend == "mpi")
    return {Transport::mpi};  // host values, and every CUDA tensor of an mpi group (staged)
  const bool asked = q.backend == "nccl";  // else "auto": NCCL where it can, staging otherwise
  if (!q.nccl_built) return asked ? Route{Transport::mpi, RouteError::no_nccl} : Route{};
  if (q.where == Residence::mixed)
    return asked ? Route{Transport::mpi, RouteError::mixed_devices} : Route{};
  // A message to oneself is a copy: NCCL would need its send and recv in one group, which a
  // lone send/recv launched when waited for (or tested) does not guarantee.
  if (is_point_to_point(q.kind) && q.to_self) return {Transport::self};
  if (q.nccl_refused)
    return asked ? Route{Transport::mpi, RouteError::gpu_shared}
                 : Route{Transport::mpi, RouteError::none, true};
  return {Transport::nccl};
}

}  // namespace scalelab::comm::detail
