#pragma once
/// @file global_loss.hpp
/// The loss of the whole global batch from each rank's share: the one place every training
/// program (labs 03-11) averages its loss over ranks.
///
///   const Scalar local = model.forward(mine.x, mine.y);   // the mean over this rank's rows
///   const Scalar loss = train::global_loss(local, comm);  // the mean over the global batch
///   fmt::print("loss {:.4f}\n", loss.value());           // the step's one read to the host
#include "common/comm/communicator.hpp"
#include "common/scalar.hpp"

namespace scalelab::train {

/// The mean over `group` of each rank's mean loss, on every rank: the global batch's mean loss
/// when every rank holds as many rows (and tokens) as the others, as data parallelism's equal
/// shares do. A host value: on an nccl group it goes over the group's MPI communicator
/// (common/comm/route.hpp), so it never waits behind the gradients on the GPU. Summed in f64
/// and divided once, so the same on every rank and bitwise that of a one-rank run for one rank.
/// Collective over `group`.
double global_loss(double local_mean, comm::Communicator& group);
/// The same for a loss that lives on a device: the all-reduce runs there (NCCL on a GPU, queued
/// behind the step's kernels) and the mean stays there, so nothing waits for the GPU until the
/// loss is read. A host number takes the host path above. Every rank must pass its loss from
/// the same place (all host numbers, or all on their devices): on an nccl group a host number
/// goes over MPI and a CUDA loss over NCCL, and two ranks in different collectives wait for
/// each other until the watchdog ends the job (its report names each rank's transport). A rank
/// with nothing to add passes a zero on its device (Scalar(Tensor::zeros({1}, f64, device))).
Scalar global_loss(const Scalar& local_mean, comm::Communicator& group);

}  // namespace scalelab::train
