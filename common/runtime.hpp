#pragma once
/// @file runtime.hpp
/// Process start-up and shutdown shared by every scalelab program and test.
///
///     int main(int argc, char** argv) {
///       return scalelab::run_main(argc, argv, [](int argc, char** argv) { ...; return 0; });
///     }
///
/// run_main initialises MPI (MPI_THREAD_MULTIPLE: the mpi backend progresses collectives on a
/// worker thread), turns the errors of common/errors.hpp into the project's exit codes
/// (errors.hpp), and makes sure a failure ends *every* rank: a rank never waits forever for a
/// peer that has given up.
#include <functional>
#include <string>

#include <mpi.h>

#include "common/errors.hpp"

namespace scalelab {

/// Initialises MPI once (idempotent). Works with or without a launcher (singleton MPI).
void init(int* argc, char*** argv);

/// True between init() and shutdown.
bool initialized();

/// This process's rank in MPI_COMM_WORLD (0 before init).
int world_rank();

/// Number of processes in MPI_COMM_WORLD (1 before init).
int world_size();

/// Ends this process with `code` and makes sure every rank ends. If all ranks reach exit_all
/// within a few seconds (a deterministic error, e.g. a bad config every rank validated), they
/// finalize cleanly, rank 0 prints `line` once, and all exit with `code`. Otherwise this rank
/// prints `line` prefixed with its rank and aborts the job with `code`.
[[noreturn]] void exit_all(int code, const std::string& line = "");

/// The MPI calls a thread beside the main one makes (a communicator's worker), held open for
/// their duration: exit_all finalizes MPI only once none is under way, and from then on open()
/// is false and the thread must make no MPI call again. Without it exit_all, called while a
/// worker is still busy (a test that stops a ring mid-way), could finalize MPI under a worker's
/// next send, and the rank would crash instead of exiting with its verdict. A worker blocked in
/// a call (a collective its peers never join) keeps exit_all (and run_main's normal end) from
/// finalizing: they abort instead. A worker that comes once exit_all has closed MPI gets open()
/// false at once (a static communicator's destructor, run by std::exit, joins its worker).
class BackgroundMpiCalls {
 public:
  BackgroundMpiCalls();
  ~BackgroundMpiCalls();
  BackgroundMpiCalls(const BackgroundMpiCalls&) = delete;
  BackgroundMpiCalls& operator=(const BackgroundMpiCalls&) = delete;
  /// False once exit_all is finalizing MPI: make no MPI call, end the thread.
  bool open() const { return open_; }

 private:
  bool open_ = false;
  bool held_ = false;  // the shared lock is this object's to release
};

/// A starter's unwritten step inside a destructor (tools/make-labs writes it there instead of
/// `throw NotImplemented`: a destructor is noexcept, a throw would end in std::terminate): ends
/// every rank as a NotImplemented thrown from the step would, exit code 1: in a program as
/// run_main does ("not implemented: <what>"), in a test binary with the test main's verdict
/// (set_not_implemented_ending).
[[noreturn]] void not_implemented_in_destructor(const char* what);
/// How not_implemented_in_destructor ends the job: the test main installs its own (the verdict
/// line "[scalelab] verdict: not implemented: <what>", kept as its other verdicts are); a
/// program keeps run_main's.
void set_not_implemented_ending(void (*ending)(const std::string& what));

/// Runs `body` on every rank with errors mapped to exit codes: UsageError -> "error: ..." and 2,
/// NotImplemented -> "not implemented: ..." and 1, any other exception -> "error: ..." and 1.
/// After the body it finalizes MPI as exit_all does, only once no BackgroundMpiCalls is open: a
/// thread still inside one 3 s later aborts the job with this rank's line (exit 1).
int run_main(int argc, char** argv, const std::function<int(int, char**)>& body);

}  // namespace scalelab
