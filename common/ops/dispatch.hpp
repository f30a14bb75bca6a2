#pragma once
// Runs a body with a type alias `name` = float or double according to a DType (both backends).
// SCALELAB_FLOAT_TYPES names it T; files where T is the sequence length (llm.c's name) use
// SCALELAB_FLOAT_TYPES_AS(dtype, scalar_t, ...).
#include "common/dtype.hpp"
#include "common/errors.hpp"

#define SCALELAB_FLOAT_TYPES_AS(dtype, name, ...)                                         \
  do {                                                                                    \
    switch (dtype) {                                                                      \
      case ::scalelab::DType::f32: { using name = float; __VA_ARGS__; break; }           \
      case ::scalelab::DType::f64: { using name = double; __VA_ARGS__; break; }          \
      default: SCALELAB_CHECK(false, "op needs f32 or f64, got {}", dtype_name(dtype)); \
    }                                                                                     \
  } while (0)
#define SCALELAB_FLOAT_TYPES(dtype, ...) SCALELAB_FLOAT_TYPES_AS(dtype, T, __VA_ARGS__)
