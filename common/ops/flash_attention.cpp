// Dispatch of flash attention: check shapes, dtypes and devices once, then call the backend.
#include "common/ops/flash_attention.hpp"

#include "common/exec_log.hpp"
#include "common/ops/fused_backend.hpp"
#include "common/trace.hpp"
#include "common/ops/work.hpp"

namespace scalelab::ops {

namespace {
void check_qkv_like(const char* op, const Tensor& ref, std::initializer_list<const Tensor*> all) {
  SCALELAB_CHECK(ref.defined() && ref.dim() == 3, "{}: q {} is not (BH, T, hs)", op,
                 ref.defined() ? ref.str() : "undefined");
  SCALELAB_CHECK(ref.dtype() == DType::f32 || ref.dtype() == DType::f64 ||
                     ref.dtype() == DType::bf16,
                 "{}: dtype {} (f32, f64 or bf16)", op, dtype_name(ref.dtype()));
  for (const Tensor* t : all) {
    SCALELAB_CHECK(t->defined() && t->is_contiguous(), "{}: undefined or non-contiguous tensor",
                   op);
    SCALELAB_CHECK(t->shape() == ref.shape(), "{}: {} is not the shape of q {}", op, t->str(),
                   ref.str());
    SCALELAB_CHECK(t->dtype() == ref.dtype() && t->device() == ref.device(),
                   "{}: {} is not of q's dtype and device ({})", op, t->str(), ref.str());
  }
}

void check_lse(const char* op, const Tensor& lse, const Tensor& q) {
  const std::vector<int64_t> shape = {q.size(0), q.size(1)};
  SCALELAB_CHECK(lse.defined() && lse.is_contiguous() && lse.shape() == shape &&
                     lse.dtype() == flash_attention_lse_dtype(q.dtype()) &&
                     lse.device() == q.device(),
                 "{}: lse {} is not ({}, {}) {} on {}", op, lse.defined() ? lse.str() : "undefined",
                 q.size(0), q.size(1), dtype_name(flash_attention_lse_dtype(q.dtype())),
                 q.device().str());
}
}  // namespace

DType flash_attention_lse_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, double scale, bool causal) {
  check_qkv_like("flash_attention_forward", q, {&q, &k, &v, &out});
  check_lse("flash_attention_forward", lse, q);
  count_attention(q.size(0), q.size(1), q.size(2), causal, /*backward=*/false);
  // Compute a lab overlaps with communication (lab 11's ring blocks): logged, hooked, traced.
  exec_log::record_compute("flash_attention_forward");
  trace::Scope span("flash_attention_forward");
  if (q.device().is_cpu()) cpu::flash_attention_forward(out, lse, q, k, v, scale, causal);
  else cuda::flash_attention_forward(out, lse, q, k, v, scale, causal);
}

void flash_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, double scale, bool causal) {
  check_qkv_like("flash_attention_backward", q, {&q, &k, &v, &out, &dout, &dq, &dk, &dv});
  check_lse("flash_attention_backward", lse, q);
  count_attention(q.size(0), q.size(1), q.size(2), causal, /*backward=*/true);
  exec_log::record_compute("flash_attention_backward");
  trace::Scope span("flash_attention_backward");
  if (q.device().is_cpu())
    cpu::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, causal);
  else cuda::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, causal);
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  check_qkv_like("attention_merge", out, {&out, &out_b});
  check_lse("attention_merge", lse, out);
  check_lse("attention_merge", lse_b, out);
  exec_log::record_compute("attention_merge");
  trace::Scope span("attention_merge");
  if (out.device().is_cpu()) cpu::attention_merge(out, lse, out_b, lse_b);
  else cuda::attention_merge(out, lse, out_b, lse_b);
}

}  // namespace scalelab::ops
