#include "common/cli.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <typeinfo>
#include <vector>

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

namespace {
// What the program declared in add_run_options, for run_options' --precision check.
bool g_mixed_precision = false;
std::string g_program;
}  // namespace

void add_run_options(cxxopts::Options& options, bool mixed_precision) {
  g_mixed_precision = mixed_precision;
  g_program = options.program();
  RunOptions d;
  options.add_options("run")
      ("seed", "random seed (same seed, same run)", cxxopts::value<std::uint64_t>()->default_value(std::to_string(d.seed)))
      ("device", "cpu, cuda, or sim: the CPU as a GPU whose memory host code cannot read (checks a program is device-generic without a GPU)", cxxopts::value<std::string>()->default_value(d.device))
      ("backend", "communication backend: auto, mpi, nccl or self", cxxopts::value<std::string>()->default_value(d.backend))
      ("timeout", "seconds a collective may take before the watchdog ends the job (exit 3)", cxxopts::value<double>()->default_value("60"))
      ("trace", "write a Chrome trace (open in Perfetto) to this file", cxxopts::value<std::string>()->default_value(""))
      ("precision", mixed_precision ? "fp32, or bf16: mixed precision (fp32 master weights, gradients and AdamW state; bf16 weight copy and activations)"
                                    : "fp32 (this program has no bf16 mode)", cxxopts::value<std::string>()->default_value("fp32"));
}

RunOptions run_options(const cxxopts::ParseResult& r) {
  RunOptions o;
  o.seed = r["seed"].as<std::uint64_t>();
  o.device = r["device"].as<std::string>();
  o.backend = r["backend"].as<std::string>();
  o.timeout_s = r["timeout"].as<double>();
  o.trace = r["trace"].as<std::string>();
  SCALELAB_REQUIRE(o.device == "cpu" || o.device == "cuda" || o.device == "sim",
                   "--device must be cpu, cuda or sim, got '{}'", o.device);
  SCALELAB_REQUIRE(o.backend == "auto" || o.backend == "mpi" || o.backend == "nccl" ||
                       o.backend == "self",
                   "--backend must be auto, mpi, nccl or self, got '{}'", o.backend);
  SCALELAB_REQUIRE(o.timeout_s >= watchdog::kPeriod, "--timeout {}: at least {} seconds (the "
                   "watchdog looks every {} s)", o.timeout_s, watchdog::kPeriod, watchdog::kPeriod);
  const std::string precision = r["precision"].as<std::string>();
  SCALELAB_REQUIRE(precision == "fp32" || precision == "bf16",
                   "--precision must be fp32 or bf16, got '{}'", precision);
  SCALELAB_REQUIRE(precision == "fp32" || g_mixed_precision,
                   "--precision bf16: {} has no mixed-precision mode (labs 02-12 train in bf16; "
                   "this program's collectives and checks run in fp32)", g_program);
  o.precision = precision == "bf16" ? DType::bf16 : DType::f32;
  // Issue 4 (comm): communicators start the watchdog with --timeout; --trace starts recording,
  // and run_main writes the merged trace when the program's body returns.
  watchdog::set_timeout(o.timeout_s);
  // Issue 9: an unwritable --trace is a usage error now, not after the whole run.
  require_writable(o.trace, "--trace");
  if (!o.trace.empty()) trace::enable(o.trace);
  return o;
}

std::string writable_error(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  if (path.empty()) return "";
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec))
    return fmt::format("{} {} is a directory: give a file name (e.g. {}/out)", what, path, path);
  if (path.back() == '/')
    return fmt::format("{} {} ends with '/': give a file name", what, path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (!fs::exists(dir, ec))
    return fmt::format("{} {}: the directory {} does not exist (create it first)", what, path,
                       dir.string());
  if (!fs::is_directory(dir, ec))
    return fmt::format("{} {}: {} is not a directory", what, path, dir.string());
  if (fs::exists(p, ec) && !fs::is_regular_file(p, ec))
    return fmt::format("{} {} exists and is not a regular file", what, path);
  // Create a probe file beside it: the real test of permissions (also for root, read-only
  // filesystems and full quotas), without touching `path`.
  const fs::path probe =
      dir / fmt::format(".{}.writable-probe.{}", p.filename().string(), ::getpid());
  {
    std::ofstream f(probe, std::ios::binary | std::ios::trunc);
    if (!f) {
      const int err = errno;
      return fmt::format("{} {}: cannot create a file in {} ({})", what, path, dir.string(),
                         std::strerror(err));
    }
  }
  fs::remove(probe, ec);
  if (fs::exists(p, ec) && ::access(p.c_str(), W_OK) != 0) {
    const int err = errno;
    return fmt::format("{} {}: cannot write it ({})", what, path, std::strerror(err));
  }
  return "";
}

