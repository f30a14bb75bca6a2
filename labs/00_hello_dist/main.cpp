// Lab 00 driver (not edited by attendees): prints where every rank runs, then checks that an
// all-reduce of the rank ids gives the same, right answer on every rank.
//
//   ./scalelab run 00 -n 4            # your code
//   ./scalelab run 00 --solution -n 4 # the reference
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/log.hpp"
#include "common/runtime.hpp"
#include "hello_dist.hpp"

using namespace scalelab;

namespace {

constexpr int kRowBytes = 256;

std::string host_name() {
  char name[128] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// Rank 0 prints one row per rank: every rank formats its row, rank 0 gathers them.
void print_table(const std::string& my_row) {
  char row[kRowBytes] = {0};
  std::strncpy(row, my_row.c_str(), kRowBytes - 1);
  std::vector<char> rows(world_rank() == 0 ? world_size() * kRowBytes : 0);
  MPI_Gather(row, kRowBytes, MPI_CHAR, rows.data(), kRowBytes, MPI_CHAR, 0, MPI_COMM_WORLD);
  log::info("{:>4} {:>5} {:>4} {:>5}  {:<16} {:<7} {:<7} {}", "rank", "local", "node", "world",
            "host", "device", "backend", "launcher");
  for (int r = 0; r < world_size() && world_rank() == 0; ++r) log::info("{}", &rows[r * kRowBytes]);
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    auto options = cli::make_options("lab00_hello_dist",
                                     "Lab 00: print where every rank runs and all-reduce the rank ids");
    cli::add_run_options(options);
    const auto run = cli::run_options(cli::parse(options, argc, argv));
    // The self backend is a world of one: on more ranks each would sum its own id alone and the
    // check below would compare it with a world of one, an "OK" that says nothing.
    SCALELAB_REQUIRE(run.backend != "self" || world_size() == 1,
                     "--backend self is a world of one rank: run it with -n 1, not -n {}",
                     world_size());
    // The communicator first: a backend this build lacks (nccl without NCCL) is a usage error
    // before the table, not after it.
    auto world = comm::Communicator::world(run.backend);

    const auto env = lab00::process_env();
    const lab00::Placement where = lab00::find_placement(env, MPI_COMM_WORLD);
    // --device sim (the simulated GPU) is the host's memory: this lab places nothing on it
    const std::string device =
        run.device == "sim" ? "sim"
                            : lab00::choose_device(where.local_rank, cuda_device_count(),
                                                   run.device == "cuda");
    SCALELAB_REQUIRE(run.device != "cuda" || device != "cpu",
                     "--device cuda, but this rank sees no GPU (built with CUDA: {})",
                     cuda_compiled() ? "yes" : "no");
    const std::string backend =
        run.backend != "auto" ? run.backend : (device == "cpu" || device == "sim" ? "mpi" : "nccl");

    print_table(fmt::format("{:>4} {:>5} {:>4} {:>5}  {:<16} {:<7} {:<7} {}", world_rank(),
                            where.local_rank, where.node, world_size(), host_name(), device,
                            backend, lab00::detect_launcher(env)));
    log::info("local rank from: {}", where.source);

    // The ids live in a host tensor: on an nccl group it travels over the group's MPI
    // communicator (CUDA tensors would go over NCCL).
    const long long sum = lab00::all_reduce_rank_ids(world);
    const long long expected = lab00::expected_rank_id_sum(world.size());
    int wrong = sum != expected, ranks_wrong = 0;
    MPI_Allreduce(&wrong, &ranks_wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (wrong) log::every_rank("all-reduce of rank ids gave {}, expected {}", sum, expected);
    log::info("all-reduce of rank ids: {} (expected {}) on every rank: {}", sum, expected,
              ranks_wrong == 0 ? "OK" : fmt::format("WRONG on {} rank(s)", ranks_wrong));
    return ranks_wrong == 0 ? kExitOk : kExitFailed;
  });
}
