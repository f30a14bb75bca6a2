#pragma once
/// @file sampler.hpp
/// Batches drawn from (seed, step), never from a stream's position: the GLOBAL batch of a step is
/// the same whatever the number of ranks, so every parallel lab sees exactly the single-device
/// data. Which rows of it a rank or a micro-batch takes is the labs' business (lab 03 step 2,
/// lab 05 step 1): Batch::rows is the view they take them with.
///
///   data::Sampler train(tokens, /*global_batch=*/16, /*T=*/64, seed);
///   data::Batch first_half = train.batch(step).rows(0, 8);
#include <cstdint>
#include <vector>

#include "common/tensor.hpp"

namespace scalelab::data {

/// Inputs and targets (the inputs shifted by one token), (B, T) i32 on the host.
struct Batch {
  Tensor x;  ///< (B, T) the input tokens
  Tensor y;  ///< (B, T) the targets: each input's next token
  /// Rows [begin, end) of both: a view.
  Batch rows(int64_t begin, int64_t end) const { return {x.rows(begin, end), y.rows(begin, end)}; }
  /// Both on `device` (a copy).
  Batch to(Device device) const { return {x.to(device), y.to(device)}; }
  /// B: its rows.
  int64_t batch_size() const { return x.size(0); }
};

/// Draws the global batch of a step from a token split, deterministically from (seed, step): every
/// rank draws the same batch and takes its rows, and the single-device twin draws it too.
class Sampler {
 public:
  /// tokens: the split's ids (kept by reference: it must outlive the sampler).
  Sampler(const std::vector<uint16_t>& tokens, int64_t global_batch, int64_t block_size,
          uint64_t seed);
  /// The global batch of `step`: row i starts at an offset drawn from (seed, step, i).
  Batch batch(int64_t step) const;
  /// B: the rows of every batch.
  int64_t global_batch() const { return batch_; }
  /// T: the tokens of every row.
  int64_t block_size() const { return T_; }

 private:
  const std::vector<uint16_t>& tokens_;
  int64_t batch_, T_;
  uint64_t seed_;
};

}  // namespace scalelab::data