std::size_t bytes_in_range(const std::string& given, double bytes, const std::string& hint) {
  const std::string more = hint.empty() ? "" : "; " + hint;
  SCALELAB_REQUIRE(bytes >= 1, "{}: less than one byte{}", given, more);
  constexpr double kMaxBytes = 18446744073709551615.0;  // 2^64: the largest size_t, rounded up
  SCALELAB_REQUIRE(bytes < kMaxBytes, "{}: more than a 64-bit byte count holds (16 EiB){}", given,
                   more);
  return static_cast<std::size_t>(bytes);
}

std::size_t mib_to_bytes(const std::string& option, double mib) {
  constexpr double kMiB = 1024.0 * 1024.0;
  SCALELAB_REQUIRE(mib > 0, "{} {:g}: a size must be positive (MiB, e.g. 0.25)", option, mib);
  return bytes_in_range(fmt::format("{} {:g}", option, mib), mib * kMiB,
                        fmt::format("the size is MiB: a byte is {:.3g}", 1 / kMiB));
}

void require_writable(const std::string& path, const std::string& what) {
  if (path.empty()) return;  // no output (the same on every rank: no collective)
  std::string error;
  int initialized = 0;
  MPI_Initialized(&initialized);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!initialized || finalized || world_size() == 1) {
    error = writable_error(path, what);
  } else {
    // rank 0 checks (it writes the outputs); every rank gets its verdict
    if (world_rank() == 0) error = writable_error(path, what);
    int n = static_cast<int>(error.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    error.resize(static_cast<std::size_t>(n));
    if (n > 0) MPI_Bcast(error.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  }
  if (!error.empty()) throw UsageError(error);
}

namespace {

// The option whose value is `text` on the command line, and that value: "--lr" for "--lr nan" or
// "--lr=nan"; for a list option, whose value cxxopts splits at commas and reports one element of,
// "--sweep" with "1,abc" for "--sweep 1,abc" and the text "abc". Empty when none is found.
struct OptionValue {
  std::string option, value;
};
OptionValue option_with_value(int argc, char** argv, const std::string& text) {
  const auto holds = [&](const std::string& value, bool element) {
    if (!element) return value == text;
    std::size_t from = 0;
    for (std::size_t comma = value.find(','); comma != std::string::npos;
         from = comma + 1, comma = value.find(',', from))
      if (value.substr(from, comma - from) == text) return true;
    return from > 0 && value.substr(from) == text;  // the last element of a list
  };
  for (bool element : {false, true}) {  // the whole value first, then one element of a list
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg.rfind("-", 0) != 0) continue;
      const std::size_t eq = arg.find('=');
      if (eq != std::string::npos && holds(arg.substr(eq + 1), element))
        return {arg.substr(0, eq), arg.substr(eq + 1)};
      if (eq == std::string::npos && i + 1 < argc && holds(argv[i + 1], element))
        return {arg, argv[i + 1]};
    }
  }
  return {};
}

// Whether `option` takes `probe` as its value: cxxopts parses it again alone (each parse fills a
// new ParseResult, and no program binds options to variables). "--name=value": an option with
// an implicit value (a flag) would take a separate word as a stray argument instead.
bool accepts(cxxopts::Options& options, const std::string& option, const std::string& probe) {
  const bool long_name = option.rfind("--", 0) == 0;
  const std::string joined = option + "=" + probe;
  const char* args[] = {"probe", long_name ? joined.c_str() : option.c_str(), probe.c_str()};
  try {
    return options.parse(long_name ? 2 : 3, args).unmatched().empty();
  } catch (const cxxopts::exceptions::exception&) {
    return false;
  }
}

// A flag: an option that takes true or false, and not a number.
bool is_flag(cxxopts::Options& options, const std::string& option) {
  return accepts(options, option, "true") && !accepts(options, option, "1.5");
}

// Whether `option` takes a list (std::vector<T>: cxxopts splits its value at commas): a scalar
// double takes "1,2" too (its stream stops at the comma), so ask the parsed value's type.
bool is_list(cxxopts::Options& options, const std::string& option) {
  const bool long_name = option.rfind("--", 0) == 0;
  const std::string joined = option + "=1";
  const char* args[] = {"probe", long_name ? joined.c_str() : option.c_str(), "1"};
  try {
    const cxxopts::ParseResult r = options.parse(long_name ? 2 : 3, args);
    const cxxopts::OptionValue& v = r[option.substr(option.find_first_not_of('-'))];
    const auto holds = [&](auto list) {
      try {
        list = v.as<decltype(list)>();
        return true;
      } catch (const std::bad_cast&) {
        return false;
      }
    };
    return holds(std::vector<double>{}) || holds(std::vector<float>{}) ||
           holds(std::vector<int>{}) || holds(std::vector<std::int64_t>{}) ||
           holds(std::vector<std::uint64_t>{});
  } catch (const std::exception&) {
    return false;
  }
}

