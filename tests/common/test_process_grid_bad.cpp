// A program that builds a process grid from its options, for tests/common/comm.cmake: a grid
// that does not fit the world, or an unknown order, must end every rank with exit 2 and one
// "error: ..." line naming the numbers (run_main turns the UsageError into that).
//   test_process_grid_bad --dp 3 --tp 1 --pp 1 --order megatron    (on 2 ranks: exit 2)
#include <fmt/format.h>

#include "common/cli.hpp"
#include "common/comm/process_grid.hpp"
#include "common/runtime.hpp"

using namespace scalelab;

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    auto options = cli::make_options("test_process_grid_bad", "builds a process grid");
    options.add_options()("dp", "data parallel size", cxxopts::value<int>()->default_value("1"))(
        "tp", "tensor parallel size", cxxopts::value<int>()->default_value("1"))(
        "pp", "pipeline parallel size", cxxopts::value<int>()->default_value("1"))(
        "order", "megatron or picotron", cxxopts::value<std::string>()->default_value("megatron"));
    auto args = cli::parse(options, argc, argv);
    const comm::GridOrder order = comm::parse_grid_order(args["order"].as<std::string>());
    auto world = comm::Communicator::world("mpi");
    comm::ProcessGrid grid(world, args["dp"].as<int>(), args["tp"].as<int>(),
                           args["pp"].as<int>(), order);
    if (world.rank() == 0) fmt::print("{}", grid.table());
    return 0;
  });
}
