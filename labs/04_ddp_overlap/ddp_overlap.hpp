#pragma once
/// @file ddp_overlap.hpp
/// Lab 04 contract: DDP with the gradient all-reduce overlapped with backward. The flat gradient
/// buffer is cut into buckets; as soon as backward has produced every gradient of a bucket, that
/// bucket's all-reduce starts (non-blocking) while backward goes on with the earlier layers. At
/// the end of backward only the last buckets are still in flight: that wait is the communication
/// the step still pays ("exposed").
///
/// Lab 03's reference solution provides the rest of DDP (broadcast, local batch).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/nn/gpt.hpp"

namespace scalelab::lab04 {

/// A bucket: whole parameters whose gradients are one contiguous range of the flat gradient
/// buffer, so the bucket's all-reduce is one collective on a view (no copies).
struct Bucket {
  int64_t offset = 0;       ///< first element in model.params().grads()
  int64_t count = 0;        ///< elements
  std::vector<int> params;  ///< indices into model.parameters(), in ready order
};

/// Given (backward_hooks.cpp). The order in which backward makes the parameters' gradients
/// final, as indices into model.parameters(): recorded from the model's backward hook during one
/// forward + backward of a one-token batch (the gradients are zeroed afterwards). Parameters
/// reported by one hook call (one layer) are listed from the highest offset down, so for a GPT
/// the order is exactly the reverse of the flat buffer: ln_f first, blocks from last to first,
/// the embedding (wpe, then the tied wte) last. Note wte: the LM head writes into its gradient
/// FIRST, but the embedding's backward adds to it at the very end, so it is ready last.
std::vector<int> ready_order(nn::GPT& model);

// ---- Step 1: buckets -------------------------------------------------------------------------

/// Step 1. Buckets in ready order: walk `order`; a parameter joins the current bucket if its
/// gradient is adjacent to the bucket's range in the flat buffer (just before or just after it)
/// and the bucket stays within `bucket_bytes`; otherwise it starts a new bucket. A parameter
/// larger than `bucket_bytes` gets a bucket of its own. Every parameter is in exactly one
/// bucket. Throws scalelab::UsageError when bucket_bytes is 0.
std::vector<Bucket> assign_buckets(const nn::ParameterSet& params, const std::vector<int>& order,
                                   std::size_t bucket_bytes);

// ---- Steps 2 and 3: the overlapped reducer -----------------------------------------------------

/// Starts the all-reduce (sum) of one bucket's gradients and returns its Work. The default is
/// comm.all_reduce_async(grads); the graders pass their own to see when each bucket starts.
using Launch = std::function<comm::Work(int bucket, const Tensor& grads)>;

class OverlappedDDP {
 public:
  /// Given (backward_hooks.cpp). Sets up the bookkeeping below for `buckets` (from
  /// assign_buckets) of `model`.
  OverlappedDDP(nn::GPT& model, comm::Communicator& comm, std::vector<Bucket> buckets,
                Launch launch = {});
  OverlappedDDP(const OverlappedDDP&) = delete;  // the hook and the launch point at this object
  OverlappedDDP& operator=(const OverlappedDDP&) = delete;

  /// Given (backward_hooks.cpp). Installs on_ready() as the model's backward hook.
  void attach();
  /// Given (backward_hooks.cpp). Removes the hook (e.g. for a no-sync micro-batch).
  void detach();

  /// Step 2. The backward hook: backward calls it with the parameters whose gradients just
  /// became final. Count them against their buckets; when a bucket's last gradient is ready,
  /// launch its all-reduce at once (launch_(b, view of its gradients)) and keep the Work.
  /// Never launch a bucket before all its gradients are ready, never twice in one step.
  void on_ready(const std::vector<nn::Parameter*>& done);

  /// Step 3. After backward: wait for every bucket in launch order, divide the gradients by the
  /// world size (the average, as in lab 03), and reset the bookkeeping for the next step. A
  /// bucket that was never launched is an error (SCALELAB_CHECK: backward did not report all of
  /// its gradients). Returns, per bucket in launch order, trace::now_us() when its wait
  /// returned (the program's exposed-time measurement).
  std::vector<double> finish();

  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  nn::GPT& model_;
  comm::Communicator& comm_;
  std::vector<Bucket> buckets_;
  Launch launch_;
  std::unordered_map<const nn::Parameter*, int> bucket_of_;  // parameter -> its bucket
  std::vector<int> pending_;   // per bucket: gradients not ready yet in this step
  std::vector<comm::Work> works_;  // launched all-reduces, in launch order
  std::vector<int> launched_;      // bucket index of each entry of works_
};

// ---- Step 4: measuring the overlap -------------------------------------------------------------

/// Step 4a. Exposed communication time: from the end of backward to the moment the bucket that
/// finishes latest is done (the largest time in bucket_done, which is in launch order, not
/// sorted: not its last entry); 0 when every bucket finished before backward ended (times in any
/// one unit).
double exposed_time(double backward_end, const std::vector<double>& bucket_done);

/// Step 4b. The share of the communication hidden under backward: 1 - exposed / total, where
/// total is the time the same all-reduces take on their own; clamped to [0, 1]; 0 when total is
/// not positive.
double hidden_fraction(double exposed, double total);

}  // namespace scalelab::lab04
