// Lab 00: hello_dist. Where does each rank run, which device does it use, can all ranks talk?
#include "hello_dist.hpp"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "common/errors.hpp"

namespace scalelab::lab00 {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

std::string detect_launcher(const EnvLookup& env) {
  if (env("SLURM_JOB_ID") && env("SLURM_PROCID")) return "slurm";
  if (env("OMPI_COMM_WORLD_SIZE")) return "openmpi";
  if (env("PMI_RANK")) return "hydra";
  return "none";
}

namespace {
// A launcher variable holding a count or an index: a non-negative integer, or a usage error
// that names the variable (a typo in a job script should not become "local rank 0").
int parse_index(const std::string& name, const std::string& value) {
  std::size_t used = 0;
  int parsed = -1;
  try {
    parsed = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || parsed < 0)
    throw UsageError(fmt::format("{}='{}' is not a non-negative integer", name, value));
  return parsed;
}
}  // namespace

Placement placement_from_env(const EnvLookup& env) {
  Placement p;
  // BEGIN SOLUTION step 1: read local rank, local size and node from the launcher's environment
  // HINT: try the variables in the order the contract gives; parse_index() validates a value.
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                           "PMI_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK"}) {
    if (auto value = env(name)) {
      p.local_rank = parse_index(name, *value);
      p.source = name;
      break;
    }
  }
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (auto value = env(name)) {
      p.local_size = parse_index(name, *value);
      break;
    }
  }
  if (auto value = env("SLURM_NODEID")) p.node = parse_index("SLURM_NODEID", *value);
  // END SOLUTION
  return p;
}

MPI_Comm shared_memory_node(MPI_Comm comm) {
  MPI_Comm node_comm = MPI_COMM_NULL;
  // BEGIN SOLUTION step 1: the ranks of comm that share memory (one node)
  // HINT: the ranks of one node share memory: MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, ...).
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm);
  // END SOLUTION
  return node_comm;
}

Placement placement_from_comm(MPI_Comm comm, const NodeSplit& split_node) {
  Placement p;
  // BEGIN SOLUTION step 1: the MPI fallback (local rank and size on the node, node numbering)
  // HINT: split_node(comm) is this rank's node; its lowest rank in comm can name it.
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm node_comm = split_node(comm);
  MPI_Comm_rank(node_comm, &p.local_rank);
  MPI_Comm_size(node_comm, &p.local_size);
  int leader = rank;  // the lowest rank of my node, known to every rank of the node
  MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node_comm);
  MPI_Comm_free(&node_comm);
  std::vector<int> leaders(size);
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm);
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  p.node = static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), leader) -
                            leaders.begin());
  p.source = "MPI_Comm_split_type";
  // END SOLUTION
  return p;
}

Placement find_placement(const EnvLookup& env, MPI_Comm comm) {
  Placement p = placement_from_env(env);
  const Placement fallback = placement_from_comm(comm);
  if (p.local_rank < 0) {
    p.local_rank = fallback.local_rank;
    p.source = fallback.source;
  }
  if (p.local_size < 0) p.local_size = fallback.local_size;
  if (p.node < 0) p.node = fallback.node;
  return p;
}

std::string choose_device(int local_rank, int gpu_count, bool want_gpu) {
  if (local_rank < 0 || gpu_count < 0)
    throw std::invalid_argument(fmt::format(
        "choose_device: local_rank and gpu_count must not be negative, got {} and {}", local_rank,
        gpu_count));
  // BEGIN SOLUTION step 2: pick cpu or cuda:N from the local rank and the GPU count
  if (!want_gpu || gpu_count == 0) return "cpu";
  return fmt::format("cuda:{}", local_rank % gpu_count);
  // END SOLUTION
}

long long all_reduce_rank_ids(comm::Communicator& comm) {
  // BEGIN SOLUTION step 3: all-reduce (sum) every rank's id
  // HINT: the sum must be exact for any world size: which dtype holds it? (./scalelab hint 00 3)
  Tensor id = Tensor::from_vector({static_cast<double>(comm.rank())}, {1}, DType::f64);
  comm.all_reduce(id, comm::ReduceOp::sum);
  return static_cast<long long>(id.item(0));
  // END SOLUTION
}

long long expected_rank_id_sum(int world_size) {
  // BEGIN SOLUTION step 3: the sum 0 + 1 + ... + (n-1)
  return static_cast<long long>(world_size) * (world_size - 1) / 2;
  // END SOLUTION
}

}  // namespace scalelab::lab00
