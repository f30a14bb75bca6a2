// Dispatch of flash attention: check shapes, dtypes and devices once, then call the backend.
#include "common/ops/flash_attention.hpp"

#include <cstdlib>
#include <string>

#include "common/exec_log.hpp"
#include "common/ops/device_dispatch.hpp"
#include "common/ops/fused_backend.hpp"
#include "common/trace.hpp"
#include "common/ops/ops.hpp"
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

void check_lse(const char* op, const Tensor& lse, int64_t BH, int64_t T, DType dtype,
               Device device) {
  const std::vector<int64_t> shape = {BH, T};
  SCALELAB_CHECK(lse.defined() && lse.is_contiguous() && lse.shape() == shape &&
                     lse.dtype() == flash_attention_lse_dtype(dtype) && lse.device() == device,
                 "{}: lse {} is not ({}, {}) {} on {}", op, lse.defined() ? lse.str() : "undefined",
                 BH, T, dtype_name(flash_attention_lse_dtype(dtype)), device.str());
}
void check_lse(const char* op, const Tensor& lse, const Tensor& q) {
  check_lse(op, lse, q.size(0), q.size(1), q.dtype(), q.device());
}

// The layout of flash_attention_forward's (BH, T, hs) tensors.
AttentionLayout packed_layout(const Tensor& q) {
  const int64_t BH = q.size(0), T = q.size(1), hs = q.size(2);
  AttentionLayout l;
  l.B = BH, l.NH = 1, l.T = T, l.hs = hs;
  l.in_batch = l.out_batch = T * hs;
  l.in_ld = l.out_ld = hs;
  return l;
}

// The layout of the fused QKV output (B, T, 3C) and of y (B, T, C), after checking them.
AttentionLayout qkv_layout(const char* op, const Tensor& qkv, const Tensor& y, const Tensor& lse,
                           int64_t n_head) {
  SCALELAB_CHECK(qkv.defined() && qkv.dim() == 3 && qkv.is_contiguous() && n_head >= 1 &&
                     qkv.size(2) % (3 * n_head) == 0,
                 "{}: qkv {} is not (B, T, 3C) with C a multiple of n_head {}", op,
                 qkv.defined() ? qkv.str() : "undefined", n_head);
  SCALELAB_CHECK(qkv.dtype() == DType::f32 || qkv.dtype() == DType::f64 ||
                     qkv.dtype() == DType::bf16,
                 "{}: dtype {} (f32, f64 or bf16)", op, dtype_name(qkv.dtype()));
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hs = C / n_head;
  const std::vector<int64_t> y_shape = {B, T, C};
  SCALELAB_CHECK(y.defined() && y.is_contiguous() && y.shape() == y_shape &&
                     y.dtype() == qkv.dtype() && y.device() == qkv.device(),
                 "{}: y {} is not ({}, {}, {}) of qkv's dtype and device", op,
                 y.defined() ? y.str() : "undefined", B, T, C);
  check_lse(op, lse, B * n_head, T, qkv.dtype(), qkv.device());
  AttentionLayout l;
  l.B = B, l.NH = n_head, l.T = T, l.hs = hs;
  l.in_batch = T * 3 * C, l.in_head = hs, l.in_ld = 3 * C;
  l.q_off = 0, l.k_off = C, l.v_off = 2 * C;
  l.out_batch = T * C, l.out_head = hs, l.out_ld = C;
  return l;
}

// The version chosen by SCALELAB_FLASH_ATTENTION_VERSION (1 without it).
int version_from_environment() {
  const char* v = std::getenv("SCALELAB_FLASH_ATTENTION_VERSION");
  if (!v || !*v) return 2;  // where it applies; measured faster than version 1 and the unfused path
  const std::string s(v);
  if (s != "1" && s != "2")
    throw UsageError("SCALELAB_FLASH_ATTENTION_VERSION=" + s + ": 1 or 2");
  return s == "1" ? 1 : 2;
}
int g_version = 0;  // 0: not read yet
}  // namespace

void set_flash_attention_version(int version) {
  SCALELAB_CHECK(version == 1 || version == 2, "flash attention version {} (1 or 2)", version);
  g_version = version;
}

int flash_attention_version() {
  if (g_version == 0) g_version = version_from_environment();
  return g_version;
}

DType flash_attention_lse_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, double scale, bool causal) {
  check_qkv_like("flash_attention_forward", q, {&q, &k, &v, &out});
  check_lse("flash_attention_forward", lse, q);
  count_attention(q.size(0), q.size(1), q.size(2), causal, /*backward=*/false);
  // Compute a lab overlaps with communication (lab 11's ring blocks): logged, hooked, traced.
  exec_log::record_compute("flash_attention_forward");
  trace::Scope span("flash_attention_forward");
  const AttentionLayout l = packed_layout(q);
  const SimKernelScope in_kernel;  // the simulated GPU's memory is the CPU kernel's (tensor.hpp)
  const bool done = q.device().is_cuda()
                        ? cuda::flash_attention_forward(out, lse, q, k, v, l, scale, causal)
                        : cpu::flash_attention_forward(out, lse, q, k, v, l, scale, causal);
  SCALELAB_CHECK(done, "flash_attention_forward: no kernel for (BH, T, hs) tensors");
}

