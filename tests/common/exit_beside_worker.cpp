// exit_all while a communicator's worker thread is still busy with MPI (tests/common/comm.cmake
// runs it under mpiexec through expect_exit.cmake and checks the exit code and the line):
//   --mode receiving   every rank posts a receive nobody sends, so its worker polls MPI without
//                      pause, then calls exit_all(1): every rank must exit 1 with the line, not
//                      crash in a worker's MPI call after MPI_Finalize (as a test that stopped a
//                      ring mid-way once did)
//   --mode stuck       a thread of this rank holds its MPI calls open and never returns (a worker
//                      blocked in a collective its peers never join): exit_all must not finalize
//                      under it, nor wait for it forever, but abort the job with the line
//   --mode returns     the same thread, and the program's body returns 0: run_main must not
//                      finalize under it either (nor exit 0), but abort with its line
//   --mode static      as receiving, on a communicator in static storage (as the test main's
//                      world): std::exit destroys it after exit_all closed MPI, and its worker,
//                      which still has the receive to poll, must give up rather than wait for
//                      MPI forever (the job hung, e.g. a grader that threw with buckets in flight)
#include <chrono>
#include <thread>

#include "common/cli.hpp"
#include "common/comm/communicator.hpp"
#include "common/runtime.hpp"

using namespace scalelab;

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) -> int {
    auto options = cli::make_options("exit_beside_worker", "exit_all beside a busy MPI thread");
    options.add_options()("mode", "receiving, static, stuck or returns",
                          cxxopts::value<std::string>()->default_value("receiving"));
    auto args = cli::parse(options, argc, argv);
    const std::string mode = args["mode"].as<std::string>();
    auto world = comm::Communicator::world("mpi");
    if (mode == "receiving") {
      Tensor never = Tensor::zeros({1 << 16});
      comm::Work w = world.recv_async(never, (world.rank() + 1) % world.size(), /*tag=*/999);
      // the worker is polling the receive by now; give it time to be deep in its loop
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      exit_all(kExitFailed, "stopped while receiving");
    }
    if (mode == "static") {
      static comm::Communicator kept = comm::Communicator::world("mpi");
      static Tensor never = Tensor::zeros({1 << 16});
      comm::Work w = kept.recv_async(never, (kept.rank() + 1) % kept.size(), /*tag=*/998);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      exit_all(kExitFailed, "stopped beside a static communicator's pending receive");
    }
    if (mode == "stuck" || mode == "returns") {
      std::thread([] {
        const BackgroundMpiCalls calls;
        while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
      }).detach();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (mode == "returns") return kExitOk;
      exit_all(kExitFailed, "stopped while a thread was stuck in MPI");
    }
    throw UsageError("--mode must be receiving, static, stuck or returns, got '" + mode + "'");
  });
}
