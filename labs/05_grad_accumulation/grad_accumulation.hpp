#pragma once
/// @file grad_accumulation.hpp
/// Lab 05 contract: gradient accumulation. A batch too big for the device's memory is cut into
/// `accum` micro-batches; each runs forward and backward on its own, the gradients add up in the
/// gradient buffer, and the optimizer steps once: the same update as the big batch, with the
/// activation memory of one micro-batch. With DDP the ranks all-reduce only once, after the last
/// micro-batch.
///
/// DDP itself comes from lab 03's reference (lab03::local_batch, lab03::all_reduce_gradients),
/// so this lab can be done on its own.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/data/sampler.hpp"
#include "common/nn/gpt.hpp"

namespace scalelab::lab05 {

// ---- Step 1: accumulate --------------------------------------------------------------------

/// Step 1a. `accum` equal micro-batches of `batch`, in order: micro-batch i is rows
/// [i*m, (i+1)*m), m = rows / accum (views, no copies). Throws scalelab::UsageError when
/// accum < 1 or the rows do not split into `accum` equal parts.
std::vector<data::Batch> micro_batches(const data::Batch& batch, int accum);

/// Step 1b. Gradient accumulation on one device: zero the gradients, then for each micro-batch
/// forward, backward with the loss scaled by 1/accum (GPT::backward(loss_scale)), and free its
/// activations (GPT::free_activations) before the next one. Afterwards the gradient buffer
/// holds the gradient of the mean loss over the whole batch. Returns that mean loss (the mean
/// of the micro-batch losses).
double accumulate_gradients(nn::GPT& model, const data::Batch& batch, int accum);

// ---- Step 2: DDP without a sync per micro-batch ---------------------------------------------

/// Averages the gradients over the data-parallel ranks (the program passes lab 03's
/// all_reduce_gradients).
using GradSync = std::function<void(nn::GPT& model)>;

/// Step 2. DDP with accumulation on the GLOBAL batch: this rank's rows (lab03::local_batch),
/// accumulate over `accum` micro-batches of them WITHOUT synchronising (the "no-sync" scope),
/// then call `sync` exactly ONCE, after the last micro-batch's backward. Returns the loss of the
/// whole global batch (the average over ranks of the local mean losses; the same on every rank).
double ddp_accumulate(nn::GPT& model, const data::Batch& global, int accum,
                      comm::Communicator& comm, const GradSync& sync);

// ---- Step 3: the batch arithmetic -------------------------------------------------------------

/// global = micro * accum * dp: the rows one optimizer step sees.
struct BatchPlan {
  int64_t global = 0, micro = 0;
  int accum = 0, dp = 0;
  /// "global batch 16 = micro-batch 2 x accum 2 x dp 4"
  std::string str() const;
};

/// Step 3. The plan for a global batch of `global_batch` rows over `dp` data-parallel ranks with
/// `accum` micro-batches per rank: micro = global / (accum * dp). Throws scalelab::UsageError
/// (one line naming the numbers) when accum < 1, dp < 1, or global is not a multiple of
/// accum * dp (which includes "more ranks than rows").
BatchPlan plan_batch(int64_t global_batch, int accum, int dp);

// ---- Step 4: what it saves ---------------------------------------------------------------------

/// Step 4. The peak bytes that one accumulate_gradients(model, batch, accum) adds on top of what
/// was allocated before it (parameters, gradients, ...): reset the allocator's peak, note the
/// current bytes, run it, return peak - current-before. Measured by the allocator's counters
/// (common/allocator.hpp), so it is exact and repeatable: activations and temporaries.
std::size_t measure_step_peak_bytes(nn::GPT& model, const data::Batch& batch, int accum);

}  // namespace scalelab::lab05
