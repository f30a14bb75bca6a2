// Built without CUDA: the fused ops' CUDA backend exists only to say so (like ops_nocuda.cpp).
#include "common/errors.hpp"
#include "common/ops/fused_backend.hpp"

namespace scalelab::ops::cuda {
namespace {
[[noreturn]] void no_cuda() { throw UsageError("CUDA op called but scalelab was built without CUDA"); }
}  // namespace
bool flash_attention_forward(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const AttentionLayout&, double, bool) { no_cuda(); }
bool flash_attention_backward(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const AttentionLayout&, double, bool) { no_cuda(); }
void attention_merge(Tensor&, Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void residual_layernorm_forward(Tensor&, Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, const Tensor&, double) { no_cuda(); }
bool layernorm_backward_v2(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
bool layernorm_backward_v3(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
bool bias_backward_v2(Tensor&, const Tensor&) { no_cuda(); }
bool add_16_bytes(Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
int last_sum_blocks() { no_cuda(); }
int last_flash_attention_version() { return 0; }  // no CUDA: no CUDA call ran
FlashV2Kernels last_flash_v2_kernels() { return {}; }  // none ran
bool linear_epilogue(Tensor&, Tensor*, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
bool linear_dgelu_epilogue(Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
bool linear_bgrad_epilogue(Tensor&, Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
}  // namespace scalelab::ops::cuda
