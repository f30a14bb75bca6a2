// Start-up and command line: what every program relies on.
#include <gtest/gtest.h>

#include "common/cli.hpp"
#include "common/errors.hpp"
#include "common/runtime.hpp"

using namespace scalelab;

TEST(Runtime, RankAndSizeMatchMpi) {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(world_rank(), rank);
  EXPECT_EQ(world_size(), size);
  EXPECT_TRUE(initialized());
}

namespace {
cxxopts::ParseResult parse_args(cxxopts::Options& options, std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return cli::parse(options, static_cast<int>(argv.size()), argv.data());
}
}  // namespace

TEST(Cli, ParsesRunOptions) {
  auto options = cli::make_options("prog", "test");
  cli::add_run_options(options);
  auto r = parse_args(options, {"prog", "--seed", "7", "--device", "cpu", "--timeout", "5"});
  auto o = cli::run_options(r);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.device, "cpu");
  EXPECT_DOUBLE_EQ(o.timeout_s, 5.0);
}

TEST(Cli, BadInputIsAUsageError) {
  auto options = cli::make_options("prog", "test");
  cli::add_run_options(options);
  EXPECT_THROW(parse_args(options, {"prog", "--no-such-option"}), UsageError);
  EXPECT_THROW(parse_args(options, {"prog", "--seed", "abc"}), UsageError);
  EXPECT_THROW(parse_args(options, {"prog", "stray"}), UsageError);
  EXPECT_THROW(cli::run_options(parse_args(options, {"prog", "--device", "tpu"})), UsageError);
  EXPECT_THROW(cli::run_options(parse_args(options, {"prog", "--timeout", "0"})), UsageError);
}

TEST(Errors, CheckNamesFileAndLine) {
  try {
    SCALELAB_CHECK(1 + 1 == 3, "arithmetic is {}", "broken");
    FAIL() << "no throw";
  } catch (const CheckFailed& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("test_runtime.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("arithmetic is broken"), std::string::npos) << what;
  }
}
