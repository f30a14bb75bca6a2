#pragma once
/// @file sizing.hpp
/// Sizing a run before it allocates. A batch too large for the machine must be a usage error that
/// names the option, on every rank, before any work: not "check failed: out of host memory" from
/// the allocator in the middle of a step, nor the kernel's OOM killer (a large allocation may
/// succeed and fail only when its pages are touched).
///
///   train::StepShape shape{.global_batch = B, .rows = B / dp, .layers = L};
///   train::require_host_memory(train::step_bytes_at_least(config, shape, precision), "--batch");
///
/// The figure is a lower bound, not a prediction: it counts only what a step certainly holds, so a
/// run it refuses cannot fit, and one it lets through may still run out (lab 10's planner predicts
/// the whole footprint; this check must also hold for an attendee's unfinished lab).
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.hpp"
#include "common/model_config.hpp"

namespace scalelab::train {

/// What one rank runs in a training step.
struct StepShape {
  int64_t global_batch = 0;  ///< rows of the global batch (data::Sampler draws it on every rank)
  int64_t rows = 0;          ///< rows of one forward on this rank (its share, or a micro-batch)
  int in_flight = 1;         ///< forwards whose activations are alive at once (a pipeline's)
  int64_t layers = 0;        ///< blocks this rank runs
  int tp = 1;                ///< ranks the MLP's width and the vocabulary are split over
  bool head = true;          ///< this rank computes the head (the probabilities over the vocabulary)
  bool checkpoint = false;   ///< blocks keep only their input (activation checkpointing)
  /// Attention written out (nn::GPTOptions' default, what labs 07-10 run): each block keeps its
  /// (T, T) probabilities per head; false for flash attention, which keeps none.
  bool attention_probabilities = true;
};

/// Bytes a step holds at once on the rank, at least: the global batch's tokens (x and y, int32:
/// 8 B T) and `in_flight` forwards' activations of `rows` rows of T tokens: per block its input
/// (rows T C) and, unless checkpointed, the MLP's h and g (rows T 4C / tp each) and the attention
/// probabilities (rows (NH / tp) T T); with the head, the probabilities over the vocabulary
/// (rows T V / tp). Activations are 2 bytes in bf16, else 4. Everything else a step holds
/// (LayerNorm outputs, q, k, v, the model and its optimizer, backward temporaries) is left out.
/// Saturates at SIZE_MAX instead of overflowing.
std::size_t step_bytes_at_least(const ModelConfig& config, const StepShape& shape,
                                DType precision);

/// Host memory this process can count on: the node's available memory (MemAvailable of
/// /proc/meminfo, or less when a cgroup limit leaves less) shared equally by the ranks of this
/// node. Collective over MPI_COMM_WORLD (the ranks of a node are found with
/// MPI_Comm_split_type); one process alone when MPI is not running.
struct HostMemory {
  std::size_t node_available = 0;  ///< bytes
  int ranks_on_node = 1;  ///< this job's ranks on this node
  /// This rank's even share of the node's available memory.
  std::size_t per_rank() const { return node_available / static_cast<std::size_t>(ranks_on_node); }
};
/// This node's available memory and this job's ranks on it (see HostMemory).
HostMemory host_memory();

/// Refuses a run that cannot fit, before it allocates: each rank gives `needed` (its own figure,
/// e.g. step_bytes_at_least), and the needs of a node's ranks, summed, are compared with that
/// node's available memory (a rank-0 twin beside lighter ranks fits where the sum does); if any
/// node is short, every rank throws the same UsageError (exit 2, one line) naming `option` (what
/// the user should change, e.g. "--batch 1000000000"), the neediest rank of the node short of the
/// most, its bytes, its node's sum and the bytes available there. `what` says what the bytes are ("a training step", "the single-device twin").
/// Collective over MPI_COMM_WORLD: call it on every rank at the same point.
void require_host_memory(std::size_t needed, const std::string& option, const std::string& what);

}  // namespace scalelab::train
