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
  // BEGIN SOLUTION step 1: cut the batch into accum equal row slices
  // HINT: SCALELAB_REQUIRE(cond, "...") throws the UsageError; Batch::rows(begin, end) is a view.
  const int64_t rows = batch.batch_size();
  SCALELAB_REQUIRE(accum >= 1, "accum must be at least 1, got {}", accum);
  SCALELAB_REQUIRE(rows % accum == 0, "{} rows do not split into {} equal micro-batches", rows,
                   accum);
  const int64_t m = rows / accum;
  for (int i = 0; i < accum; ++i) out.push_back(batch.rows(i * m, (i + 1) * m));
  // END SOLUTION
  return out;
}

Scalar micro_batch_step(nn::GPT& model, const data::Batch& micro, int accum) {
  Scalar loss;
  // BEGIN SOLUTION step 1: forward, then backward with the loss scaled by 1/accum
  // HINT: each micro-batch's loss is a mean over ITS rows; the big batch's loss is the mean of
  // HINT: those means (GPT::backward takes a loss scale).
  const data::Batch on = micro.to(model.device());
  loss = model.forward(on.x, on.y);
  model.backward(1.0 / accum);  // consumes the activations: one micro-batch held at a time
  // END SOLUTION
  return loss;
}

double accumulate_gradients(nn::GPT& model, const data::Batch& batch, int accum) {
  Scalar loss_sum;  // the micro-batches' losses add on the device: read once, on return
  // BEGIN SOLUTION step 1: zero the gradients, then one micro_batch_step per micro-batch
  model.zero_grad();
  for (const data::Batch& mb : micro_batches(batch, accum))
    loss_sum += micro_batch_step(model, mb, accum);
  // END SOLUTION
  return loss_sum / accum;
}

NoSync::NoSync(lab04::OverlappedDDP& ddp) : ddp_(ddp) {
  // BEGIN SOLUTION step 2: hooks off for the scope
  ddp_.detach();
  // END SOLUTION
}

NoSync::~NoSync() {
  // BEGIN SOLUTION step 2: hooks on again
  ddp_.attach();
  // END SOLUTION
}

double ddp_accumulate(nn::GPT& model, const data::Batch& global, int accum,
                      comm::Communicator& comm, lab04::OverlappedDDP& ddp) {
  // BEGIN SOLUTION step 2: accumulate this rank's rows without syncing, sync in the last one
  // HINT: lab03::local_batch(global, comm.rank(), comm.size()) is this rank's share.
  model.zero_grad();
  const data::Batch mine = lab03::local_batch(global, comm.rank(), comm.size());
  const std::vector<data::Batch> micro = micro_batches(mine, accum);
  Scalar local_loss;
  {
    NoSync scope(ddp);
    for (int i = 0; i + 1 < accum; ++i) local_loss += micro_batch_step(model, micro[i], accum);
  }
  local_loss += micro_batch_step(model, micro.back(), accum);  // its backward launches buckets
  {
    trace::Scope scope("wait buckets");
    ddp.finish();
  }
  return train::global_loss(local_loss / accum, comm);
  // END SOLUTION
}

BatchPlan plan_batch(int64_t global_batch, int accum, int dp) {
  BatchPlan plan;
  // BEGIN SOLUTION step 3: micro = global / (accum * dp), with usage errors
  SCALELAB_REQUIRE(accum >= 1, "--accum must be at least 1, got {}", accum);
  SCALELAB_REQUIRE(dp >= 1, "the data-parallel size must be at least 1, got {}", dp);
  SCALELAB_REQUIRE(global_batch % (static_cast<int64_t>(accum) * dp) == 0 &&
                       global_batch >= static_cast<int64_t>(accum) * dp,
                   "a global batch of {} rows does not split into accum {} x dp {} equal "
                   "micro-batches: make --batch a multiple of {}",
                   global_batch, accum, dp, static_cast<int64_t>(accum) * dp);
  plan.global = global_batch;
  plan.accum = accum;
  plan.dp = dp;
  plan.micro = global_batch / (static_cast<int64_t>(accum) * dp);
  // END SOLUTION
  return plan;
}

std::size_t measure_step_peak_bytes(nn::GPT& model, const data::Batch& batch, int accum) {
  // BEGIN SOLUTION step 4: the allocator's peak during one accumulation, above the start
  // HINT: reset_peak_memory(device), memory_stats(device).current / .peak (common/allocator.hpp)
  const Device dev = model.device();
  model.free_activations();
  reset_peak_memory(dev);
  const std::size_t before = memory_stats(dev).current;
  accumulate_gradients(model, batch, accum);
  return memory_stats(dev).peak - before;
  // END SOLUTION
}

}  // namespace scalelab::lab05
