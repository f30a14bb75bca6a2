#include "common/runtime.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <shared_mutex>
#include <thread>

#include <fmt/format.h>

#include "common/trace.hpp"

namespace scalelab {
namespace {

bool g_initialized = false;
int g_rank = 0;
int g_size = 1;
// A private duplicate of MPI_COMM_WORLD for the exit agreement, so it never matches a message or
// collective of the program's own traffic.
MPI_Comm g_exit_comm = MPI_COMM_NULL;

// Waits up to `seconds` for every rank to enter the same barrier. Returns false on timeout (some
// rank is still working, or stuck): then the caller aborts instead of finalizing.
bool bounded_barrier(double seconds) {
  MPI_Request request;
  MPI_Ibarrier(g_exit_comm, &request);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int done = 0;
  while (!done) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Shared by the background threads' MPI calls (BackgroundMpiCalls), taken whole by exit_all
// before MPI_Finalize and never released. Leaked on purpose: a worker may still wait on it while
// std::exit runs the static destructors.
std::shared_timed_mutex& background_mpi_calls() {
  static auto* calls = new std::shared_timed_mutex;
  return *calls;
}
std::atomic<bool> g_mpi_closing{false};

// Stops the background threads' MPI calls: those under way may take up to `seconds` to end, no
// new one starts. False if one is still under way then (blocked: its peers never answer).
bool close_background_mpi(double seconds) {
  g_mpi_closing = true;  // first, so that a worker's next BackgroundMpiCalls is its last
  return background_mpi_calls().try_lock_for(std::chrono::duration<double>(seconds));
}

}  // namespace

BackgroundMpiCalls::BackgroundMpiCalls() {
  // Once exit_all has closed MPI it holds the lock for good. A worker that comes for it then (a
  // communicator with operations still queued, whose destructor, run by std::exit for a static
  // one, joins its worker) gives up instead of waiting forever.
  while (!background_mpi_calls().try_lock_shared_for(std::chrono::milliseconds(10))) {
    if (g_mpi_closing) {
      open_ = false;
      return;
    }
  }
  held_ = true;
  open_ = !g_mpi_closing;
}

BackgroundMpiCalls::~BackgroundMpiCalls() {
  if (held_) background_mpi_calls().unlock_shared();
}

void init(int* argc, char*** argv) {
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
      std::fprintf(stderr, "error: the MPI library does not provide MPI_THREAD_MULTIPLE\n");
      MPI_Abort(MPI_COMM_WORLD, kExitUsage);
    }
  }
  if (!g_initialized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    MPI_Comm_dup(MPI_COMM_WORLD, &g_exit_comm);
    // Errors in MPI calls come back as codes we check, not as a silent abort inside MPI.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    g_initialized = true;
  }
}

bool initialized() { return g_initialized; }
int world_rank() { return g_rank; }
int world_size() { return g_size; }

void exit_all(int code, const std::string& line) {
  std::fflush(stdout);
  if (!g_initialized) {
    if (!line.empty()) std::fprintf(stderr, "%s\n", line.c_str());
    std::exit(code);
  }
  // Every rank here, and no worker in the middle of an MPI call: MPI can be finalized.
  if (bounded_barrier(5.0) && close_background_mpi(3.0)) {
    if (g_rank == 0 && !line.empty()) std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    MPI_Comm_free(&g_exit_comm);
    MPI_Finalize();
    std::exit(code);
  }
  if (!line.empty()) std::fprintf(stderr, "[rank %d] %s\n", g_rank, line.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);  // not reached
}

namespace {
void (*g_not_implemented_ending)(const std::string&) = nullptr;
}  // namespace

void set_not_implemented_ending(void (*ending)(const std::string& what)) {
  g_not_implemented_ending = ending;
}

void not_implemented_in_destructor(const char* what) {
  if (g_not_implemented_ending != nullptr) g_not_implemented_ending(what);
  exit_all(kExitFailed, fmt::format("not implemented: {}", what));  // as run_main's catch
}

int run_main(int argc, char** argv, const std::function<int(int, char**)>& body) {
  init(&argc, &argv);
  int code = 0;
  try {
    code = body(argc, argv);
    // Issue 4 (comm): with --trace, every rank hands its events to rank 0, which writes the
    // file (collective: every rank's body has returned). Without --trace it does nothing. The
    // last line names the file, so a run says where its trace went.
    const std::string traced = trace::path();
    const std::size_t events = trace::finish();
    if (!traced.empty() && world_rank() == 0) {
      fmt::print("wrote {}: {} events of {} rank{} (open it in ui.perfetto.dev)\n", traced,
                 events, world_size(), world_size() == 1 ? "" : "s");
      std::fflush(stdout);
    }
  } catch (const UsageError& e) {
    exit_all(kExitUsage, fmt::format("error: {}", e.what()));
  } catch (const NotImplemented& e) {
    exit_all(kExitFailed, fmt::format("not implemented: {}", e.what()));
  } catch (const std::exception& e) {
    exit_all(kExitFailed, fmt::format("error: {}", e.what()));
  }
  std::fflush(stdout);
  // The body's communicators are gone, their workers joined; a thread still inside an MPI call
  // now (a communicator kept past the body, a worker in an operation its peers never joined)
  // would crash or hang in MPI_Finalize: the job ends with its line instead, after 3 s.
  if (!close_background_mpi(3.0)) {
    std::fprintf(stderr, "[rank %d] error: the program ended with a background thread still "
                 "inside an MPI call (a communicator alive past the program, in an operation "
                 "its peers never joined?)\n", g_rank);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, kExitFailed);
  }
  MPI_Comm_free(&g_exit_comm);
  MPI_Finalize();
  g_initialized = false;
  return code;
}

}  // namespace scalelab
