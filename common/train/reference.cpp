#include "common/train/reference.hpp"

#include <random>
#include <string>

#include "common/optim/optim.hpp"

namespace scalelab::train {

Reference single_device_step(const ModelConfig& config, uint64_t seed, const data::Batch& batch) {
  nn::GPT model(config, {.seed = seed});
  model.zero_grad();
  Reference r;
  r.loss = model.forward(batch.x, batch.y);
  model.backward();
  r.grads = model.params().grads().clone();
  return r;
}

SgdRun single_device_sgd(const ModelConfig& config, uint64_t seed, const data::Sampler& sampler,
                         int steps, double lr) {
  nn::GPT model(config, {.seed = seed});
  optim::SGD sgd(optim::groups(model.parameters()));
  SgdRun run;
  for (int step = 0; step < steps; ++step) {
    const data::Batch b = sampler.batch(step);
    model.zero_grad();
    run.losses.push_back(model.forward(b.x, b.y));
    model.backward();
    sgd.step(lr);
  }
  run.params = model.params().values().clone();
  return run;
}

std::vector<uint16_t> synthetic_corpus(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::string phrase = "in the beginning was the word ";
  std::vector<uint16_t> tokens(n);
  for (int64_t i = 0; i < n; ++i)
    tokens[i] = rng() % 4 == 0 ? static_cast<uint16_t>('a' + rng() % 26)
                               : static_cast<uint16_t>(phrase[i % phrase.size()]);
  return tokens;
}

ModelConfig test_config(int64_t n_layer) {
  ModelConfig c = model_config("tiny");
  c.n_layer = n_layer;
  return c;
}

}  // namespace scalelab::train
