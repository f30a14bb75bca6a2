// The loss average over ranks (global_loss.hpp).
#include "common/train/global_loss.hpp"

#include "common/tensor.hpp"

namespace scalelab::train {

double global_loss(double local_mean, comm::Communicator& group) {
  Tensor l = Tensor::from_vector({local_mean}, {1}, DType::f64);
  group.all_reduce(l, comm::ReduceOp::sum);
  return l.item() / group.size();
}

Scalar global_loss(const Scalar& local_mean, comm::Communicator& group) {
  if (!local_mean.tensor().defined()) return global_loss(local_mean.value(), group);
  Tensor l = local_mean.tensor().clone();  // all-reduced in place: the caller's stays as it was
  group.all_reduce(l, comm::ReduceOp::sum);
  return Scalar(l) / group.size();
}

}  // namespace scalelab::train
