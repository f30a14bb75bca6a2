#pragma once
/// @file device_dispatch.hpp
/// SCALELAB_DISPATCH(device, call): the op's kernel for the tensors' device, for the files that
/// check an op's arguments and then dispatch it (ops.cpp, moe.cpp): `cuda::call` on a GPU, else
/// `cpu::call`, for the host and for the simulated GPU, whose memory the CPU kernel may touch
/// while it runs (SimKernelScope, tensor.hpp).
#include "common/tensor.hpp"

#define SCALELAB_DISPATCH(device, call)          \
  do {                                           \
    if ((device).is_cuda()) {                    \
      cuda::call;                                \
    } else {                                     \
      const ::scalelab::SimKernelScope in_kernel; \
      cpu::call;                                 \
    }                                            \
  } while (0)
