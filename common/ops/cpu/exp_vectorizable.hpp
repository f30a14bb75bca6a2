#pragma once
// e^x in straight-line code the compiler can vectorize, for the host kernels' hot loops.
//
// std::exp is a library call, one number at a time: with it GELU's forward and backward were 15%
// of a `small` training step on one thread, and flash attention's recomputed probabilities most
// of its backward. This is Cephes' expf: x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6
// polynomial, 2^n written into the exponent bits; within 2 ulp of std::exp.
//
// Two things the caller must know:
//  - x is clamped to [-87.3, 88.3] first, so e^x never overflows or goes subnormal: e^(-inf) is
//    about 1e-38, not 0. Use it where the arguments are finite (or where 1e-38 is as good as 0).
//  - The clamp is a compare-and-select. GCC keeps such a loop scalar unless the file is compiled
//    with -fno-trapping-math (the project does not use floating-point traps): common/tensor.cmake
//    sets it on the files that include this header.
// SCALELAB_HOST_SIMD on a hot loop's function builds it twice, for AVX2 (8 floats a vector) and
// for the baseline x86-64 (SSE2, 4), and picks one when the program starts. Each element's
// arithmetic is the same in both (no FMA contraction under -std=c++20), so the results are too.
//
// f64 keeps std::exp: double is the gradient checks' precision, where exactness matters more.
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SCALELAB_HOST_SIMD __attribute__((target_clones("avx2", "default")))
#else
#define SCALELAB_HOST_SIMD
#endif

namespace scalelab::ops::cpu {

inline float exp_vectorizable(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  // n = round(x / ln2): adding and taking away 1.5 * 2^23 rounds to the nearest integer
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n ln2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

inline double exp_vectorizable(double x) { return std::exp(x); }

}  // namespace scalelab::ops::cpu
