// Dispatch of the fused Linear forwards and the MLP's fused backward: the cuBLASLt epilogue
// where it applies, else the unfused ops (which then check shapes and dtypes again; cheap).
#include "common/ops/fused_linear.hpp"

#include <algorithm>
#include <initializer_list>

#include "common/ops/fused_backend.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/trial_kernels.hpp"
#include "common/ops/work.hpp"

namespace scalelab::ops {

namespace {
// Each of `tensors` contiguous, of first's dtype and on its device (what the GEMM reads).
void check_alike(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor& first = **tensors.begin();
  for (const Tensor* t : tensors)
    SCALELAB_CHECK(t->is_contiguous() && t->dtype() == first.dtype() && t->device() == first.device(),
                   "{}: {} is not contiguous, or not of {}'s dtype and device", op, t->str(),
                   first.str());
}

// in, out, pre viewed as 2-d (N, C) / (N, OC) matrices, after checking what the views need.
struct Views {
  Tensor in, out, pre;
};
Views views(const char* op, Tensor& out, Tensor* pre, const Tensor& in, const Tensor& weight,
            const Tensor& bias) {
  SCALELAB_CHECK(in.defined() && in.dim() >= 2 && weight.defined() && weight.dim() == 2 &&
                     bias.defined() && bias.dim() == 1,
                 "{}: in (..., C), weight (OC, C), bias (OC) expected", op);
  const int64_t C = in.size(-1), OC = weight.size(0), N = in.numel() / C;
  std::vector<int64_t> out_shape = in.shape();
  out_shape.back() = OC;
  SCALELAB_CHECK(weight.size(1) == C && bias.size(0) == OC && out.defined() &&
                     out.shape() == out_shape && (!pre || (pre->defined() && pre->shape() == out_shape)),
                 "{}: in {} weight {} bias {} out {}", op, in.str(), weight.str(), bias.str(),
                 out.defined() ? out.str() : "undefined");
  check_alike(op, {&in, &weight, &bias, &out});
  if (pre) check_alike(op, {&in, pre});
  return {in.view({N, C}), out.view({N, OC}), pre ? pre->view({N, OC}) : Tensor()};
}
}  // namespace

void linear_forward(Tensor& out, const Tensor& in, const Tensor& weight, const Tensor& bias) {
  Views v = views("linear_forward", out, nullptr, in, weight, bias);
  if (in.device().is_cuda() && cuda::linear_epilogue(v.out, nullptr, v.in, weight, bias)) {
    count_matmul(1, v.in.size(0), weight.size(0), v.in.size(1));  // the fused GEMM's work
    return;
  }
  matmul(v.out, v.in, weight, false, true);
  add_bias(v.out, bias);
}

void linear_gelu_forward(Tensor& out, Tensor& pre, const Tensor& in, const Tensor& weight,
                         const Tensor& bias) {
  Views v = views("linear_gelu_forward", out, &pre, in, weight, bias);
  if (in.device().is_cuda() && cuda::linear_epilogue(v.out, &v.pre, v.in, weight, bias)) {
    count_matmul(1, v.in.size(0), weight.size(0), v.in.size(1));
    return;
  }
  matmul(v.pre, v.in, weight, false, true);
  add_bias(v.pre, bias);
  gelu_forward(v.out, v.pre);
}

void linear_dgelu_backward(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                           const Tensor& pre) {
  SCALELAB_CHECK(dout.defined() && dout.dim() >= 2 && weight.defined() && weight.dim() == 2 &&
                     pre.defined() && dpre.defined(),
                 "linear_dgelu_backward: dout (..., OC), weight (OC, C), pre and dpre (..., C) expected");
  const int64_t OC = weight.size(0), C = weight.size(1), N = dout.numel() / std::max<int64_t>(OC, 1);
  std::vector<int64_t> pre_shape = dout.shape();
  pre_shape.back() = C;
  SCALELAB_CHECK(dout.size(-1) == OC && pre.shape() == pre_shape && dpre.shape() == pre_shape,
                 "linear_dgelu_backward: dout {} weight {} pre {} dpre {}", dout.str(), weight.str(),
                 pre.str(), dpre.str());
  check_alike("linear_dgelu_backward", {&dout, &weight, &pre, &dpre});
  const Tensor dy = dout.view({N, OC}), p = pre.view({N, C});
  Tensor dp = dpre.view({N, C});
  if (dout.device().is_cuda() && trial_kernel("dgelu_epilogue") &&
      cuda::linear_dgelu_epilogue(dp, dy, weight, p)) {
    count_matmul(1, N, C, OC);  // the fused GEMM's work
    return;
  }
  Tensor dg = Tensor::zeros({N, C}, dout.dtype(), dout.device());  // the gradient of GELU(pre)
  matmul(dg, dy, weight, false, false, 1.0, 1.0);
  fill(dp, 0.0);
  gelu_backward(dp, p, dg);
}

void linear_parameter_backward(Tensor& dweight, Tensor& dbias, const Tensor& dout,
                               const Tensor& in) {
  SCALELAB_CHECK(dout.defined() && dout.dim() >= 2 && in.defined() && in.dim() >= 2 &&
                     dweight.defined() && dweight.dim() == 2 && dbias.defined() && dbias.dim() == 1,
                 "linear_parameter_backward: dout (..., OC), in (..., C), dweight (OC, C), dbias "
                 "(OC) expected");
  const int64_t OC = dweight.size(0), C = dweight.size(1);
  const int64_t N = dout.numel() / std::max<int64_t>(OC, 1);
  SCALELAB_CHECK(dout.size(-1) == OC && in.size(-1) == C && in.numel() == N * C &&
                     dbias.size(0) == OC,
                 "linear_parameter_backward: dout {} in {} dweight {} dbias {}", dout.str(),
                 in.str(), dweight.str(), dbias.str());
  check_alike("linear_parameter_backward", {&dout, &in});
  check_alike("linear_parameter_backward", {&dweight, &dbias});
  const Tensor dy = dout.view({N, OC}), x = in.view({N, C});
  // the BGRADB epilogue unless the bias gradient's version 2 (a column-sum pass, on trial) is on:
  // then the plain GEMM and bias_backward, as version 1
  if (dout.device().is_cuda() && trial_kernel("bias_grad_epilogue") &&
      !trial_kernel("bias_backward_v2")) {
    Tensor sums = Tensor::empty({OC}, dbias.dtype(), dbias.device());
    if (cuda::linear_bgrad_epilogue(dweight, sums, dy, x)) {
      count_matmul(1, OC, C, N);  // the fused GEMM's work
      axpy(dbias, 1.0, sums);
      return;
    }
  }
  matmul(dweight, dy, x, true, false, 1.0, 1.0);  // dW += dy^T @ x
  bias_backward(dbias, dy);
}

}  // namespace scalelab::ops
