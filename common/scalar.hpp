#pragma once
/// @file scalar.hpp
/// A number that stays where the tensors that made it live. A training loss computed on a GPU is
/// a one-element tensor there; reading it to the host waits for every kernel before it, so a
/// step that reads each micro-batch's loss stops the GPU's queue once per micro-batch. A Scalar
/// keeps the number on its device: adding Scalars, scaling them and all-reducing them
/// (train::global_loss) run as tensor ops there, and the one copy to the host happens when
/// someone reads it (value(), or converting to double), typically the step line that prints it.
///
///   Scalar loss;                                        // 0
///   for (const data::Batch& mb : micro)
///     loss += model.forward(mb.x, mb.y);                // stays on the model's device
///   const double printed = loss / accum;                // the one copy to the host
///
/// On the CPU the tensor is a host tensor and a read is a load; host_reads() counts the reads
/// either way (and the reductions that return a number to the host, ops::sum and
/// ops::sum_squares, and Tensor::to_vector), so a CPU test can check that a step reads its loss
/// once.
#include <cstdint>
#include <ostream>
#include <type_traits>

#include "common/tensor.hpp"

namespace scalelab {

class Scalar {
 public:
  /// 0 (a host number).
  Scalar() = default;
  /// A host number: implicit, so a function returning Scalar may `return 0.0;`.
  Scalar(double value) : host_(value) {}  // NOLINT(google-explicit-constructor)
  /// A one-element f64 tensor, on any device (kept, not copied).
  explicit Scalar(Tensor value);

  /// The number on the host: a copy from the device (it waits for the kernels that make it).
  double value() const;
  /// The same, implicitly: `double loss = model.forward(x, y);` reads the loss here.
  operator double() const { return value(); }  // NOLINT(google-explicit-constructor)
  /// Where the number lives (the host for a host number).
  Device device() const;
  /// The one-element f64 tensor holding it (undefined for a host number).
  const Tensor& tensor() const { return value_; }

  /// this += other, on this Scalar's device (other's moves there if it lives elsewhere).
  Scalar& operator+=(const Scalar& other);
  Scalar operator+(const Scalar& other) const;
  /// this + a, this - a, this * a, this / a, -this: on the device, no read.
  template <class A, class = std::enable_if_t<std::is_arithmetic_v<A>>>
  Scalar operator+(A a) const { return plus(static_cast<double>(a)); }
  template <class A, class = std::enable_if_t<std::is_arithmetic_v<A>>>
  Scalar operator-(A a) const { return plus(-static_cast<double>(a)); }
  template <class A, class = std::enable_if_t<std::is_arithmetic_v<A>>>
  Scalar operator*(A a) const { return times(static_cast<double>(a)); }
  template <class A, class = std::enable_if_t<std::is_arithmetic_v<A>>>
  Scalar operator/(A a) const { return divided(static_cast<double>(a)); }
  Scalar operator-() const { return times(-1.0); }
  /// Between two Scalars, on this one's device (the other's moves there): no read. Without
  /// these, `a * b` would compile by reading both to doubles (the implicit conversion), a
  /// silent wait for the GPU. Each has the bits of the same double arithmetic on the host.
  Scalar operator-(const Scalar& other) const { return *this + -other; }
  Scalar operator*(const Scalar& other) const { return product(other, false); }
  Scalar operator/(const Scalar& other) const { return product(other, true); }
  /// The square root, on this Scalar's device, no read (a gradient norm from its sum of squares).
  Scalar sqrt() const;

 private:
  static Scalar on(Device device, double v);  // a tensor-held v on `device`
  double peek() const;                        // the value of a host number or host tensor
  Scalar plus(double a) const;
  Scalar times(double a) const;
  Scalar divided(double a) const;
  Scalar product(const Scalar& other, bool divide) const;  // this * other, or this / other
  double host_ = 0;  ///< the number, when value_ is undefined
  Tensor value_;     ///< the number, when defined: one f64 element on its device
};

/// Reads back from tensors to the host since start-up: values of tensor-held Scalars, the results
/// of ops::sum and ops::sum_squares, and whole tensors through Tensor::to_vector (one read each).
/// On a GPU each is a copy that waits for the kernels before it.
int64_t host_reads();

/// One number read back to the host, held for the length of the read: counts it (host_reads())
/// and, while tracing (trace.hpp), records a "host read" event (category "sync", args
/// {"what": what}) from construction to destruction. On a GPU that span is the wait for every
/// kernel queued before the number, then the copy: a trace of a step shows where it stops the
/// device's queue. Every place that copies a number back holds one.
class HostRead {
 public:
  explicit HostRead(const char* what);
  ~HostRead();
  HostRead(const HostRead&) = delete;
  HostRead& operator=(const HostRead&) = delete;

 private:
  const char* what_;
  double begin_us_ = -1;  // < 0: tracing was off
};

/// a + s, a - s, a * s, a / s for a number a: on s's device, no read (as s + a, -s + a, s * a,
/// and a Scalar(a) / s: the bits of the host's a + s, a - s, a * s, a / s).
template <class A, class = std::enable_if_t<std::is_arithmetic_v<A>>>
Scalar operator+(A a, const Scalar& s) { return s + a; }
template <class A, class = std::enable_if_t<std::is_arithmetic_v<A>>>
Scalar operator-(A a, const Scalar& s) { return -s + a; }
template <class A, class = std::enable_if_t<std::is_arithmetic_v<A>>>
Scalar operator*(A a, const Scalar& s) { return s * a; }
template <class A, class = std::enable_if_t<std::is_arithmetic_v<A>>>
Scalar operator/(A a, const Scalar& s) { return Scalar(static_cast<double>(a)) / s; }

/// Prints the value (a read): for test failures and logs.
std::ostream& operator<<(std::ostream& os, const Scalar& s);

}  // namespace scalelab