void flash_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, double scale, bool causal) {
  check_qkv_like("flash_attention_backward", q, {&q, &k, &v, &out, &dout, &dq, &dk, &dv});
  check_lse("flash_attention_backward", lse, q);
  count_attention(q.size(0), q.size(1), q.size(2), causal, /*backward=*/true);
  exec_log::record_compute("flash_attention_backward");
  trace::Scope span("flash_attention_backward");
  const AttentionLayout l = packed_layout(q);
  const SimKernelScope in_kernel;
  const bool done =
      q.device().is_cuda()
          ? cuda::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, l, scale, causal)
          : cpu::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, l, scale, causal);
  SCALELAB_CHECK(done, "flash_attention_backward: no kernel for (BH, T, hs) tensors");
}

void flash_attention_qkv_forward(Tensor& y, Tensor& lse, const Tensor& qkv, int64_t n_head,
                                 double scale, bool causal) {
  const AttentionLayout l = qkv_layout("flash_attention_qkv_forward", qkv, y, lse, n_head);
  count_attention(l.B * l.NH, l.T, l.hs, causal, /*backward=*/false);
  exec_log::record_compute("flash_attention_forward");
  trace::Scope span("flash_attention_forward");
  if (!qkv.device().is_cuda()) {
    const SimKernelScope in_kernel;
    cpu::flash_attention_forward(y, lse, qkv, qkv, qkv, l, scale, causal);
    return;
  }
  if (cuda::flash_attention_forward(y, lse, qkv, qkv, qkv, l, scale, causal)) return;
  // No kernel reads this layout (CUDA's version 1): split the heads, attend, merge them back.
  auto heads = [&] { return Tensor::empty({l.B, l.NH, l.T, l.hs}, qkv.dtype(), qkv.device()); };
  Tensor q = heads(), k = heads(), v = heads(), yh = heads();
  split_heads(q, k, v, qkv, l.NH);
  const std::vector<int64_t> flat = {l.B * l.NH, l.T, l.hs};
  Tensor q3 = q.view(flat), k3 = k.view(flat), v3 = v.view(flat), yh3 = yh.view(flat);
  SCALELAB_CHECK(cuda::flash_attention_forward(yh3, lse, q3, k3, v3, packed_layout(q3), scale,
                                               causal),
                 "flash_attention_qkv_forward: no kernel for (BH, T, hs) tensors");
  merge_heads(y, yh);
}

void flash_attention_qkv_backward(Tensor& dqkv, const Tensor& dy, const Tensor& qkv,
                                  const Tensor& y, const Tensor& lse, int64_t n_head,
                                  double scale, bool causal) {
  const AttentionLayout l = qkv_layout("flash_attention_qkv_backward", qkv, y, lse, n_head);
  SCALELAB_CHECK(dqkv.defined() && dqkv.shape() == qkv.shape() && dqkv.is_contiguous() &&
                     dqkv.dtype() == qkv.dtype() && dqkv.device() == qkv.device() &&
                     dy.defined() && dy.shape() == y.shape() && dy.is_contiguous() &&
                     dy.dtype() == y.dtype() && dy.device() == y.device(),
                 "flash_attention_qkv_backward: dqkv {} / dy {} are not qkv's / y's shape, dtype "
                 "and device",
                 dqkv.defined() ? dqkv.str() : "undefined", dy.defined() ? dy.str() : "undefined");
  count_attention(l.B * l.NH, l.T, l.hs, causal, /*backward=*/true);
  exec_log::record_compute("flash_attention_backward");
  trace::Scope span("flash_attention_backward");
  if (!qkv.device().is_cuda()) {
    const SimKernelScope in_kernel;
    cpu::flash_attention_backward(dqkv, dqkv, dqkv, dy, qkv, qkv, qkv, y, lse, l, scale, causal);
    return;
  }
  if (cuda::flash_attention_backward(dqkv, dqkv, dqkv, dy, qkv, qkv, qkv, y, lse, l, scale,
                                     causal))
    return;
  auto heads = [&] { return Tensor::empty({l.B, l.NH, l.T, l.hs}, qkv.dtype(), qkv.device()); };
  Tensor q = heads(), k = heads(), v = heads(), yh = heads(), dyh = heads(), dq = heads(),
         dk = heads(), dv = heads();
  split_heads(q, k, v, qkv, l.NH);
  merge_heads_backward(yh, y);  // (B, T, C) -> (B, NH, T, hs): y's heads split again
  merge_heads_backward(dyh, dy);
  const std::vector<int64_t> flat = {l.B * l.NH, l.T, l.hs};
  Tensor dq3 = dq.view(flat), dk3 = dk.view(flat), dv3 = dv.view(flat);
  const Tensor q3 = q.view(flat);
  SCALELAB_CHECK(cuda::flash_attention_backward(dq3, dk3, dv3, dyh.view(flat), q3, k.view(flat),
                                                v.view(flat), yh.view(flat), lse,
                                                packed_layout(q3), scale, causal),
                 "flash_attention_qkv_backward: no kernel for (BH, T, hs) tensors");
  split_heads_backward(dqkv, dq, dk, dv);
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  check_qkv_like("attention_merge", out, {&out, &out_b});
  check_lse("attention_merge", lse, out);
  check_lse("attention_merge", lse_b, out);
  exec_log::record_compute("attention_merge");
  trace::Scope span("attention_merge");
  SCALELAB_DISPATCH(out.device(), attention_merge(out, lse, out_b, lse_b));
}

}  // namespace scalelab::ops
