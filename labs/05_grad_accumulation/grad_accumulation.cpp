// Starter generated from solutions/05_grad_accumulation/grad_accumulation.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 6add0dbcfe8a6f88 (lets make-labs see your edits).
#include "common/runtime.hpp"  // scalelab::not_implemented_in_destructor
// Lab 05: gradient accumulation: micro-batches, scaled losses, one all-reduce per step.
#include "grad_accumulation.hpp"

#include "common/allocator.hpp"
#include "common/errors.hpp"
#include "common/trace.hpp"
#include "common/train/global_loss.hpp"
#include "ddp.hpp"  // lab 03's reference: local_batch

namespace scalelab::lab05 {

// BatchPlan::str() (given): batch_plan.cpp.

std::vector<data::Batch> micro_batches(const data::Batch& batch, int accum) {
  std::vector<data::Batch> out;
  // TODO step 1: cut the batch into accum equal row slices
  // HINT: SCALELAB_REQUIRE(cond, "...") throws the UsageError; Batch::rows(begin, end) is a view.
  throw scalelab::NotImplemented(
      "lab 05 step 1: cut the batch into accum equal row slices (README.md#step-1)");
  return out;
}

Scalar micro_batch_step(nn::GPT& model, const data::Batch& micro, int accum) {
  Scalar loss;
  // TODO step 1: forward, then backward with the loss scaled by 1/accum
  // HINT: each micro-batch's loss is a mean over ITS rows; the big batch's loss is the mean of
  // HINT: those means (GPT::backward takes a loss scale).
  throw scalelab::NotImplemented(
      "lab 05 step 1: forward, then backward with the loss scaled by 1/accum (README.md#step-1)");
  return loss;
}

double accumulate_gradients(nn::GPT& model, const data::Batch& batch, int accum) {
  Scalar loss_sum;  // the micro-batches' losses add on the device: read once, on return
  // TODO step 1: zero the gradients, then one micro_batch_step per micro-batch
  throw scalelab::NotImplemented(
      "lab 05 step 1: zero the gradients, then one micro_batch_step per micro-batch (README.md#step-1)");
  return loss_sum / accum;
}

NoSync::NoSync(lab04::OverlappedDDP& ddp) : ddp_(ddp) {
  // TODO step 2: hooks off for the scope
  throw scalelab::NotImplemented(
      "lab 05 step 2: hooks off for the scope (README.md#step-2)");
}

NoSync::~NoSync() {
  // TODO step 2: hooks on again
  scalelab::not_implemented_in_destructor(
      "lab 05 step 2: hooks on again (README.md#step-2)");
}

double ddp_accumulate(nn::GPT& model, const data::Batch& global, int accum,
                      comm::Communicator& comm, lab04::OverlappedDDP& ddp) {
  // TODO step 2: accumulate this rank's rows without syncing, sync in the last one
  // HINT: lab03::local_batch(global, comm.rank(), comm.size()) is this rank's share.
  throw scalelab::NotImplemented(
      "lab 05 step 2: accumulate this rank's rows without syncing, sync in the last one (README.md#step-2)");
}

BatchPlan plan_batch(int64_t global_batch, int accum, int dp) {
  BatchPlan plan;
  // TODO step 3: micro = global / (accum * dp), with usage errors
  throw scalelab::NotImplemented(
      "lab 05 step 3: micro = global / (accum * dp), with usage errors (README.md#step-3)");
  return plan;
}

std::size_t measure_step_peak_bytes(nn::GPT& model, const data::Batch& batch, int accum) {
  // TODO step 4: the allocator's peak during one accumulation, above the start
  // HINT: reset_peak_memory(device), memory_stats(device).current / .peak (common/allocator.hpp)
  throw scalelab::NotImplemented(
      "lab 05 step 4: the allocator's peak during one accumulation, above the start (README.md#step-4)");
}

}  // namespace scalelab::lab05
