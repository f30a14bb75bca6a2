// A program that hangs on purpose, for the watchdog tests (tests/common/comm.cmake runs it under
// mpiexec through expect_exit.cmake and checks the exit code and the report).
//   --mode skip        rank 2 skips an all_reduce the others enter, and waits in the barrier
//                      after it (3 ranks): a mismatch MPI cannot complete
//   --mode skip-next   rank 1 skips the first all_reduce and enters the next one of the same kind
//                      (2 ranks): MPI matches that with the others' first one, and the hang shows
//                      one collective later, where rank 0 waits alone
//   --mode mismatch    rank 1 passes a different size, with the matching check on: exit 1
//   --mode ok          everyone does the same: exit 0
//   --mode loop        4 ranks as a 2 x 2 grid train forever (a few ms of compute, an all-reduce
//                      in their row, a 1 MiB send down their column, an all-reduce of the world),
//                      each printing "rank R pid P" first: tests/common/watchdog_stop.py stops
//                      one rank with SIGSTOP and checks that the report leads with it
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "common/cli.hpp"
#include "common/comm/communicator.hpp"
#include "common/log.hpp"
#include "common/runtime.hpp"
#include "common/watchdog.hpp"

using namespace scalelab;

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    auto options = cli::make_options("watchdog_hang", "hangs on purpose (watchdog tests)");
    cli::add_run_options(options);
    options.add_options()("mode", "skip, skip-next, mismatch, ok or loop",
                          cxxopts::value<std::string>()->default_value("ok"));
    auto args = cli::parse(options, argc, argv);
    auto run = cli::run_options(args);
    const std::string mode = args["mode"].as<std::string>();
    watchdog::start(run.timeout_s);
    comm::set_check_matching(mode == "mismatch");
    auto world = comm::Communicator::world("mpi");
    const int r = world.rank();
    Tensor x = Tensor::zeros({1 << 20});  // 4 MiB

    if (mode == "skip") {
      SCALELAB_REQUIRE(world.size() == 3, "--mode skip needs 3 ranks");
      if (r != 2) world.all_reduce(x);
      world.barrier();
    } else if (mode == "skip-next") {
      SCALELAB_REQUIRE(world.size() == 2, "--mode skip-next needs 2 ranks");
      world.all_reduce(x);
      if (r == 0) world.all_reduce(x);
    } else if (mode == "loop") {
      SCALELAB_REQUIRE(world.size() == 4, "--mode loop needs 4 ranks");
      // rows {0,1} {2,3} (like tp groups), columns {0,2} {1,3} (like pipelines: the first row
      // sends to the second), so a stopped rank leaves some peers waiting for it directly and
      // others through a chain.
      comm::Communicator row = world.split(r / 2, r, fmt::format("row{}", r / 2));
      comm::Communicator col = world.split(r % 2, r, fmt::format("col{}", r % 2));
      Tensor small = Tensor::zeros({4});
      Tensor message = Tensor::zeros({1 << 18});  // 1 MiB: large enough that a send waits
      std::printf("rank %d pid %ld\n", r, static_cast<long>(::getpid()));
      std::fflush(stdout);
      for (;;) {
        const auto busy = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
        while (std::chrono::steady_clock::now() < busy) {
        }  // "compute"
        row.all_reduce(small);
        if (col.rank() == 0) col.send(message, 1);
        else col.recv(message, 0);
        world.all_reduce(small);
      }
    } else if (mode == "mismatch") {
      world.all_reduce(r == 1 ? Tensor::zeros({3}) : Tensor::zeros({2}));
    } else {
      world.all_reduce(x);
      world.barrier();
    }
    log::info("done");
    return 0;
  });
}
