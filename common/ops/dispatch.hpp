#pragma once
/// @file dispatch.hpp
/// Runs a body with a type alias `name` = float or double according to a DType (both backends'
/// kernels use it; labs do not). SCALELAB_FLOAT_TYPES names it T; files where T is the sequence
/// length (llm.c's name) use SCALELAB_FLOAT_TYPES_AS(dtype, scalar_t, ...).
///
/// SCALELAB_TRAIN_TYPES adds bf16 (common/bf16.hpp) for the ops that accept it (ops.hpp's rules
/// R1-R8). bf16 is storage only: a kernel under it loads each element into `acc_t` (float for
/// bf16 and f32, double for f64), computes there, and stores back through `T(value)`, which
/// rounds to the nearest bf16. So a body reads `acc_t x = acc_t(p[i]); ... p[i] = T(y);`.
///
///     SCALELAB_TRAIN_TYPES(x.dtype(), {
///       T* p = x.data<T>();
///       for (int64_t i = 0; i < n; ++i) p[i] = T(acc_t(p[i]) * acc_t(a));
///     });
#include "common/dtype.hpp"
#include "common/errors.hpp"

/// Runs `...` with `using name = float` (f32) or `double` (f64); any other dtype: a failed
/// SCALELAB_CHECK naming it.
#define SCALELAB_FLOAT_TYPES_AS(dtype, name, ...)                                         \
  do {                                                                                    \
    switch (dtype) {                                                                      \
      case ::scalelab::DType::f32: { using name = float; __VA_ARGS__; break; }           \
      case ::scalelab::DType::f64: { using name = double; __VA_ARGS__; break; }          \
      default: SCALELAB_CHECK(false, "op needs f32 or f64, got {}", dtype_name(dtype)); \
    }                                                                                     \
  } while (0)
/// SCALELAB_FLOAT_TYPES_AS with the alias named T.
#define SCALELAB_FLOAT_TYPES(dtype, ...) SCALELAB_FLOAT_TYPES_AS(dtype, T, __VA_ARGS__)

/// Runs `...` with `using name` = float, double or scalelab::bf16 and `acc_t` the type to
/// compute in (float, double, float); any other dtype: a failed SCALELAB_CHECK naming it.
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
/// SCALELAB_TRAIN_TYPES_AS with the alias named T.
#define SCALELAB_TRAIN_TYPES(dtype, ...) SCALELAB_TRAIN_TYPES_AS(dtype, T, __VA_ARGS__)
