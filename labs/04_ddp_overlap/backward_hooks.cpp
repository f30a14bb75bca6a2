// Lab 04, given: the plumbing between the model's backward hook and the overlapped reducer.
// ready_order (the order backward reports gradients as final, recorded from the hook) and
// OverlappedDDP's constructor, attach and detach (the bookkeeping on_ready counts against, and
// installing or removing on_ready as the hook). Not an exercise: read it to see how the hook
// reaches your on_ready() and where step 1's ready order comes from.
#include "ddp_overlap.hpp"

#include <algorithm>

#include "common/errors.hpp"

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

}  // namespace scalelab::lab04
