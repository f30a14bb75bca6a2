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
  // BEGIN SOLUTION step 1: greedy buckets of adjacent gradients in ready order
  // HINT: params.offset(i) and params.list()[i]->numel() give parameter i's range in the buffer.
  const std::size_t elem = dtype_size(params.list().empty() ? DType::f32
                                                            : params.list()[0]->grad.dtype());
  for (int i : order) {
    const int64_t off = params.offset(i), n = params.list()[i]->numel();
    if (!buckets.empty()) {
      Bucket& b = buckets.back();
      const bool before = off + n == b.offset, after = off == b.offset + b.count;
      const bool fits = static_cast<std::size_t>(b.count + n) * elem <= bucket_bytes;
      if ((before || after) && fits) {
        if (before) b.offset = off;
        b.count += n;
        b.params.push_back(i);
        continue;
      }
    }
    buckets.push_back(Bucket{off, n, {i}});
  }
  // END SOLUTION
  return buckets;
}

// OverlappedDDP's constructor, attach() and detach() (given): backward_hooks.cpp.

void OverlappedDDP::on_ready(const std::vector<nn::Parameter*>& done) {
  // BEGIN SOLUTION step 2: count ready gradients per bucket; launch a bucket when it is complete
  // HINT: bucket_of_.at(p) is p's bucket; a view of its gradients is
  // HINT: model_.params().grads().flat(bucket.offset, bucket.count).
  for (const nn::Parameter* p : done) {
    const int b = bucket_of_.at(p);
    SCALELAB_CHECK(pending_[b] > 0, "bucket {} reported ready twice in one step", b);
    if (--pending_[b] > 0) continue;
    const Bucket& bucket = buckets_[b];
    works_.push_back(launch_(b, model_.params().grads().flat(bucket.offset, bucket.count)));
    launched_.push_back(b);
  }
  // END SOLUTION
}

std::vector<double> OverlappedDDP::finish() {
  std::vector<double> done;
  // BEGIN SOLUTION step 3: wait every bucket, average, reset for the next step
  SCALELAB_CHECK(works_.size() == buckets_.size(),
                 "{} of {} buckets were launched: backward did not report every gradient "
                 "(or ran with the hooks detached)",
                 works_.size(), buckets_.size());
  const double inv = 1.0 / comm_.size();
  for (std::size_t j = 0; j < works_.size(); ++j) {
    works_[j].wait();
    done.push_back(trace::now_us());
    const Bucket& bucket = buckets_[launched_[j]];
    Tensor g = model_.params().grads().flat(bucket.offset, bucket.count);
    ops::scale(g, inv);
  }
  works_.clear();
  launched_.clear();
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    pending_[b] = static_cast<int>(buckets_[b].params.size());
  // END SOLUTION
  return done;
}

double exposed_time(double backward_end, const std::vector<double>& bucket_done) {
  // BEGIN SOLUTION step 4: from backward's end to the latest bucket done, never negative
  double last = backward_end;
  for (double t : bucket_done) last = std::max(last, t);
  return last - backward_end;
  // END SOLUTION
}

double hidden_fraction(double exposed, double total) {
  // BEGIN SOLUTION step 4: 1 - exposed / total, clamped to [0, 1]
  if (total <= 0) return 0.0;
  return std::clamp(1.0 - exposed / total, 0.0, 1.0);
  // END SOLUTION
}

}  // namespace scalelab::lab04
