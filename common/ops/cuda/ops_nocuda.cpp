// Built without CUDA: the CUDA backend exists only to say so (a CUDA tensor cannot be made in such
// a build anyway; the allocator refuses first).
#include "common/ops/cuda/ops_cuda.hpp"

namespace scalelab::ops::cuda {
namespace {
[[noreturn]] void no_cuda() { throw UsageError("CUDA op called but scalelab was built without CUDA"); }
}  // namespace
void matmul(Tensor&, const Tensor&, const Tensor&, bool, bool, double, double, int64_t, int64_t,
            int64_t, int64_t) { no_cuda(); }
void fill(Tensor&, double) { no_cuda(); }
void scale(Tensor&, double) { no_cuda(); }
void axpy(Tensor&, double, const Tensor&) { no_cuda(); }
void add(Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void copy(Tensor&, const Tensor&) { no_cuda(); }
void cast(Tensor&, const Tensor&) { no_cuda(); }
void add_bias(Tensor&, const Tensor&) { no_cuda(); }
void bias_backward(Tensor&, const Tensor&) { no_cuda(); }
void gelu_forward(Tensor&, const Tensor&) { no_cuda(); }
void gelu_backward(Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void layernorm_forward(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       double) { no_cuda(); }
void layernorm_backward(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void softmax_forward(Tensor&, const Tensor&) { no_cuda(); }
void split_heads(Tensor&, Tensor&, Tensor&, const Tensor&, int64_t) { no_cuda(); }
void split_heads_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void merge_heads(Tensor&, const Tensor&) { no_cuda(); }
void merge_heads_backward(Tensor&, const Tensor&) { no_cuda(); }
void causal_softmax_forward(Tensor&, const Tensor&, double) { no_cuda(); }
void causal_softmax_backward(Tensor&, const Tensor&, const Tensor&, double) { no_cuda(); }
void embedding_forward(Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void embedding_backward(Tensor&, Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void embedding_backward_v1(Tensor&, Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void cross_entropy_forward(Tensor&, Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void cross_entropy_backward(Tensor&, const Tensor&, const Tensor&, double, int64_t) {
  no_cuda();
}
void row_max(Tensor&, const Tensor&) { no_cuda(); }
void exp_rows(Tensor&, Tensor&, const Tensor&) { no_cuda(); }
void divide_rows(Tensor&, const Tensor&) { no_cuda(); }
void pick_columns(Tensor&, const Tensor&, const Tensor&, int64_t) { no_cuda(); }
void gather_rows(Tensor&, const Tensor&, const Tensor&, int64_t) { no_cuda(); }
void index_add_rows(Tensor&, const Tensor&, const Tensor&, int64_t) { no_cuda(); }
void logarithm(Tensor&, const Tensor&) { no_cuda(); }
double sum(const Tensor&) { no_cuda(); }
double sum_squares(const Tensor&) { no_cuda(); }
void sum_into(Tensor&, const Tensor&, double) { no_cuda(); }
void sum_squares_into(Tensor&, const Tensor&) { no_cuda(); }
void clip_scale(Tensor&, const Tensor&, double) { no_cuda(); }
void sqrt_into(Tensor&, const Tensor&) { no_cuda(); }
void adamw_update_segments(Tensor&, const Tensor&, Tensor&, Tensor&, const DecaySegments&,
                           const AdamWArgs&, Tensor*) {
  no_cuda();
}
void adamw_update(Tensor&, const Tensor&, Tensor&, Tensor&, const AdamWArgs&, Tensor*) {
  no_cuda();
}
void sgd_update(Tensor&, const Tensor&, Tensor&, double, double, double, bool) { no_cuda(); }
void set_allow_tf32(bool) {}
void softmax_backward(Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void top_k(Tensor&, Tensor&, const Tensor&, int64_t) { no_cuda(); }
void top_k_backward(Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void normalize_rows(Tensor&, const Tensor&) { no_cuda(); }
void normalize_rows_backward(Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void moe_route(Tensor&, Tensor&, Tensor&, const Tensor&, int64_t, int64_t, int64_t) { no_cuda(); }
void multiply_rows(Tensor&, const Tensor&) { no_cuda(); }
void row_dot(Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
}  // namespace scalelab::ops::cuda
