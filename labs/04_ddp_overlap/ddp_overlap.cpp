// Starter generated from solutions/04_ddp_overlap/ddp_overlap.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 64098664c5a03d39 (lets make-labs see your edits).
// Lab 04: DDP with overlap: gradient buckets all-reduced from backward hooks.
#include "ddp_overlap.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"

namespace scalelab::lab04 {

// ready_order (given): backward_hooks.cpp.

std::vector<Bucket> assign_buckets(const nn::ParameterSet& params, const std::vector<int>& order,
                                   std::size_t bucket_bytes) {
  SCALELAB_REQUIRE(bucket_bytes > 0, "the bucket size must be positive (--bucket-mb > 0)");
  std::vector<Bucket> buckets;
  // TODO step 1: greedy buckets of adjacent gradients in ready order
  // HINT: params.offset(i) and params.list()[i]->numel() give parameter i's range in the buffer.
  throw scalelab::NotImplemented(
      "lab 04 step 1: greedy buckets of adjacent gradients in ready order (README.md#step-1)");
  return buckets;
}

// OverlappedDDP's constructor, attach() and detach() (given): backward_hooks.cpp.

void OverlappedDDP::on_ready(const std::vector<nn::Parameter*>& done) {
  // TODO step 2: count ready gradients per bucket; launch a bucket when it is complete
  // HINT: bucket_of_.at(p) is p's bucket; a view of its gradients is
  // HINT: model_.params().grads().flat(bucket.offset, bucket.count).
  throw scalelab::NotImplemented(
      "lab 04 step 2: count ready gradients per bucket; launch a bucket when it is complete (README.md#step-2)");
}

std::vector<double> OverlappedDDP::finish() {
  std::vector<double> done;
  // TODO step 3: wait every bucket, average, reset for the next step
  throw scalelab::NotImplemented(
      "lab 04 step 3: wait every bucket, average, reset for the next step (README.md#step-3)");
  return done;
}

double exposed_time(double backward_end, const std::vector<double>& bucket_done) {
  // TODO step 4: from backward's end to the latest bucket done, never negative
  throw scalelab::NotImplemented(
      "lab 04 step 4: from backward's end to the latest bucket done, never negative (README.md#step-4)");
}

double hidden_fraction(double exposed, double total) {
  // TODO step 4: 1 - exposed / total, clamped to [0, 1]
  throw scalelab::NotImplemented(
      "lab 04 step 4: 1 - exposed / total, clamped to [0, 1] (README.md#step-4)");
}

}  // namespace scalelab::lab04
