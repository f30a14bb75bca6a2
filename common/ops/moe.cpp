// Dispatch of the mixture-of-experts ops (moe.hpp): check shapes, dtypes and devices once, then
// call the tensors' device's backend.
#include "common/ops/moe.hpp"

#include "common/ops/cpu/ops_cpu.hpp"
#include "common/ops/cuda/ops_cuda.hpp"
#include "common/ops/device_dispatch.hpp"

namespace scalelab::ops {

namespace {

void check_defined(const char* op, std::initializer_list<const Tensor*> all) {
  const Device d = (*all.begin())->device();
  for (const Tensor* t : all) {
    SCALELAB_CHECK(t->defined() && t->is_contiguous(), "{}: undefined or non-contiguous tensor",
                   op);
    SCALELAB_CHECK(t->device() == d, "{}: tensors on {} and {}", op, d.str(), t->device().str());
  }
}

void check_router(const char* op, const Tensor& t, const std::vector<int64_t>& shape,
                  DType dtype) {
  SCALELAB_CHECK(t.shape() == shape && t.dtype() == dtype,
                 "{}: {} is not ({}) {}", op, t.str(), fmt::join(shape, ", "), dtype_name(dtype));
}

void check_float(const char* op, const Tensor& x) {
  SCALELAB_CHECK(x.dim() == 2 && (x.dtype() == DType::f32 || x.dtype() == DType::f64),
                 "{}: {} is not (N, E) f32 or f64 (the router runs in fp32)", op, x.str());
}

void check_i32(const char* op, const Tensor& t, const std::vector<int64_t>& shape) {
  SCALELAB_CHECK(t.dtype() == DType::i32 && t.shape() == shape, "{}: {} is not ({}) i32", op,
                 t.str(), fmt::join(shape, ", "));
}

void check_data_rows(const char* op, const Tensor& x) {
  SCALELAB_CHECK(x.dim() == 2 && (x.dtype() == DType::f32 || x.dtype() == DType::f64 ||
                                  x.dtype() == DType::bf16),
                 "{}: {} is not (M, C) f32, f64 or bf16", op, x.str());
}

}  // namespace

void softmax_backward(Tensor& din, const Tensor& out, const Tensor& dout) {
  check_defined("softmax_backward", {&din, &out, &dout});
  check_float("softmax_backward", out);
  check_router("softmax_backward", din, out.shape(), out.dtype());
  check_router("softmax_backward", dout, out.shape(), out.dtype());
  SCALELAB_DISPATCH(out.device(), softmax_backward(din, out, dout));
}

void top_k(Tensor& values, Tensor& indices, const Tensor& x, int64_t k) {
  check_defined("top_k", {&x, &values, &indices});
  check_float("top_k", x);
  SCALELAB_CHECK(k >= 1 && k <= x.size(1), "top_k: k = {} of {} columns", k, x.size(1));
  check_router("top_k", values, {x.size(0), k}, x.dtype());
  check_i32("top_k", indices, {x.size(0), k});
  SCALELAB_DISPATCH(x.device(), top_k(values, indices, x, k));
}

void top_k_backward(Tensor& dx, const Tensor& dvalues, const Tensor& indices) {
  check_defined("top_k_backward", {&dx, &dvalues, &indices});
  check_float("top_k_backward", dx);
  check_router("top_k_backward", dvalues, indices.shape(), dx.dtype());
  SCALELAB_CHECK(indices.dim() == 2 && indices.size(0) == dx.size(0) &&
                     indices.dtype() == DType::i32,
                 "top_k_backward: indices {} are not (N, k) i32 for dx {}", indices.str(),
                 dx.str());
  SCALELAB_DISPATCH(dx.device(), top_k_backward(dx, dvalues, indices));
}

void normalize_rows(Tensor& out, const Tensor& in) {
  check_defined("normalize_rows", {&out, &in});
  check_float("normalize_rows", in);
  check_router("normalize_rows", out, in.shape(), in.dtype());
  SCALELAB_DISPATCH(in.device(), normalize_rows(out, in));
}

void normalize_rows_backward(Tensor& din, const Tensor& dout, const Tensor& in) {
  check_defined("normalize_rows_backward", {&din, &dout, &in});
  check_float("normalize_rows_backward", in);
  check_router("normalize_rows_backward", din, in.shape(), in.dtype());
  check_router("normalize_rows_backward", dout, in.shape(), in.dtype());
  SCALELAB_DISPATCH(in.device(), normalize_rows_backward(din, dout, in));
}

void moe_route(Tensor& dest, Tensor& assigned, Tensor& kept, const Tensor& indices,
               int64_t n_expert, int64_t groups, int64_t capacity) {
  check_defined("moe_route", {&indices, &dest, &assigned, &kept});
  SCALELAB_CHECK(indices.dim() == 2 && indices.dtype() == DType::i32,
                 "moe_route: indices {} are not (N, k) i32", indices.str());
  const int64_t N = indices.size(0);
  SCALELAB_CHECK(n_expert >= 1 && groups >= 1 && N % groups == 0 && capacity >= 0,
                 "moe_route: {} tokens in {} groups over {} experts, capacity {}", N, groups,
                 n_expert, capacity);
  check_i32("moe_route", dest, indices.shape());
  check_i32("moe_route", assigned, {groups, n_expert});
  check_i32("moe_route", kept, {groups, n_expert});
  SCALELAB_DISPATCH(indices.device(),
                        moe_route(dest, assigned, kept, indices, n_expert, groups, capacity));
}

void multiply_rows(Tensor& x, const Tensor& w) {
  check_defined("multiply_rows", {&x, &w});
  check_data_rows("multiply_rows", x);
  check_router("multiply_rows", w, {x.size(0)}, stats_dtype(x.dtype()));
  SCALELAB_DISPATCH(x.device(), multiply_rows(x, w));
}

void row_dot(Tensor& out, const Tensor& a, const Tensor& b) {
  check_defined("row_dot", {&out, &a, &b});
  check_data_rows("row_dot", a);
  SCALELAB_CHECK(b.shape() == a.shape() && b.dtype() == a.dtype(), "row_dot: {} and {}", a.str(),
                 b.str());
  check_router("row_dot", out, {a.size(0)}, stats_dtype(a.dtype()));
  SCALELAB_DISPATCH(a.device(), row_dot(out, a, b));
}

}  // namespace scalelab::ops
