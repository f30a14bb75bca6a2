// A number that stays on its device until read (scalar.hpp).
#include "common/scalar.hpp"

#include <atomic>
#include <cmath>

#include <fmt/format.h>

#include "common/ops/moe.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"

namespace scalelab {

namespace {
std::atomic<int64_t> g_host_reads{0};
}  // namespace

Scalar::Scalar(Tensor value) : value_(std::move(value)) {
  SCALELAB_CHECK(value_.defined() && value_.numel() == 1 && value_.dtype() == DType::f64,
                 "Scalar: a one-element f64 tensor, got {}",
                 value_.defined() ? value_.str() : std::string("an undefined tensor"));
}

double Scalar::value() const {
  if (!value_.defined()) return host_;
  const HostRead read("Scalar");
  return value_.device().is_cpu() ? value_.item() : value_.to(Device::cpu()).item();
}

Device Scalar::device() const { return value_.defined() ? value_.device() : Device::cpu(); }

// Every result is a new tensor: a copy of a Scalar shares its tensor, so nothing is changed in
// place. On the host the arithmetic is double arithmetic (the bits of the same sums in double);
// on a GPU it is one small kernel per operation, queued behind the ones that made the number.
Scalar Scalar::on(Device device, double v) {
  if (device.is_cpu()) return Scalar(Tensor::from_vector({v}, {1}, DType::f64));
  Tensor t = Tensor::empty({1}, DType::f64, device);
  ops::fill(t, v);
  return Scalar(t);
}

double Scalar::peek() const {
  if (!value_.defined()) return host_;
  return value_.item();  // a host tensor's element: not a read from a device
}

Scalar& Scalar::operator+=(const Scalar& other) {
  if (!value_.defined() && !other.value_.defined()) return *this = Scalar(host_ + other.host_);
  const Device d = value_.defined() ? value_.device() : other.value_.device();
  if (d.is_cpu() && other.device().is_cpu()) return *this = on(d, peek() + other.peek());
  if (!value_.defined()) return *this = other.plus(host_);
  if (!other.value_.defined()) return *this = plus(other.host_);
  const Tensor o = other.value_.device() == d ? other.value_ : other.value_.to(d);
  Tensor out = Tensor::empty({1}, DType::f64, d);
  ops::add(out, value_, o);
  value_ = out;
  return *this;
}

Scalar Scalar::operator+(const Scalar& other) const {
  Scalar s = *this;
  s += other;
  return s;
}

Scalar Scalar::plus(double a) const {
  if (!value_.defined()) return Scalar(host_ + a);
  if (value_.device().is_cpu()) return on(value_.device(), peek() + a);
  Tensor out = Tensor::empty({1}, DType::f64, value_.device());
  ops::add(out, value_, on(value_.device(), a).value_);
  return Scalar(out);
}

Scalar Scalar::times(double a) const {
  if (!value_.defined()) return Scalar(host_ * a);
  if (value_.device().is_cpu()) return on(value_.device(), peek() * a);
  Tensor out = value_.clone();
  ops::scale(out, a);
  return Scalar(out);
}

// the IEEE quotient of the host's `x / a` (a multiplication by 1 / a would be an ulp off it)
Scalar Scalar::divided(double a) const { return product(Scalar(a), true); }

Scalar Scalar::product(const Scalar& other, bool divide) const {
  const auto host = [&](double a, double b) { return divide ? a / b : a * b; };
  if (!value_.defined() && !other.value_.defined()) return Scalar(host(host_, other.host_));
  const Device d = value_.defined() ? value_.device() : other.value_.device();
  if (d.is_cpu() && other.device().is_cpu()) return on(d, host(peek(), other.peek()));
  // a row of one times (or over) a one-element factor: multiply_rows / divide_rows in f64
  Tensor out = value_.defined() ? value_.clone() : on(d, host_).value_;
  const Tensor o = !other.value_.defined()          ? on(d, other.host_).value_
                   : other.value_.device() == d ? other.value_
                                                  : other.value_.to(d);
  Tensor row = out.view({1, 1});
  if (divide) ops::divide_rows(row, o);
  else ops::multiply_rows(row, o);
  return Scalar(out);
}

Scalar Scalar::sqrt() const {
  if (!value_.defined()) return Scalar(std::sqrt(host_));
  if (value_.device().is_cpu()) return on(value_.device(), std::sqrt(peek()));
  Tensor out = Tensor::empty({1}, DType::f64, value_.device());
  ops::sqrt_into(out, value_);
  return Scalar(out);
}

int64_t host_reads() { return g_host_reads.load(std::memory_order_relaxed); }

HostRead::HostRead(const char* what) : what_(what) {
  g_host_reads.fetch_add(1, std::memory_order_relaxed);
  if (trace::enabled()) begin_us_ = trace::now_us();
}

HostRead::~HostRead() {
  if (begin_us_ >= 0 && trace::enabled())
    trace::event("host read", "sync", begin_us_, trace::now_us(), trace::kCompute,
                 fmt::format("\"what\":\"{}\"", what_));
}

std::ostream& operator<<(std::ostream& os, const Scalar& s) { return os << s.value(); }

}  // namespace scalelab
