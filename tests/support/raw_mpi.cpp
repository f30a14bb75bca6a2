// MPI's profiling interface in the test binaries (raw_mpi.hpp): each MPI call that moves data is
// defined here, counted when one of the rank's threads makes it outside a LibraryMpi scope, and
// forwarded to PMPI_. Defined in the executable, these replace libmpi's for the attendee's object
// and the library alike; the library's calls run on its communicators' worker threads.
#include "tests/support/raw_mpi.hpp"

#include <mpi.h>

#include <atomic>

#include "tests/support/rank_threads.hpp"

namespace scalelab::labtest {
namespace {

__attribute__((tls_model("initial-exec"))) thread_local int t_library = 0;
std::atomic<int64_t> g_calls{0};
std::atomic<const char *> g_last{nullptr};

// Counts a call of the rank's outside the harness; a thread MPI starts inside a call is never
// the rank's (NotTheRanksThreads).
struct Counted {
  explicit Counted(const char *name) {
    if (t_library == 0 && on_rank_thread()) {
      g_calls.fetch_add(1);
      g_last.store(name);
    }
  }
  NotTheRanksThreads mpi_threads;
};

}  // namespace

RawMpi raw_mpi() {
  const char *last = g_last.load();
  return RawMpi{g_calls.load(), last ? last : ""};
}

LibraryMpi::LibraryMpi() noexcept { ++t_library; }
LibraryMpi::~LibraryMpi() { --t_library; }

}  // namespace scalelab::labtest

using scalelab::labtest::Counted;

extern "C" {

int MPI_Send(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
  const Counted c("MPI_Send");
  return PMPI_Send(buf, count, datatype, dest, tag, comm);
}
int MPI_Isend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm,
              MPI_Request *request) {
  const Counted c("MPI_Isend");
  return PMPI_Isend(buf, count, datatype, dest, tag, comm, request);
}
int MPI_Ssend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
  const Counted c("MPI_Ssend");
  return PMPI_Ssend(buf, count, datatype, dest, tag, comm);
}
int MPI_Issend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm,
               MPI_Request *request) {
  const Counted c("MPI_Issend");
  return PMPI_Issend(buf, count, datatype, dest, tag, comm, request);
}
int MPI_Bsend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
  const Counted c("MPI_Bsend");
  return PMPI_Bsend(buf, count, datatype, dest, tag, comm);
}
int MPI_Ibsend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm,
               MPI_Request *request) {
  const Counted c("MPI_Ibsend");
  return PMPI_Ibsend(buf, count, datatype, dest, tag, comm, request);
}
int MPI_Rsend(const void *ibuf, int count, MPI_Datatype datatype, int dest, int tag,
              MPI_Comm comm) {
  const Counted c("MPI_Rsend");
  return PMPI_Rsend(ibuf, count, datatype, dest, tag, comm);
}
int MPI_Irsend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm,
               MPI_Request *request) {
  const Counted c("MPI_Irsend");
  return PMPI_Irsend(buf, count, datatype, dest, tag, comm, request);
}
int MPI_Recv(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
             MPI_Status *status) {
  const Counted c("MPI_Recv");
  return PMPI_Recv(buf, count, datatype, source, tag, comm, status);
}
int MPI_Irecv(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
              MPI_Request *request) {
  const Counted c("MPI_Irecv");
  return PMPI_Irecv(buf, count, datatype, source, tag, comm, request);
}
int MPI_Sendrecv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, int dest, int sendtag,
                 void *recvbuf, int recvcount, MPI_Datatype recvtype, int source, int recvtag,
                 MPI_Comm comm, MPI_Status *status) {
  const Counted c("MPI_Sendrecv");
  return PMPI_Sendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype,
                       source, recvtag, comm, status);
}
int MPI_Sendrecv_replace(void *buf, int count, MPI_Datatype datatype, int dest, int sendtag,
                         int source, int recvtag, MPI_Comm comm, MPI_Status *status) {
  const Counted c("MPI_Sendrecv_replace");
  return PMPI_Sendrecv_replace(buf, count, datatype, dest, sendtag, source, recvtag, comm, status);
}
int MPI_Send_init(const void *buf, int count, MPI_Datatype datatype, int dest, int tag,
                  MPI_Comm comm, MPI_Request *request) {
  const Counted c("MPI_Send_init");
  return PMPI_Send_init(buf, count, datatype, dest, tag, comm, request);
}
int MPI_Recv_init(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
                  MPI_Request *request) {
  const Counted c("MPI_Recv_init");
  return PMPI_Recv_init(buf, count, datatype, source, tag, comm, request);
}
int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
  const Counted c("MPI_Bcast");
  return PMPI_Bcast(buffer, count, datatype, root, comm);
}
int MPI_Ibcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm,
               MPI_Request *request) {
  const Counted c("MPI_Ibcast");
  return PMPI_Ibcast(buffer, count, datatype, root, comm, request);
}
int MPI_Gather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
               int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm) {
  const Counted c("MPI_Gather");
  return PMPI_Gather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
}
int MPI_Igather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm,
                MPI_Request *request) {
  const Counted c("MPI_Igather");
  return PMPI_Igather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm,
                      request);
}
int MPI_Gatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                const int recvcounts[], const int displs[], MPI_Datatype recvtype, int root,
                MPI_Comm comm) {
  const Counted c("MPI_Gatherv");
  return PMPI_Gatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, root,
                      comm);
}
int MPI_Igatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                 const int recvcounts[], const int displs[], MPI_Datatype recvtype, int root,
                 MPI_Comm comm, MPI_Request *request) {
  const Counted c("MPI_Igatherv");
  return PMPI_Igatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, root,
                       comm, request);
}
int MPI_Scatter(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm) {
  const Counted c("MPI_Scatter");
  return PMPI_Scatter(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
}
int MPI_Iscatter(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                 int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm,
                 MPI_Request *request) {
  const Counted c("MPI_Iscatter");
  return PMPI_Iscatter(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm,
                       request);
}
int MPI_Scatterv(const void *sendbuf, const int sendcounts[], const int displs[],
                 MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype,
                 int root, MPI_Comm comm) {
  const Counted c("MPI_Scatterv");
  return PMPI_Scatterv(sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount, recvtype, root,
                       comm);
}
int MPI_Iscatterv(const void *sendbuf, const int sendcounts[], const int displs[],
                  MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype,
                  int root, MPI_Comm comm, MPI_Request *request) {
  const Counted c("MPI_Iscatterv");
  return PMPI_Iscatterv(sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount, recvtype, root,
                        comm, request);
}
int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  const Counted c("MPI_Allgather");
  return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}
