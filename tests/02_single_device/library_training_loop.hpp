#pragma once
/// @file library_training_loop.hpp
/// The LIBRARY's training loop (common/optim's clip_grad_norm and cosine_lr), which the graders
/// of lab 02 run beside the attendee's code: step 3 trains a model to evaluate without going
/// through the attendee's steps 1-2 (each step is graded on its own), and step 2 compares the
/// attendee's train_step with clipping against this step. It is not lab 02's answer to read: the
/// lab writes its own train_step, learning_rate and clip_gradients (the library's versions are
/// for the later labs).
#include "common/data/sampler.hpp"
#include "common/nn/gpt.hpp"
#include "common/optim/optim.hpp"
#include "common/scalar.hpp"
#include "single_device.hpp"

namespace scalelab::lab02test {

/// One step of the library's loop on `batch`; `norm` (if given) receives the gradient norm
/// before clipping (clip > 0 only).
inline double library_train_step(nn::GPT& model, optim::AdamW& opt, const data::Batch& batch,
                                 double lr, double clip, double* norm = nullptr) {
  model.zero_grad();
  const Scalar loss = model.forward(batch.x, batch.y);
  model.backward();
  if (clip > 0) {
    const Scalar n = optim::clip_grad_norm(optim::groups(model.parameters()), clip);
    if (norm != nullptr) *norm = n;
  }
  opt.step(lr);
  return loss;
}

/// config.steps steps of the library's loop on batches 0 .. steps-1 of `train`, at the library's
/// schedule (config's rates and warmup) and clipping (config.clip).
inline void library_train(nn::GPT& model, optim::AdamW& opt, const data::Sampler& train,
                          const lab02::TrainConfig& config) {
  for (int64_t step = 0; step < config.steps; ++step)
    library_train_step(model, opt, train.batch(step),
                       optim::cosine_lr(step, config.warmup, config.steps, config.max_lr,
                                        config.min_lr),
                       config.clip);
}

}  // namespace scalelab::lab02test
