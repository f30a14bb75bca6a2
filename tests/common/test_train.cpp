// End to end on the host: `tiny` learns a small synthetic corpus, and runs are repeatable.
#include <gtest/gtest.h>

#include <cstdio>

#include "common/data/sampler.hpp"
#include "common/data/tokenizer.hpp"
#include "common/nn/gpt.hpp"
#include "common/optim/optim.hpp"

using namespace scalelab;

namespace {
// A hermetic corpus with structure to learn: a few sentences in a seeded random order.
std::vector<uint16_t> corpus() {
  const char* sentences[] = {"the cat sat on the mat. ", "a dog ran in the park. ",
                             "we like to eat bread. ", "birds fly over the sea. "};
  std::string text;
  uint64_t x = 12345;
  for (int i = 0; i < 800; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    text += sentences[(x >> 33) % 4];
  }
  return data::encode(text);
}

// Trains tiny for `steps` and returns the training losses and the final validation loss.
std::pair<std::vector<double>, double> train(int steps, uint64_t seed) {
  static const std::vector<uint16_t> tokens = corpus();
  const std::size_t n_train = tokens.size() * 9 / 10;
  static const std::vector<uint16_t> train_tokens(tokens.begin(), tokens.begin() + n_train),
      val_tokens(tokens.begin() + n_train, tokens.end());
  nn::GPT model(model_config("tiny"), {.seed = seed});
  optim::AdamW opt(optim::groups(model.parameters()), {0.9, 0.95, 1e-8, 0.0});
  data::Sampler sampler(train_tokens, 8, 16, seed);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    data::Batch b = sampler.batch(step);
    model.zero_grad();
    losses.push_back(model.forward(b.x, b.y));
    model.backward();
    optim::clip_grad_norm(optim::groups(model.parameters()), 1.0);
    opt.step(3e-3);
  }
  data::Sampler val(val_tokens, 16, 16, 777);
  double v = 0;
  for (int i = 0; i < 4; ++i) {
    data::Batch b = val.batch(i);
    v += model.loss(b.x, b.y) / 4;
  }
  return {losses, v};
}
}  // namespace

TEST(Train, TinyLearnsASmallCorpus) {
  // ln(256) = 5.55 at init; the corpus is four fixed sentences in random order, so almost every
  // byte is predictable. Bound: val < 0.8 after 300 steps (measured 0.31 on this build; a model
  // that only learned byte frequencies would sit near 2.8).
  auto [losses, val] = train(300, 1);
  std::printf("tiny after 300 steps: train loss %.3f, val loss %.3f\n", losses.back(), val);
  EXPECT_GT(losses.front(), 5.0);
  EXPECT_LT(val, 0.8);
}

TEST(Train, SameSeedSameLosses) {
  // bitwise: the host kernels are deterministic with a fixed number of BLAS threads
  auto a = train(15, 3), b = train(15, 3);
  EXPECT_EQ(a.first, b.first);
  auto c = train(15, 4);
  EXPECT_NE(a.first, c.first);
}
