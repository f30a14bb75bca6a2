#include "common/train/sizing.hpp"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <vector>

#include <mpi.h>

#include "common/errors.hpp"
#include "common/metrics.hpp"
#include "common/runtime.hpp"

namespace scalelab::train {

std::size_t step_bytes_at_least(const ModelConfig& c, const StepShape& s, DType precision) {
  // In double: a --batch of a billion rows must give a huge number, not a wrapped-around one.
  const double T = static_cast<double>(c.block_size), C = static_cast<double>(c.n_embd);
  const double V = static_cast<double>(c.vocab_size), tp = std::max(1, s.tp);
  const double act = precision == DType::bf16 ? 2.0 : 4.0;
  const double tokens = static_cast<double>(s.rows) * T;  // of one forward
  const double heads = static_cast<double>(c.n_head) / tp;
  const double kept = 2.0 * 4.0 * C / tp + (s.attention_probabilities ? heads * T : 0.0);
  const double per_block = tokens * (C + (s.checkpoint ? 0.0 : kept));
  const double head = s.head ? tokens * V / tp : 0.0;
  const double activations =
      std::max(1, s.in_flight) * act * (static_cast<double>(s.layers) * per_block + head);
  const double batch = 2.0 * 4.0 * static_cast<double>(s.global_batch) * T;  // x, y as int32
  const double total = batch + activations;
  const double most = static_cast<double>(std::numeric_limits<std::size_t>::max());
  return total >= most ? std::numeric_limits<std::size_t>::max()
                       : static_cast<std::size_t>(total);
}

namespace {

// The first number of `path` (a /proc or /sys file), or 0 when it has none ("max": no limit).
std::size_t read_number(const std::string& path) {
  std::ifstream f(path);
  unsigned long long v = 0;
  return f >> v ? static_cast<std::size_t>(v) : 0;
}

// What the node has left: MemAvailable (what the kernel can give without swapping), or less when
// this process's cgroup (a container, a SLURM job) leaves less under its limit (v2, then v1).
std::size_t node_available_bytes() {
  std::size_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  unsigned long long kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") available = static_cast<std::size_t>(kib) * 1024;
  if (available == 0)  // no /proc/meminfo: the free pages
    available = static_cast<std::size_t>(::sysconf(_SC_AVPHYS_PAGES)) *
                static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (const auto& [limit, usage] :
       {std::pair<std::string, std::string>{"/sys/fs/cgroup/memory.max",
                                            "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const std::size_t max = read_number(limit);
    if (max == 0) continue;
    const std::size_t used = read_number(usage);
    available = std::min(available, max > used ? max - used : 0);
  }
  return available;
}

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

std::string bytes_text(std::size_t bytes) {
  return fmt::format("{} ({} bytes)", metrics::human_bytes(static_cast<double>(bytes)), bytes);
}

}  // namespace

HostMemory host_memory() {
  HostMemory m;
  m.node_available = node_available_bytes();
  if (mpi_running()) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &m.ranks_on_node);
    MPI_Comm_free(&node);
  }
  return m;
}

void require_host_memory(std::size_t needed, const std::string& option, const std::string& what) {
  const HostMemory mine = host_memory();
  // The ranks of one node share its memory: the verdict sums their needs (rank 0 may hold a
  // single-device twin besides its share, the others not). Every rank's figures go to every
  // rank, so that every rank reaches the same verdict and throws the same line (exit_all then
  // prints it once and every rank exits 2). A node is named by its lowest world rank.
  const int n = mpi_running() ? world_size() : 1;
  unsigned long long node = 0;
  if (n > 1) {
    MPI_Comm node_comm;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL,
                        &node_comm);
    const unsigned long long me = static_cast<unsigned long long>(world_rank());
    MPI_Allreduce(&me, &node, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, node_comm);
    MPI_Comm_free(&node_comm);
  }
  std::vector<unsigned long long> all(3 * static_cast<std::size_t>(n));
  const unsigned long long row[3] = {needed, mine.node_available, node};
  if (n > 1)
    MPI_Allgather(row, 3, MPI_UNSIGNED_LONG_LONG, all.data(), 3, MPI_UNSIGNED_LONG_LONG,
                  MPI_COMM_WORLD);
  else
    std::copy(row, row + 3, all.begin());
  struct Node {
    unsigned long long need = 0, available = 0;
    int ranks = 0, neediest = -1;
  };
  std::map<unsigned long long, Node> nodes;
  for (int r = 0; r < n; ++r) {
    const unsigned long long need = all[3 * r], available = all[3 * r + 1];
    Node& d = nodes[all[3 * r + 2]];
    d.need = need > ULLONG_MAX - d.need ? ULLONG_MAX : d.need + need;  // saturating
    if (d.neediest < 0) d.available = available;  // the node's lowest rank read it
    if (d.neediest < 0 || need > all[3 * d.neediest]) d.neediest = r;
    ++d.ranks;
  }
  const Node* worst = nullptr;  // the node short of the most memory, relative to what it has
  double worst_ratio = 1.0;
  for (const auto& [id, d] : nodes) {
    const double need = static_cast<double>(d.need), have = static_cast<double>(d.available);
    const double ratio = have > 0 ? need / have : std::numeric_limits<double>::infinity();
    if (need > have && ratio > worst_ratio) {
      worst = &d;
      worst_ratio = ratio;
    }
  }
  if (worst == nullptr) return;
  const int r = worst->neediest;
  const std::string together =
      worst->ranks == 1 ? "" : fmt::format(", {} with the other {} rank{} of its node",
                                           bytes_text(worst->need), worst->ranks - 1,
                                           worst->ranks == 2 ? "" : "s");
  throw UsageError(fmt::format(
      "{}: {} needs at least {} of host memory on rank {}{}; the node has {} available: make it "
      "smaller",
      option, what, bytes_text(all[3 * r]), r, together,
      metrics::human_bytes(static_cast<double>(worst->available))));
}

}  // namespace scalelab::train
