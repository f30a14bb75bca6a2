// Lab 06, given: held_activation_bytes, the bytes the blocks hold right now (every block's
// activations plus its input), counted from the tensors themselves. Not an exercise: read it to
// see what step 4's model_activation_bytes is checked against.
#include "activation_checkpointing.hpp"

namespace scalelab::lab06 {

std::size_t held_activation_bytes(const Saved& saved) {
  std::size_t n = 0;
  for (const nn::BlockActivations& a : saved.acts.blocks) n += a.nbytes();
  for (const Tensor& t : saved.acts.inputs)
    if (t.defined()) n += t.nbytes();
  return n;
}

}  // namespace scalelab::lab06
