#pragma once
// What lab 10's graders share: the model and data, the single-device reference cut to what one
// rank of a grid holds, the test's OWN 3D model (so step 3 is graded without the attendee's step
// 2), and the byte counts a 3D step must show per group.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "3d_parallel.hpp"
#include "common/comm/stats.hpp"
#include "common/errors.hpp"
#include "tests/support/lab_fixture.hpp"

namespace scalelab::lab10test {

// tiny (32 wide, context 16, vocabulary 256) with 4 layers (pp up to 4) and 4 heads (tp up to 4).
inline constexpr labtest::Setup kLab{.seed = 1010, .global_batch = 8, .corpus_seed = 10,
                                     .n_layer = 4};
ModelConfig config();

// Float64 throughout: the tp all-reduces and the dp average add the same numbers in another order
// than the single device, which in float64 moves the last of ~16 digits; these bounds leave room
// for that and nothing else (a wrong group or a missing term moves the gradients by O(1e-3)).
inline constexpr double kRtol = 1e-9, kAtol = 1e-12;

inline nn::GPTOptions f64() { return {.dtype = DType::f64, .seed = kLab.seed}; }
/// Mixed precision: fp32 master weights and gradients, a bf16 compute copy, bf16 activations.
inline nn::GPTOptions mixed() {
  return {.dtype = DType::f32, .seed = kLab.seed, .compute_dtype = DType::bf16};
}

/// The grids of `world` ranks the graders run (dp x tp x pp).
std::vector<lab10::GridShape> grids_for(int world);
std::string name(const lab10::GridShape& s);

/// The single-device step on `batch` (float64 unless `options` say otherwise, the same seed): its
/// model, with gradients.
std::unique_ptr<nn::GPT> reference_model(const data::Batch& batch,
                                         const nn::GPTOptions& options = f64());

/// What `local` (a 3D rank's model, parameter by parameter, in its flat order) should hold,
/// cut from the full reference tensors by each parameter's shard: the values (grads = false) or
/// the gradients. A stage's lm_head.weight is the tied wte: its gradient is wte's (both uses).
Tensor expected(const nn::GPT& local, nn::GPT& reference, bool grads);

/// The options of the test's own 3D model on g: lab 08's stage blocks, tp share, vocabulary rows
/// (lab07::vocab_range), on top of `base` (float64 and the test's seed by default).
nn::GPTOptions own_options(const lab10::Groups& g, const nn::GPTOptions& base = f64());

/// An nn::GPT of `options` (model `c`) talking through lab 07's mappings on `tp`
/// (lab07::TensorParallel: the blocks' f and g, the vocabulary-parallel ends) and, with
/// `checkpoint`, recomputing its blocks (lab10::FullCheckpoint): what step 2 composes, written
/// here so that the graders of later steps do not depend on the attendee's step 2.
std::unique_ptr<nn::GPT> own_stage(const ModelConfig& c, const nn::GPTOptions& options,
                                   comm::Communicator& tp, bool checkpoint = false);

/// The test's own 3D model (not the attendee's step 2): own_stage of own_options(g) (the
/// vocabulary-parallel ends on g.tp), the blocks' hooks set to lab 07's operators on g.tp.
/// pad_to: the flat layout padded to a multiple of it (ZeRO's shards).
std::unique_ptr<nn::GPT> own_model(lab10::Groups& g, int64_t pad_to = 1, bool checkpoint = false,
                                   const nn::GPTOptions& base = f64());

/// own_model as a lab10::ModelBuilder: what the graders of step 3 hand Trainer3D (issue 25,
/// class 8), so its pieces are the test's, not the attendee's step 2. `options` are Trainer3D's
/// (storage, ZeRO-3's hooks): the stage's layers, tp share and vocabulary rows go on top.
std::unique_ptr<nn::GPT> own_builder(const ModelConfig& c, lab10::Groups& g,
                                     nn::GPTOptions options, bool checkpoint);

/// Payload bytes of all-reduces on the communicator named `group` since `before`.
int64_t all_reduce_bytes(const comm::CommStats& before, const std::string& group);

/// The payload the tp group all-reduces in one training step of `model` (a 3D stage) on `rows`
/// rows per replica, whatever the micro-batches, activations in the model's compute dtype (the
/// cross-entropy's per-row numbers in ops::stats_dtype of it): lab 07's operators, per block 2
/// all-reduces of (rows, T, C) forward and 2 backward (+ 2 more with checkpointing: the
/// recomputed forward); the first stage's embedding 1 of (rows, T, C); the last stage's head f's
/// backward 1 of (rows, T, C) and the cross-entropy's 3 of (rows*T).
int64_t tp_bytes(const nn::GPT& model, int64_t rows, bool checkpoint = false);

/// `call()`, a call into the attendee's `what` ("lab10::step_3d"): a library check that fails
/// inside it (a CheckFailed thrown in common/: rows out of range, a collective's shapes) is
/// thrown again with the lab's function named first, so the report says which of the
/// attendee's functions was running and not only which line of common/ checked.
template <class F>
decltype(auto) calling(const std::string& what, F&& call) {
  try {
    return call();
  } catch (const CheckFailed& e) {
    throw CheckFailed(
        fmt::format("in {} (3d_parallel.cpp), a library check failed: {}", what, e.what()));
  }
}

}  // namespace scalelab::lab10test
