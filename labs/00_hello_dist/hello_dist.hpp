#pragma once
/// @file hello_dist.hpp
/// Lab 00 contract: "is my environment right?". Where does this rank run (which node, which
/// local slot), which device does it use, and can it talk to every other rank?
///
/// Every function takes what it reads from the outside world as a parameter (the environment,
/// the GPU count, the communicator), so the graders can drive every branch.
#include <functional>
#include <optional>
#include <string>

#include <mpi.h>

#include "common/comm/communicator.hpp"

namespace scalelab::lab00 {

/// Reads one environment variable: nullopt when it is not set. The program passes the real
/// environment (process_env()); tests pass a map.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// The real environment (getenv).
EnvLookup process_env();

/// Where a rank runs. -1 means "not known yet".
struct Placement {
  int local_rank = -1;  ///< index among the ranks on this node: 0 .. local_size-1
  int local_size = -1;  ///< ranks on this node
  int node = -1;        ///< index of this node: 0 .. nodes-1
  std::string source;   ///< where local_rank came from: a variable name or "MPI_Comm_split_type"
};

/// Which launcher started us: "slurm" (SLURM_JOB_ID and SLURM_PROCID), "openmpi"
/// (OMPI_COMM_WORLD_SIZE), "hydra" (PMI_RANK: MPICH, Intel MPI), or "none" (a singleton). Given.
std::string detect_launcher(const EnvLookup& env);

// ---- Step 1: local rank and node ----------------------------------------------------------

/// Step 1a. The placement as the launcher's environment tells it:
/// local rank from, in this order, OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), SLURM_LOCALID (srun),
/// MPI_LOCALRANKID (MPICH/Intel hydra), PMI_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK (MVAPICH);
/// local size from OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS; node from SLURM_NODEID.
/// `source` names the variable the local rank came from. Fields the environment does not give
/// stay -1. A value that is not a non-negative integer throws scalelab::UsageError naming the
/// variable.
Placement placement_from_env(const EnvLookup& env);

/// How placement_from_comm finds this rank's node: a new communicator of the ranks of `comm` on
/// this rank's node, in `comm`'s order (placement_from_comm frees it). Collective over `comm`.
/// The program uses shared_memory_node; the graders pass splits that play several nodes on one
/// machine (where the real split is always one node).
using NodeSplit = std::function<MPI_Comm(MPI_Comm comm)>;

/// Step 1b. The ranks of `comm` that share memory with this rank, one node: MPI_Comm_split_type
/// with MPI_COMM_TYPE_SHARED, ranked in `comm`'s order. Collective over `comm`.
MPI_Comm shared_memory_node(MPI_Comm comm);

/// Step 1c. The fallback that needs no launcher: local_rank and local_size are this rank's rank
/// and size in split_node(comm) (this rank's node); node is the index of this node when nodes are
/// ordered by their lowest rank in `comm`. source = "MPI_Comm_split_type". Collective over
/// `comm`.
Placement placement_from_comm(MPI_Comm comm, const NodeSplit& split_node = shared_memory_node);

/// Given (not a step: the starter implements it, on top of steps 1a to 1c). The environment
/// first; every field it left at -1 comes from placement_from_comm.
/// Collective over `comm` (every rank calls placement_from_comm, so no rank waits alone).
Placement find_placement(const EnvLookup& env, MPI_Comm comm);

// ---- Step 2: device ------------------------------------------------------------------------

/// Step 2. The device this rank computes on: "cpu" when `want_gpu` is false or there is no GPU
/// (gpu_count == 0); otherwise "cuda:N" with N = local_rank % gpu_count (one GPU per local rank;
/// more ranks than GPUs share them round-robin). Negative arguments throw std::invalid_argument.
std::string choose_device(int local_rank, int gpu_count, bool want_gpu);

// ---- Step 3: a first all-reduce -------------------------------------------------------------

/// Step 3a. Sum of every rank's id (comm.rank()) with one all-reduce on `comm`, scalelab's
/// communicator (common/comm/communicator.hpp) that every later lab talks through; every rank
/// gets the sum. Works on any communicator: the world, a split of it, or a world of one.
long long all_reduce_rank_ids(comm::Communicator& comm);

/// Step 3b. The sum all_reduce_rank_ids must return for `world_size` ranks: 0+1+...+(n-1).
long long expected_rank_id_sum(int world_size);

}  // namespace scalelab::lab00
