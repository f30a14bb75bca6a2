#pragma once
// The command line every scalelab program shares (cxxopts). Each program adds its own options to
// the ones here; parse() handles --help and turns every parse error into one UsageError line.
#include <cstdint>
#include <string>

#include <cxxopts.hpp>

namespace scalelab::cli {

/// Options with --help already added.
cxxopts::Options make_options(const std::string& program, const std::string& description);

/// --seed, --device, --backend, --timeout, --trace: options every lab program understands.
void add_run_options(cxxopts::Options& options);

struct RunOptions {
  std::uint64_t seed = 1337;
  std::string device = "cpu";     // cpu | cuda
  std::string backend = "auto";   // auto | mpi | nccl | self
  double timeout_s = 60.0;        // watchdog: a collective that takes longer ends the job (exit 3)
  std::string trace;              // Chrome trace file, empty for none
};

/// Reads (and validates) the options added by add_run_options.
RunOptions run_options(const cxxopts::ParseResult& result);

/// Parses argv. --help prints the help on rank 0 and exits 0 on every rank; an unknown option, a
/// malformed value or a stray argument throws UsageError (exit 2 on every rank).
cxxopts::ParseResult parse(cxxopts::Options& options, int argc, char** argv);

}  // namespace scalelab::cli