int MPI_Iallgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                   int recvcount, MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request) {
  const Counted c("MPI_Iallgather");
  return PMPI_Iallgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request);
}
int MPI_Allgatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                   const int recvcounts[], const int displs[], MPI_Datatype recvtype,
                   MPI_Comm comm) {
  const Counted c("MPI_Allgatherv");
  return PMPI_Allgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm);
}
int MPI_Iallgatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                    const int recvcounts[], const int displs[], MPI_Datatype recvtype,
                    MPI_Comm comm, MPI_Request *request) {
  const Counted c("MPI_Iallgatherv");
  return PMPI_Iallgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm,
                          request);
}
int MPI_Alltoall(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                 int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  const Counted c("MPI_Alltoall");
  return PMPI_Alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}
int MPI_Ialltoall(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request) {
  const Counted c("MPI_Ialltoall");
  return PMPI_Ialltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request);
}
int MPI_Alltoallv(const void *sendbuf, const int sendcounts[], const int sdispls[],
                  MPI_Datatype sendtype, void *recvbuf, const int recvcounts[], const int rdispls[],
                  MPI_Datatype recvtype, MPI_Comm comm) {
  const Counted c("MPI_Alltoallv");
  return PMPI_Alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls,
                        recvtype, comm);
}
int MPI_Ialltoallv(const void *sendbuf, const int sendcounts[], const int sdispls[],
                   MPI_Datatype sendtype, void *recvbuf, const int recvcounts[],
                   const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm,
                   MPI_Request *request) {
  const Counted c("MPI_Ialltoallv");
  return PMPI_Ialltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls,
                         recvtype, comm, request);
}
int MPI_Alltoallw(const void *sendbuf, const int sendcounts[], const int sdispls[],
                  const MPI_Datatype sendtypes[], void *recvbuf, const int recvcounts[],
                  const int rdispls[], const MPI_Datatype recvtypes[], MPI_Comm comm) {
  const Counted c("MPI_Alltoallw");
  return PMPI_Alltoallw(sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts, rdispls,
                        recvtypes, comm);
}
int MPI_Reduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
               int root, MPI_Comm comm) {
  const Counted c("MPI_Reduce");
  return PMPI_Reduce(sendbuf, recvbuf, count, datatype, op, root, comm);
}
int MPI_Ireduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                int root, MPI_Comm comm, MPI_Request *request) {
  const Counted c("MPI_Ireduce");
  return PMPI_Ireduce(sendbuf, recvbuf, count, datatype, op, root, comm, request);
}
int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                  MPI_Comm comm) {
  const Counted c("MPI_Allreduce");
  return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}
