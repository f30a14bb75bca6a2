#pragma once
// Runs a body with a type alias `name` = float or double according to a DType (both backends).
// SCALELAB_FLOAT_TYPES names it T; files where T is the sequence length (llm.c's name) use
// SCALELAB_FLOAT_TYPES_AS(dtype, scalar_t, ...).
//
// SCALELAB_TRAIN_TYPES adds bf16 (common/bf16.hpp) for the ops that accept it (ops.hpp's rules
// R1-R8). bf16 is storage only: a kernel under it loads each element into `acc_t` (float for
// bf16 and f32, double for f64), computes there, and stores back through `T(value)`, which
// rounds to the nearest bf16. So a body reads `acc_t x = acc_t(p[i]); ... p[i] = T(y);`.
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

#define SCALELAB_TRAIN_TYPES_AS(dtype, name, ...)                                      \
  do {                                                                                 \
    switch (dtype) {                                                                   \
      case ::scalelab::DType::f32: {                                                   \
        using name = float;                                                            \
        using acc_t [[maybe_unused]] = float;                                          \
        __VA_ARGS__;                                                                   \
        break;                                                                         \
      }                                                                                \
      case ::scalelab::DType::f64: {                                                   \
        using name = double;                                                           \
        using acc_t [[maybe_unused]] = double;                                         \
        __VA_ARGS__;                                                                   \
        break;                                                                         \
      }                                                                                \
      case ::scalelab::DType::bf16: {                                                  \
        using name = ::scalelab::bf16;                                                 \
        using acc_t [[maybe_unused]] = float;                                          \
        __VA_ARGS__;                                                                   \
        break;                                                                         \
      }                                                                                \
      default:                                                                         \
        SCALELAB_CHECK(false, "op needs f32, f64 or bf16, got {}", dtype_name(dtype)); \
    }                                                                                  \
  } while (0)
#define SCALELAB_TRAIN_TYPES(dtype, ...) SCALELAB_TRAIN_TYPES_AS(dtype, T, __VA_ARGS__)
