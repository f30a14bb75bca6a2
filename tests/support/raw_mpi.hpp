#pragma once
/// @file raw_mpi.hpp
/// MPI calls that move data made by the rank's own threads (rank_threads.hpp) and not by the
/// library's Communicator, through MPI's profiling interface: the test binaries define
/// MPI_Send, MPI_Allgather, MPI_Put, MPI_Win_allocate_shared and the other point-to-point,
/// collective and one-sided calls (raw_mpi.cpp), count each and forward it to its PMPI_ twin.
/// A Communicator's operations run on its worker thread, a background thread, and are never
/// counted; the few raw calls of the test harness itself (the test main's verdicts, the
/// fixture's message exchange) are made inside a LibraryMpi scope. labtest::traffic_of adds
/// what it counted to the ledger it returns, so every exact traffic budget fails a step that
/// moves data with raw MPI (e.g. full logits gathered with MPI_Allgather into a static array).

#include <cstdint>
#include <string>

namespace scalelab::labtest {

/// Raw MPI calls counted since the start: how many, and the name of the last one.
struct RawMpi {
  int64_t calls = 0;
  std::string last;  ///< "MPI_Allgather"; empty when none
};
RawMpi raw_mpi();

/// While one lives on a thread, that thread's MPI calls are the harness's, not counted.
class LibraryMpi {
 public:
  LibraryMpi() noexcept;
  ~LibraryMpi();
  LibraryMpi(const LibraryMpi&) = delete;
  LibraryMpi& operator=(const LibraryMpi&) = delete;
};

}  // namespace scalelab::labtest
