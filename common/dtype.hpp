#pragma once
/// @file dtype.hpp
/// Element types a Tensor can hold. f32 is what models train in; f64 exists so gradient checks
/// (central finite differences) are not drowned by rounding; i32 holds token ids; bf16 (bf16.hpp)
/// is the 2-byte storage of mixed precision (compute copies and activations; math in float).
#include <cstddef>
#include <cstdint>

#include "common/bf16.hpp"

namespace scalelab {

/// The element types a Tensor holds: f32 (training), f64 (the graders' exact checks), i32
/// (token ids), bf16 (mixed precision's compute copy and activations).
enum class DType { f32, f64, i32, bf16 };

/// Bytes per element.
std::size_t dtype_size(DType dtype);

/// "f32", "f64", "i32", "bf16".
const char* dtype_name(DType dtype);

/// The DType of a C++ element type: dtype_of<float>() == DType::f32.
template <class T>
constexpr DType dtype_of();
/// float is f32.
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
/// double is f64.
template <>
constexpr DType dtype_of<double>() { return DType::f64; }
/// int32 is i32.
template <>
constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
/// scalelab::bf16 is bf16.
template <>
constexpr DType dtype_of<bf16>() { return DType::bf16; }

}  // namespace scalelab
