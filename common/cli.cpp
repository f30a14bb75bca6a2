#include "common/cli.hpp"

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/runtime.hpp"
#include "common/trace.hpp"
#include "common/watchdog.hpp"

namespace scalelab::cli {

cxxopts::Options make_options(const std::string& program, const std::string& description) {
  cxxopts::Options options(program, description);
  options.add_options()("h,help", "print this help and exit");
  return options;
}

void add_run_options(cxxopts::Options& options) {
  RunOptions d;
  options.add_options("run")
      ("seed", "random seed (same seed, same run)", cxxopts::value<std::uint64_t>()->default_value(std::to_string(d.seed)))
      ("device", "cpu or cuda", cxxopts::value<std::string>()->default_value(d.device))
      ("backend", "communication backend: auto, mpi, nccl or self", cxxopts::value<std::string>()->default_value(d.backend))
      ("timeout", "seconds a collective may take before the watchdog ends the job (exit 3)", cxxopts::value<double>()->default_value("60"))
      ("trace", "write a Chrome trace (open in Perfetto) to this file", cxxopts::value<std::string>()->default_value(""));
}

RunOptions run_options(const cxxopts::ParseResult& r) {
  RunOptions o;
  o.seed = r["seed"].as<std::uint64_t>();
  o.device = r["device"].as<std::string>();
  o.backend = r["backend"].as<std::string>();
  o.timeout_s = r["timeout"].as<double>();
  o.trace = r["trace"].as<std::string>();
  SCALELAB_REQUIRE(o.device == "cpu" || o.device == "cuda",
                   "--device must be cpu or cuda, got '{}'", o.device);
  SCALELAB_REQUIRE(o.backend == "auto" || o.backend == "mpi" || o.backend == "nccl" ||
                       o.backend == "self",
                   "--backend must be auto, mpi, nccl or self, got '{}'", o.backend);
  SCALELAB_REQUIRE(o.timeout_s > 0, "--timeout must be positive, got {}", o.timeout_s);
  // Issue 4 (comm): communicators start the watchdog with --timeout; --trace starts recording,
  // and run_main writes the merged trace when the program's body returns.
  watchdog::set_timeout(o.timeout_s);
  if (!o.trace.empty()) trace::enable(o.trace);
  return o;
}

cxxopts::ParseResult parse(cxxopts::Options& options, int argc, char** argv) {
  cxxopts::ParseResult result;
  try {
    result = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(fmt::format("{} (see --help)", e.what()));
  }
  if (result.count("help")) {
    log::info("{}", options.help());
    exit_all(kExitOk);
  }
  if (!result.unmatched().empty())
    throw UsageError(fmt::format("unexpected argument '{}' (see --help)", result.unmatched()[0]));
  return result;
}

}  // namespace scalelab::cli
