#include "common/data/sampler.hpp"

#include <random>

namespace scalelab::data {

Sampler::Sampler(const std::vector<uint16_t>& tokens, int64_t global_batch, int64_t block_size,
                 uint64_t seed)
    : tokens_(tokens), batch_(global_batch), T_(block_size), seed_(seed) {
  SCALELAB_REQUIRE(global_batch > 0, "batch size must be positive, got {}", global_batch);
  SCALELAB_REQUIRE(block_size > 0, "context length must be positive, got {}", block_size);
  SCALELAB_REQUIRE(static_cast<int64_t>(tokens.size()) > block_size + 1,
                   "the data has {} tokens, too few for a context of {}", tokens.size(),
                   block_size);
}

Batch Sampler::batch(int64_t step) const {
  Batch b{Tensor::empty({batch_, T_}, DType::i32), Tensor::empty({batch_, T_}, DType::i32)};
  // one generator per step, seeded from (seed, step): any step can be drawn in any order
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32),
                    static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32)};
  std::mt19937_64 rng(seq);
  // start positions 0 .. n-T-1: the last target, start + T, is still in the data
  const uint64_t span = tokens_.size() - static_cast<uint64_t>(T_);
  int32_t* x = b.x.data<int32_t>();
  int32_t* y = b.y.data<int32_t>();
  for (int64_t i = 0; i < batch_; ++i) {
    const uint64_t start = rng() % span;
    for (int64_t t = 0; t < T_; ++t) {
      x[i * T_ + t] = tokens_[start + t];
      y[i * T_ + t] = tokens_[start + t + 1];
    }
  }
  return b;
}

}  // namespace scalelab::data
