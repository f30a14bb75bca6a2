#pragma once
/// @file cli.hpp
/// The command line every scalelab program shares (cxxopts). Each program adds its own options to
/// the ones here; parse() handles --help and turns every parse error into one UsageError line.
#include <cstdint>
#include <string>

#include <cxxopts.hpp>

#include "common/dtype.hpp"

namespace scalelab::cli {

/// Options with --help already added.
cxxopts::Options make_options(const std::string& program, const std::string& description);

/// --seed, --device, --backend, --timeout, --trace, --precision: options every lab program
/// understands. `mixed_precision`: the program can train in bf16 (--precision bf16: fp32 master
/// weights, gradients and AdamW state, a bf16 compute copy and bf16 activations; labs 02-10).
/// Without it --precision bf16 is a usage error naming the program (it trains in fp32 only).
void add_run_options(cxxopts::Options& options, bool mixed_precision = false);

/// The options every program shares (add_run_options): what to run on and how to watch it.
struct RunOptions {
  std::uint64_t seed = 1337;      ///< --seed: the model's initial values and the batches
  std::string device = "cpu";     ///< --device: cpu | cuda | sim
  std::string backend = "auto";   ///< --backend: auto | mpi | nccl | self
  double timeout_s = 60.0;        ///< watchdog: a collective that takes longer ends the job (exit 3)
  std::string trace;              ///< --trace: Chrome trace file, empty for none
  DType precision = DType::f32;   ///< --precision: f32, or bf16 (mixed precision)
  /// True in bf16 mixed precision.
  bool bf16() const { return precision == DType::bf16; }
};

/// Reads (and validates) the options added by add_run_options; --trace must be writable
/// (require_writable: collective when a trace is asked for).
RunOptions run_options(const cxxopts::ParseResult& result);

/// Checks, before any work starts, that the program will be able to write the file `path` at
/// the end: it is not a directory, its directory exists, and a file can be created there (a probe
/// file next to it, removed at once; `path` itself is not created or touched). Otherwise throws
/// UsageError naming `what` (the option, e.g. "--trace") and the path. An empty path is fine (no
/// output). Collective over MPI_COMM_WORLD when MPI is running: rank 0, which writes the outputs,
/// checks and every rank throws the same error (one line, exit 2 on every rank), so call it on
/// every rank with the same arguments. run_options() calls it for --trace; a program calls it for
/// its own outputs (lab 02's --checkpoint).
void require_writable(const std::string& path, const std::string& what);

/// The same check on this process alone (not collective): the error message, or "" when `path`
/// can be written. What require_writable runs on rank 0.
std::string writable_error(const std::string& path, const std::string& what);

/// `bytes` (a size computed in double from what the user gave) as a byte count. Throws UsageError
/// starting with `given` (the option and its text, "--memory 1e300GiB") when it is less than one
/// byte (it would round to 0) or more than a 64-bit byte count holds (a cast would wrap it), with
/// `hint` after the reason. A size is not negative or zero: check that first, in its own words.
std::size_t bytes_in_range(const std::string& given, double bytes, const std::string& hint = "");

/// A size given in MiB (a double, as --bucket-mb 0.25 takes it) in bytes: above 0, and in range
/// (bytes_in_range), else UsageError naming `option`.
std::size_t mib_to_bytes(const std::string& option, double mib);

/// Parses argv. --help prints the help on rank 0 and exits 0 on every rank; an unknown option, a
/// malformed value or a stray argument throws UsageError (exit 2 on every rank).
cxxopts::ParseResult parse(cxxopts::Options& options, int argc, char** argv);

}  // namespace scalelab::cli
