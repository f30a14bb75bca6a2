// The loss average over ranks (global_loss.hpp).
#include "common/train/global_loss.hpp"

#include "common/tensor.hpp"

namespace scalelab::train {

double global_loss(double local_mean, comm::Communicator& group) {
  Tensor l = Tensor::from_vector({local_mean}, {1}, DType::f64);
  group.all_reduce(l, comm::ReduceOp::sum);
  return l.item() / group.size();
}

}  // namespace scalelab::train
