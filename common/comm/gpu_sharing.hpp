#pragma once
/// @file gpu_sharing.hpp
/// Internal to common/comm (namespace detail: not for labs): whether NCCL accepts the ranks of a
/// group when some of them share a GPU. NCCL before 2.30 refuses two ranks of one communicator on
/// one GPU (ncclCommInitRank: "invalid usage"); from 2.30, NCCL_MULTI_RANK_GPU_ENABLE=1 lets 2
/// share one. The decision is pure (tests/common/test_comm_route.cpp); communicator.cpp gathers
/// the facts once (which GPU of which node each world rank computes on: local rank % GPUs, the
/// rule of train::rank_device) and acts on it: backend nccl stops with a usage error naming the
/// ranks, the GPU, NCCL's version and the ways out; backend auto stages CUDA tensors through MPI.
#include <string>
#include <string_view>
#include <vector>

namespace scalelab::comm::detail {

/// The first NCCL that lets ranks share a GPU (2.30.0, as ncclGetVersion codes it), with
/// NCCL_MULTI_RANK_GPU_ENABLE=1.
inline constexpr int kNcclSharingVersion = 23000;
/// How many ranks of one communicator that NCCL lets share one GPU.
inline constexpr int kNcclMaxRanksPerGpu = 2;

/// The most ranks on one GPU when `ranks_per_node` ranks share `gpus_per_node` GPUs as
/// local rank % GPUs: ceil(ranks / GPUs); 0 GPUs: 0 (no GPU, nothing for NCCL to refuse).
int ranks_per_gpu(int ranks_per_node, int gpus_per_node);

/// True when NCCL `nccl_version` (ncclGetVersion's code, 22803 for 2.28.3) accepts a
/// communicator with `ranks_on_one_gpu` ranks on its busiest GPU; `multi_rank_env` is
/// NCCL_MULTI_RANK_GPU_ENABLE's value ("" when unset).
bool nccl_accepts(int ranks_on_one_gpu, int nccl_version, std::string_view multi_rank_env);

/// "2.28.3" from 22803 (and "2.9.6" from 2906, the codes before 2.10).
std::string nccl_version_string(int code);

/// Where one world rank computes: its node (the node's lowest world rank) and its GPU there
/// (-1: none).
struct GpuSlot {
  int node = 0;   ///< the lowest world rank on the same node
  int gpu = -1;   ///< the CUDA device index in this rank's process; -1 without a GPU
  std::string host;  ///< the node's name (MPI_Get_processor_name)
  /// The GPU's UUID (cuda_device_uuid): which physical GPU it is, where the index is only the
  /// process's view (ranks given one GPU each by CUDA_VISIBLE_DEVICES all call theirs 0); ""
  /// when unknown (then the node and the index decide).
  std::string uuid;
};

/// Which members (world ranks, indexes into `slots`) share GPUs: the most on one GPU, and a text
/// "ranks 0,1 share GPU 0 of node gpu-a" (one clause per shared GPU, "; " between).
struct SharedGpus {
  int most = 0;      ///< the most members on one GPU (0 when no member has a GPU)
  std::string text;  ///< empty when no GPU holds two members
};
/// Pure: the members' GPUs from the world's table.
SharedGpus shared_gpus(const std::vector<GpuSlot>& slots, const std::vector<int>& members);

/// The one line a program prints when NCCL refuses the ranks sharing a GPU: what shares, the
/// NCCL in use, and the ways out.
std::string sharing_refused_message(const SharedGpus& shared, int nccl_version);

}  // namespace scalelab::comm::detail
