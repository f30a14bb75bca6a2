#pragma once
// Tests that split a model by hand (tensor parallel without lab 07) install these mappings: a
// region's exit (g) and its entry's backward (f's backward) run the given functions IN PLACE on
// the tensor (typically an all-reduce); everything else stays single-device. Also a probe: a
// test sees when a block reaches the end of its attention (tests/09_zero: ZeRO-3's prefetch).
#include <functional>
#include <utility>

#include "common/nn/mappings.hpp"

namespace scalelab::labtest {

struct ReduceMappings : nn::Mappings {
  std::function<void(Tensor&)> on_leave, on_enter_backward;
  ReduceMappings(std::function<void(Tensor&)> leave_fn, std::function<void(Tensor&)> enter_bwd)
      : on_leave(std::move(leave_fn)), on_enter_backward(std::move(enter_bwd)) {}
  Tensor leave(const Tensor& y) const override {
    Tensor t = y;  // the same storage: the function works in place, as lab 07's g does
    if (on_leave) on_leave(t);
    return t;
  }
  Tensor enter_backward(const Tensor& dx) const override {
    Tensor t = dx;
    if (on_enter_backward) on_enter_backward(t);
    return t;
  }
};

}  // namespace scalelab::labtest
