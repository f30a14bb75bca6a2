// Whether NCCL accepts ranks that share a GPU (gpu_sharing.hpp).
#include "common/comm/gpu_sharing.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include <fmt/format.h>

namespace scalelab::comm::detail {

int ranks_per_gpu(int ranks_per_node, int gpus_per_node) {
  if (gpus_per_node <= 0 || ranks_per_node <= 0) return 0;
  return (ranks_per_node + gpus_per_node - 1) / gpus_per_node;
}

bool nccl_accepts(int ranks_on_one_gpu, int nccl_version, std::string_view multi_rank_env) {
  if (ranks_on_one_gpu <= 1) return true;
  return nccl_version >= kNcclSharingVersion && multi_rank_env == "1" &&
         ranks_on_one_gpu <= kNcclMaxRanksPerGpu;
}

std::string nccl_version_string(int code) {
  if (code <= 0) return "none";
  // NCCL's code: major*1000 + minor*100 + patch before 2.10, major*10000 + minor*100 + patch after
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return fmt::format("{}.{}.{}", major, minor, code % 100);
}

SharedGpus shared_gpus(const std::vector<GpuSlot>& slots, const std::vector<int>& members) {
  // one physical GPU: its UUID, or (node, index) when the UUID is unknown
  std::map<std::tuple<std::string, int, int>, std::vector<int>> on;
  for (int r : members) {
    if (r < 0 || r >= static_cast<int>(slots.size()) || slots[r].gpu < 0) continue;
    const GpuSlot& s = slots[r];
    on[s.uuid.empty() ? std::tuple{std::string(), s.node, s.gpu} : std::tuple{s.uuid, -1, -1}]
        .push_back(r);
  }
  SharedGpus out;
  for (const auto& [where, ranks] : on) {
    out.most = std::max(out.most, static_cast<int>(ranks.size()));
    if (ranks.size() < 2) continue;
    std::string list;
    for (int r : ranks) {
      if (!list.empty()) list += ',';
      list += std::to_string(r);
    }
    const GpuSlot& first = slots[ranks.front()];
    // the first rank's index for the GPU (another sharer may call it otherwise), then its UUID
    out.text += fmt::format("{}ranks {} share GPU {}{} of node {}", out.text.empty() ? "" : "; ",
                            list, first.gpu, first.uuid.empty() ? "" : " (" + first.uuid + ")",
                            first.host.empty() ? std::to_string(first.node) : first.host);
  }
  return out;
}

std::string sharing_refused_message(const SharedGpus& shared, int nccl_version) {
  return fmt::format(
      "{}, and NCCL {} refuses ranks that share a GPU: run one rank per GPU, or --backend mpi "
      "(CUDA tensors staged through host memory), or NCCL >= {} with "
      "NCCL_MULTI_RANK_GPU_ENABLE=1 (at most {} ranks per GPU)",
      shared.text, nccl_version_string(nccl_version), nccl_version_string(kNcclSharingVersion),
      kNcclMaxRanksPerGpu);
}

}  // namespace scalelab::comm::detail
