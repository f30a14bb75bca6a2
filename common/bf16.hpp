#pragma once
/// @file bf16.hpp
/// bfloat16: the top 16 bits of an IEEE fp32 (1 sign, 8 exponent, 7 mantissa bits). Same range as
/// fp32, about 3 significant decimal digits. Mixed-precision training keeps the model's compute
/// copy and activations in bf16 (half the bytes, tensor-core GEMMs) and the master weights,
/// gradients and AdamW state in fp32.
///
/// This is a storage type: arithmetic happens in float. Converting float -> bf16 rounds to the
/// nearest representable value, ties to even (what PyTorch and CUDA's __float2bfloat16 do); NaN
/// stays NaN. The same struct is used on the host and in CUDA kernels (SCALELAB_HD), so a tensor's
/// bytes mean the same on both devices; CUDA code may reinterpret it as __nv_bfloat16.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SCALELAB_HD __host__ __device__
#else
#define SCALELAB_HD
#endif

namespace scalelab {

/// bfloat16: the top 16 bits of an fp32 (its sign, its 8-bit exponent, 7 bits of mantissa), so
/// the same range as fp32 with about 3 significant digits. Stored as its bits; converted
/// explicitly, on the host and in CUDA kernels alike.
struct bf16 {
  uint16_t bits = 0;  ///< the bf16's bits: the high half of the fp32 it stands for

  bf16() = default;
  /// The nearest bf16 to f (from_float).
  SCALELAB_HD explicit bf16(float f) : bits(from_float(f)) {}
  /// Its value, exactly (every bf16 is an fp32).
  SCALELAB_HD explicit operator float() const { return to_float(bits); }

  /// The bf16 nearest to f (ties to even); NaN -> a quiet NaN of the same sign.
  SCALELAB_HD static uint16_t from_float(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    // Add 0x7fff plus the lowest kept bit: rounds half-way cases to the even neighbour.
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  /// The fp32 whose high half is `b` (exact).
  SCALELAB_HD static float to_float(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
#if defined(__CUDA_ARCH__)
    f = __uint_as_float(u);
#else
    std::memcpy(&f, &u, sizeof f);
#endif
    return f;
  }

 private:
  SCALELAB_HD static uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
#endif
  }
};
static_assert(sizeof(bf16) == 2, "bf16 is two bytes");

}  // namespace scalelab
