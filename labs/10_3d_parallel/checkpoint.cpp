// Lab 10, given: full activation checkpointing (lab 06's idea) as a block policy at nn::GPT's
// hook points. Not an exercise: read it to see how little a policy needs.
#include "3d_parallel.hpp"

#include "common/trace.hpp"

namespace scalelab::lab10 {

// The forward has filled the block's activations: drop them (the model keeps the block's input).
void FullCheckpoint::after_forward(const nn::Block& /*block*/, const Tensor& /*input*/,
                                   nn::BlockActivations& acts, int64_t /*seq_len*/) {
  acts.reset();
}

// Right before the block's backward: compute them again from its input (the output is not needed
// again), so one block's activations exist at a time.
void FullCheckpoint::before_backward(const nn::Block& block, const Tensor& input,
                                     nn::BlockActivations& acts, int64_t seq_len) {
  trace::Scope scope("recompute");
  block.forward(input, acts, seq_len);
}

}  // namespace scalelab::lab10