int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                   MPI_Comm comm, MPI_Request *request) {
  const Counted c("MPI_Iallreduce");
  return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
}
int MPI_Reduce_scatter(const void *sendbuf, void *recvbuf, const int recvcounts[],
                       MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  const Counted c("MPI_Reduce_scatter");
  return PMPI_Reduce_scatter(sendbuf, recvbuf, recvcounts, datatype, op, comm);
}
int MPI_Ireduce_scatter(const void *sendbuf, void *recvbuf, const int recvcounts[],
                        MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Request *request) {
  const Counted c("MPI_Ireduce_scatter");
  return PMPI_Ireduce_scatter(sendbuf, recvbuf, recvcounts, datatype, op, comm, request);
}
int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount,
                             MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  const Counted c("MPI_Reduce_scatter_block");
  return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm);
}
int MPI_Ireduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount,
                              MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                              MPI_Request *request) {
  const Counted c("MPI_Ireduce_scatter_block");
  return PMPI_Ireduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm, request);
}
int MPI_Scan(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
             MPI_Comm comm) {
  const Counted c("MPI_Scan");
  return PMPI_Scan(sendbuf, recvbuf, count, datatype, op, comm);
}
int MPI_Exscan(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
               MPI_Comm comm) {
  const Counted c("MPI_Exscan");
  return PMPI_Exscan(sendbuf, recvbuf, count, datatype, op, comm);
}
int MPI_Put(const void *origin_addr, int origin_count, MPI_Datatype origin_datatype,
            int target_rank, MPI_Aint target_disp, int target_count, MPI_Datatype target_datatype,
            MPI_Win win) {
  const Counted c("MPI_Put");
  return PMPI_Put(origin_addr, origin_count, origin_datatype, target_rank, target_disp,
                  target_count, target_datatype, win);
}
int MPI_Get(void *origin_addr, int origin_count, MPI_Datatype origin_datatype, int target_rank,
            MPI_Aint target_disp, int target_count, MPI_Datatype target_datatype, MPI_Win win) {
  const Counted c("MPI_Get");
  return PMPI_Get(origin_addr, origin_count, origin_datatype, target_rank, target_disp,
                  target_count, target_datatype, win);
}
int MPI_Accumulate(const void *origin_addr, int origin_count, MPI_Datatype origin_datatype,
                   int target_rank, MPI_Aint target_disp, int target_count,
                   MPI_Datatype target_datatype, MPI_Op op, MPI_Win win) {
  const Counted c("MPI_Accumulate");
  return PMPI_Accumulate(origin_addr, origin_count, origin_datatype, target_rank, target_disp,
                         target_count, target_datatype, op, win);
}
int MPI_Get_accumulate(const void *origin_addr, int origin_count, MPI_Datatype origin_datatype,
                       void *result_addr, int result_count, MPI_Datatype result_datatype,
                       int target_rank, MPI_Aint target_disp, int target_count,
                       MPI_Datatype target_datatype, MPI_Op op, MPI_Win win) {
  const Counted c("MPI_Get_accumulate");
  return PMPI_Get_accumulate(origin_addr, origin_count, origin_datatype, result_addr, result_count,
                             result_datatype, target_rank, target_disp, target_count,
                             target_datatype, op, win);
}
int MPI_Win_create(void *base, MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm,
                   MPI_Win *win) {
  const Counted c("MPI_Win_create");
  return PMPI_Win_create(base, size, disp_unit, info, comm, win);
}
int MPI_Win_allocate(MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm, void *baseptr,
                     MPI_Win *win) {
  const Counted c("MPI_Win_allocate");
  return PMPI_Win_allocate(size, disp_unit, info, comm, baseptr, win);
}
int MPI_Win_allocate_shared(MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm,
                            void *baseptr, MPI_Win *win) {
  const Counted c("MPI_Win_allocate_shared");
  return PMPI_Win_allocate_shared(size, disp_unit, info, comm, baseptr, win);
}

}  // extern "C"
