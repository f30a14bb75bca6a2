// Lab 03: DDP. Broadcast one starting point, give each rank its rows, average the gradients.
#include "ddp.hpp"

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/global_loss.hpp"

namespace scalelab::lab03 {

void broadcast_parameters(nn::GPT& model, comm::Communicator& comm) {
  // BEGIN SOLUTION step 1: broadcast the flat parameter buffer from rank 0
  // HINT: model.params().values() is every parameter in one tensor: one collective is enough.
  comm.broadcast(model.params().values(), 0);
  // END SOLUTION
}

data::Batch local_batch(const data::Batch& global, int rank, int world) {
  // BEGIN SOLUTION step 2: rows [rank*b, (rank+1)*b) of the global batch
  // HINT: check world <= B and B % world == 0 first (SCALELAB_REQUIRE throws a UsageError).
  // HINT: Batch::rows(begin, end) is a view of both x and y.
  const int64_t B = global.batch_size();
  SCALELAB_REQUIRE(world <= B, "more ranks ({}) than rows in the global batch ({}): use "
                   "--batch {} or more, or fewer ranks", world, B, world);
  SCALELAB_REQUIRE(B % world == 0, "a global batch of {} rows does not split evenly over {} "
                   "ranks: make --batch a multiple of {}", B, world, world);
  const int64_t b = B / world;
  return global.rows(rank * b, (rank + 1) * b);
  // END SOLUTION
}

void all_reduce_gradients(nn::GPT& model, comm::Communicator& comm) {
  trace::Scope scope("all_reduce_gradients", "comm");
  // BEGIN SOLUTION step 3: all-reduce the flat gradient buffer and average it
  // HINT: the gradients are one flat buffer: one collective that leaves the sum on every rank,
  // HINT: then the division that turns the sum into the average (common/ops/ops.hpp).
  Tensor& g = model.params().grads();
  comm.all_reduce(g, comm::ReduceOp::sum);
  ops::scale(g, 1.0 / comm.size());
  // END SOLUTION
}

double forward_backward(nn::GPT& model, const data::Batch& global, comm::Communicator& comm) {
  // BEGIN SOLUTION step 4: zero grads, forward/backward this rank's rows, average gradients
  // HINT: model.zero_grad(), model.forward(x, y), model.backward() (README step 4); only this
  // HINT: rank's rows, on the model's device. The global loss is the average of the ranks' losses.
  model.zero_grad();
  const data::Batch mine = local_batch(global, comm.rank(), comm.size()).to(model.device());
  Scalar loss;  // on the model's device: read once, when the caller prints it
  {
    trace::Scope scope("forward");
    loss = model.forward(mine.x, mine.y);
  }
  {
    trace::Scope scope("backward");
    model.backward();
  }
  all_reduce_gradients(model, comm);
  return train::global_loss(loss, comm);
  // END SOLUTION
}

double parameter_divergence(nn::GPT& model, comm::Communicator& comm) {
  // BEGIN SOLUTION step 4: largest difference from rank 0's parameters, over all ranks
  // HINT: common/train/equivalence.hpp has max_divergence_from_rank0.
  return train::max_divergence_from_rank0(model.params().values(), comm);
  // END SOLUTION
}

}  // namespace scalelab::lab03
