// Starter generated from solutions/04_ddp_overlap/ddp_overlap.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 1ac2137a87f363d9 (lets make-labs see your edits).
// Lab 04: DDP with overlap: gradient buckets all-reduced from backward hooks.
#include "ddp_overlap.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"

namespace scalelab::lab04 {

std::vector<int> ready_order(nn::GPT& model) {
  std::unordered_map<const nn::Parameter*, int> index;
  const auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) index[params[i]] = static_cast<int>(i);
  std::vector<int> order;
  model.set_backward_hook([&](const std::vector<nn::Parameter*>& done) {
    std::vector<int> layer;
    for (const nn::Parameter* p : done) layer.push_back(index.at(p));
    std::sort(layer.begin(), layer.end(), std::greater<>());  // highest offset first
    order.insert(order.end(), layer.begin(), layer.end());
  });
  Tensor tokens = Tensor::zeros({1, 1}, DType::i32, model.device());
  model.forward(tokens, tokens);
  model.backward();
  model.set_backward_hook({});
  model.free_activations();
  model.zero_grad();
  SCALELAB_CHECK(order.size() == params.size(), "backward reported {} of {} parameters",
                 order.size(), params.size());
  return order;
}

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

OverlappedDDP::OverlappedDDP(nn::GPT& model, comm::Communicator& comm, std::vector<Bucket> buckets,
                             Launch launch)
    : model_(model), comm_(comm), buckets_(std::move(buckets)), launch_(std::move(launch)) {
  if (!launch_)
    launch_ = [this](int, const Tensor& grads) { return comm_.all_reduce_async(grads); };
  const auto& params = model_.parameters();
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (int i : buckets_[b].params) bucket_of_[params.at(i)] = static_cast<int>(b);
  SCALELAB_CHECK(bucket_of_.size() == params.size(), "buckets hold {} of {} parameters",
                 bucket_of_.size(), params.size());
  pending_.resize(buckets_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    pending_[b] = static_cast<int>(buckets_[b].params.size());
}

void OverlappedDDP::attach() {
  model_.set_backward_hook([this](const std::vector<nn::Parameter*>& done) { on_ready(done); });
}

void OverlappedDDP::detach() { model_.set_backward_hook({}); }

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
  // TODO step 4: from backward's end to the last bucket done, never negative
  throw scalelab::NotImplemented(
      "lab 04 step 4: from backward's end to the last bucket done, never negative (README.md#step-4)");
}

double hidden_fraction(double exposed, double total) {
  // TODO step 4: 1 - exposed / total, clamped to [0, 1]
  throw scalelab::NotImplemented(
      "lab 04 step 4: 1 - exposed / total, clamped to [0, 1] (README.md#step-4)");
}

}  // namespace scalelab::lab04
