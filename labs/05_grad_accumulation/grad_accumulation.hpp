#pragma once
/// @file grad_accumulation.hpp
/// Lab 05 contract: gradient accumulation. A batch too big for the device's memory is cut into
/// `accum` micro-batches; each runs forward and backward on its own, the gradients add up in the
/// gradient buffer, and the optimizer steps once: the same update as the big batch, with the
/// activation memory of one micro-batch. With DDP the ranks all-reduce only once, after the last
/// micro-batch.
///
/// DDP itself comes from the reference solutions of lab 03 (lab03::local_batch) and lab 04 (the
/// overlapped reducer lab04::OverlappedDDP, whose backward hooks start the all-reduces), so this
/// lab can be done on its own.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/data/sampler.hpp"
#include "common/nn/gpt.hpp"
#include "ddp_overlap.hpp"  // lab 04 reference: OverlappedDDP

namespace scalelab::lab05 {

// ---- Step 1: accumulate --------------------------------------------------------------------

/// Step 1a. `accum` equal micro-batches of `batch`, in order: micro-batch i is rows
/// [i*m, (i+1)*m), m = rows / accum (views, no copies). Throws scalelab::UsageError when
/// accum < 1 or the rows do not split into `accum` equal parts.
std::vector<data::Batch> micro_batches(const data::Batch& batch, int accum);

/// Step 1b. One micro-batch of an accumulation over `accum` (`micro` is on the host, as the
/// sampler's batches are; the model may be on a GPU): forward, backward with the loss
/// scaled by 1/accum (GPT::backward(loss_scale), which consumes the activations: each is freed as
/// soon as its backward is done), so the next micro-batch does not hold two at once. Gradients
/// accumulate (+=). Returns the micro-batch's (unscaled) mean loss, where the model computed it
/// (a Scalar, common/scalar.hpp: on a GPU, adding the micro-batches' losses reads nothing back,
/// so the step waits for its device once, when its loss is printed).
Scalar micro_batch_step(nn::GPT& model, const data::Batch& micro, int accum);

/// Step 1c. Gradient accumulation on one device: zero the gradients, then micro_batch_step for
/// each micro-batch. Afterwards the gradient buffer holds the gradient of the mean loss over the
/// whole batch. Returns that mean loss (the mean of the micro-batch losses).
double accumulate_gradients(nn::GPT& model, const data::Batch& batch, int accum);

// ---- Step 2: DDP without a sync per micro-batch ---------------------------------------------

/// Step 2a. The no-sync scope (PyTorch's `with model.no_sync():`): while a NoSync lives, the
/// reducer's backward hooks are off (ddp.detach()), so backward only accumulates locally; when
/// it ends, they are on again (ddp.attach()). The reducer must be attached when the scope opens.
class NoSync {
 public:
  explicit NoSync(lab04::OverlappedDDP& ddp);
  ~NoSync();
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  lab04::OverlappedDDP& ddp_;
};

/// Step 2b. DDP with accumulation on the GLOBAL batch, with an attached overlapped reducer `ddp`
/// for `model`: one optimizer step's gradients from this rank's rows (lab03::local_batch) in
/// `accum` micro-batches, starting from zero, with each bucket all-reduced once per step (not
/// once per micro-batch) and overlapped with the last backward; on return the gradients are
/// the global batch's, averaged, as lab 04's step leaves them. Returns the loss of the whole
/// global batch (the average over ranks of the local mean losses; the same on every rank).
double ddp_accumulate(nn::GPT& model, const data::Batch& global, int accum,
                      comm::Communicator& comm, lab04::OverlappedDDP& ddp);

// ---- Step 3: the batch arithmetic -------------------------------------------------------------

/// global = micro * accum * dp: the rows one optimizer step sees.
struct BatchPlan {
  int64_t global = 0, micro = 0;
  int accum = 0, dp = 0;
  /// Given (batch_plan.cpp). "global batch 16 = micro-batch 2 x accum 2 x dp 4"
  std::string str() const;
};

/// Step 3. The plan for a global batch of `global_batch` rows over `dp` data-parallel ranks with
/// `accum` micro-batches per rank: micro = global / (accum * dp). Throws scalelab::UsageError
/// (one line naming the numbers) when accum < 1, dp < 1, global is not a multiple of
/// accum * dp, or global < accum * dp ("more ranks than rows"; 0 and negative batches are
/// multiples, and still wrong).
BatchPlan plan_batch(int64_t global_batch, int accum, int dp);

// ---- Step 4: what it saves ---------------------------------------------------------------------

/// Step 4. The peak bytes that one accumulate_gradients(model, batch, accum) adds on top of what
/// was allocated before it (parameters, gradients, another model, ...): activations and
/// temporaries, measured by the allocator's counters (common/allocator.hpp), so it is exact and
/// repeatable. Activations an earlier forward left in the model are not "before": the step's
/// own forward would replace them (model.free_activations() first).
std::size_t measure_step_peak_bytes(nn::GPT& model, const data::Batch& batch, int accum);

}  // namespace scalelab::lab05
