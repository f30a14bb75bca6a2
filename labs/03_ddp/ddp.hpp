#pragma once
/// @file ddp.hpp
/// Lab 03 contract: data-parallel training (DDP). Every rank holds a whole copy of the model,
/// computes gradients on its own rows of the global batch, and the ranks average their gradients
/// with one all-reduce, so every rank takes the same optimizer step as one device on the whole
/// batch would.
///
/// Every function takes the communicator it talks through, so the graders can run it on 1, 2
/// and 4 ranks and compare with the single-device run computed inside the test.
#include "common/comm/communicator.hpp"
#include "common/data/sampler.hpp"
#include "common/nn/gpt.hpp"

namespace scalelab::lab03 {

// ---- Step 1: one starting point ------------------------------------------------------------

/// Step 1. Makes every rank's parameters equal to rank 0's: ONE broadcast of the model's flat
/// parameter buffer (model.params().values()) from rank 0. The program initialises each rank
/// from a different seed, so without this the replicas train different models.
void broadcast_parameters(nn::GPT& model, comm::Communicator& comm);

// ---- Step 2: this rank's data ---------------------------------------------------------------

/// Step 2. Rows [rank*b, (rank+1)*b) of the global batch, b = B / world: a view, no copy. Every
/// rank gets different rows, and together they are the whole batch. Throws scalelab::UsageError
/// (one line naming B and world) when world > B ("more ranks than batch rows") or B % world != 0.
data::Batch local_batch(const data::Batch& global, int rank, int world);

// ---- Step 3: one gradient ---------------------------------------------------------------------

/// Step 3. After backward: every rank's gradient buffer becomes the AVERAGE of all ranks'
/// gradients: one all-reduce over the flat gradient buffer (model.params().grads()), then a
/// division by the world size. Each rank's loss is a mean over its own b rows, so the average
/// of the ranks' gradients is the gradient of the mean over all B rows: the single-device one.
void all_reduce_gradients(nn::GPT& model, comm::Communicator& comm);

// ---- Step 4: the training step --------------------------------------------------------------

/// Step 4a. One DDP forward + backward on the GLOBAL batch: zero the gradients, forward and
/// backward this rank's rows (step 2), average the gradients (step 3: all_reduce_gradients on the
/// unscaled backward's gradients, not a backward pre-divided by n). Returns the loss of the
/// whole global batch (the average of the ranks' losses: the same number on every rank, equal
/// to the single-device loss). The caller then steps its optimizer, identically on every rank.
double forward_backward(nn::GPT& model, const data::Batch& global, comm::Communicator& comm);

/// Step 4b. The largest |p - p on rank 0| over every parameter and rank: 0 when every replica
/// holds the same parameters. The same value on every rank (collective).
double parameter_divergence(nn::GPT& model, comm::Communicator& comm);

/// Why DDP (labs 03 and 04) refuses a mixture-of-experts --model (Session::require_dense).
inline constexpr const char* kDenseOnly =
    "each DDP rank would route only its rows, but an expert's capacity and the balancing loss "
    "depend on all the rows routed together";

}  // namespace scalelab::lab03
