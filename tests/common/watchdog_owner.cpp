// A process that owns a watchdog run directory and then sleeps, for the clean-up tests of
// tests/common/test_watchdog.cpp (which SIGKILL it). No MPI: a singleton's watchdog needs none.
//   watchdog_owner SECONDS    starts the watchdog (its run directory under SCALELAB_RUN_DIR),
//                             sleeps, then ends normally (removing its directory)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "common/watchdog.hpp"

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.0;
  scalelab::watchdog::start(60.0);
  std::printf("%s\n", scalelab::watchdog::run_dir().c_str());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return 0;  // the watchdog's atexit handler removes this process's files and the directory
}