// cxxopts says only "Argument 'X' failed to parse". Which kind of value the option takes is not
// visible from outside cxxopts, so ask it (accepts) with a few probe values and read the kind and
// its range off which ones it takes. The error then names the option and what it accepts. A list
// option's `value` ("--sweep 1,abc") is named whole, with `text`, the element that failed.
std::string describe_bad_value(cxxopts::Options& options, const std::string& option,
                               const std::string& value, const std::string& text) {
  const auto accepts = [&](const std::string& probe) { return cli::accepts(options, option, probe); };
  const bool list = is_list(options, option);
  const std::string given = fmt::format("{} {}:", option, value);
  const std::string element = value != text ? fmt::format(" ('{}' is not one)", text) : "";
  if (accepts("1.5"))  // a floating-point option: cxxopts reads it with a stream, which takes
                       // neither nan nor inf nor a value beyond the double range
    return list ? fmt::format("{} expected finite numbers separated by commas, such as "
                              "0.25,1,4{}", given, element)
                : fmt::format("{} expected a finite number such as 0.5 or 3e-4", given);
  if (accepts("true")) return fmt::format("{} expected true or false", given);
  const bool is_signed = accepts("-1");
  // The type's range explains a number in digits beyond it ("3000000000", "-1" for a count); for
  // anything else ("two", "1e21", "2.5") it is noise: "-2147483648 to 2147483647" says nothing
  // about what to type. Only the sign is worth saying then.
  const std::size_t from = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
  if (from == text.size() || text.find_first_not_of("0123456789", from) != std::string::npos) {
    const char* sign = is_signed ? "" : " of 0 or more";
    return list ? fmt::format("{} expected whole numbers{} in digits, separated by commas{}",
                              given, sign, element)
                : fmt::format("{} expected a whole number{}, in digits", given, sign);
  }
  const bool wide = accepts(is_signed ? "2147483648" : "4294967296");  // 64-bit, or 32-bit
  const std::string range =
      is_signed ? (wide ? fmt::format("{} to {}", std::numeric_limits<std::int64_t>::min(),
                                      std::numeric_limits<std::int64_t>::max())
                        : fmt::format("{} to {}", std::numeric_limits<std::int32_t>::min(),
                                      std::numeric_limits<std::int32_t>::max()))
                : (wide ? fmt::format("0 to {}", std::numeric_limits<std::uint64_t>::max())
                        : fmt::format("0 to {}", std::numeric_limits<std::uint32_t>::max()));
  return list ? fmt::format("{} expected whole numbers from {}, separated by commas{}", given,
                            range, element)
              : fmt::format("{} expected a whole number from {}", given, range);
}

}  // namespace

cxxopts::ParseResult parse(cxxopts::Options& options, int argc, char** argv) {
  cxxopts::ParseResult result;
  try {
    result = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
    // "Argument 'X' failed to parse": name the option and what it takes
    const std::string what = e.what();
    const std::size_t open = what.find(cxxopts::LQUOTE);
    const std::size_t close = what.rfind(cxxopts::RQUOTE);
    const std::size_t from = open + cxxopts::LQUOTE.size();
    const std::string text = open != std::string::npos && close != std::string::npos && close >= from
                                 ? what.substr(from, close - from)
                                 : "";
    const OptionValue given = option_with_value(argc, argv, text);
    if (given.option.empty()) throw UsageError(fmt::format("{} (see --help)", what));
    throw UsageError(fmt::format("{} (see --help)",
                                 describe_bad_value(options, given.option, given.value, text)));
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(fmt::format("{} (see --help)", e.what()));
  }
  if (result.count("help")) {
    log::info("{}", options.help());
    exit_all(kExitOk);
  }
  if (!result.unmatched().empty()) {
    // "--table false": a flag does not take the next word as its value
    const std::string stray = result.unmatched()[0];
    for (int i = 2; i < argc; ++i)
      if (argv[i] == stray && std::string(argv[i - 1]).rfind("--", 0) == 0 &&
          std::string(argv[i - 1]).find('=') == std::string::npos && is_flag(options, argv[i - 1]))
        throw UsageError(fmt::format("unexpected argument '{}' after the flag {}: a flag takes "
                                     "no value, or one joined to it: {}=true or {}=false (see "
                                     "--help)", stray, argv[i - 1], argv[i - 1], argv[i - 1]));
    throw UsageError(fmt::format("unexpected argument '{}' (see --help)", stray));
  }
  return result;
}

}  // namespace scalelab::cli
