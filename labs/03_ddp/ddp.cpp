// Starter generated from solutions/03_ddp/ddp.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 462f47fc6f6bcca3 (lets make-labs see your edits).
// Lab 03: DDP. Broadcast one starting point, give each rank its rows, average the gradients.
#include "ddp.hpp"

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"
#include "common/train/equivalence.hpp"
#include "common/train/global_loss.hpp"

namespace scalelab::lab03 {

void broadcast_parameters(nn::GPT& model, comm::Communicator& comm) {
  // TODO step 1: broadcast the flat parameter buffer from rank 0
  // HINT: model.params().values() is every parameter in one tensor: one collective is enough.
  throw scalelab::NotImplemented(
      "lab 03 step 1: broadcast the flat parameter buffer from rank 0 (README.md#step-1)");
}

data::Batch local_batch(const data::Batch& global, int rank, int world) {
  // TODO step 2: rows [rank*b, (rank+1)*b) of the global batch
  // HINT: check world <= B and B % world == 0 first (SCALELAB_REQUIRE throws a UsageError).
  // HINT: Batch::rows(begin, end) is a view of both x and y.
  throw scalelab::NotImplemented(
      "lab 03 step 2: rows [rank*b, (rank+1)*b) of the global batch (README.md#step-2)");
}

void all_reduce_gradients(nn::GPT& model, comm::Communicator& comm) {
  trace::Scope scope("all_reduce_gradients", "comm");
  // TODO step 3: all-reduce the flat gradient buffer and average it
  // HINT: the gradients are one flat buffer: one collective that leaves the sum on every rank,
  // HINT: then the division that turns the sum into the average (common/ops/ops.hpp).
  throw scalelab::NotImplemented(
      "lab 03 step 3: all-reduce the flat gradient buffer and average it (README.md#step-3)");
}

double forward_backward(nn::GPT& model, const data::Batch& global, comm::Communicator& comm) {
  // TODO step 4: zero grads, forward/backward this rank's rows, average gradients
  // HINT: model.zero_grad(), model.forward(x, y), model.backward() (README step 4); only this
  // HINT: rank's rows, on the model's device. The global loss is the average of the ranks' losses.
  throw scalelab::NotImplemented(
      "lab 03 step 4: zero grads, forward/backward this rank's rows, average gradients (README.md#step-4)");
}

double parameter_divergence(nn::GPT& model, comm::Communicator& comm) {
  // TODO step 4: largest difference from rank 0's parameters, over all ranks
  // HINT: common/train/equivalence.hpp has max_divergence_from_rank0.
  throw scalelab::NotImplemented(
      "lab 03 step 4: largest difference from rank 0's parameters, over all ranks (README.md#step-4)");
}

}  // namespace scalelab::lab03
