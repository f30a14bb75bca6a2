#include "common/tensor.hpp"

#include "common/scalar.hpp"  // HostRead: to_vector is a read back to the host

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>

namespace scalelab {
namespace {
// host_value_bytes(): what to_vector, item and from_vector moved
std::atomic<int64_t> g_host_read_bytes{0}, g_host_written_bytes{0};
// SimKernelScope: how many are open on this thread
thread_local int t_sim_kernel_scopes = 0;
// host_device_copies(), and HostDeviceCopiesUncounted's scopes open on this thread
std::atomic<int64_t> g_to_host_bytes{0}, g_to_device_bytes{0};
thread_local int t_uncounted_copies = 0;

// Element i of a contiguous host tensor as a double (uncounted: its callers count)
double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.data<float>()[i];
    case DType::f64: return t.data<double>()[i];
    case DType::i32: return t.data<int32_t>()[i];
    case DType::bf16: return static_cast<float>(t.data<bf16>()[i]);
  }
  return 0;
}
}  // namespace

HostValueBytes host_value_bytes() {
  return {g_host_read_bytes.load(std::memory_order_relaxed),
          g_host_written_bytes.load(std::memory_order_relaxed)};
}

HostDeviceCopies host_device_copies() {
  return {g_to_host_bytes.load(std::memory_order_relaxed),
          g_to_device_bytes.load(std::memory_order_relaxed)};
}

HostDeviceCopiesUncounted::HostDeviceCopiesUncounted() { ++t_uncounted_copies; }
HostDeviceCopiesUncounted::~HostDeviceCopiesUncounted() { --t_uncounted_copies; }

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::bf16: return 2;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::bf16: return "bf16";
  }
  return "?";
}

Storage::Storage(std::size_t nbytes, Device device)
    : ptr_(device_alloc(nbytes, device)), nbytes_(nbytes), device_(device) {}

Storage::~Storage() { device_free(ptr_, nbytes_, device_); }

namespace {
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("({})", fmt::join(shape, ", "));
}

// SCALELAB_POISON_EMPTY=1: empty() fills its memory with 0xFF bytes (NaN in every float dtype,
// -1 as an index), so code that reads a tensor before writing it (an accumulation into a buffer
// nobody zeroed) turns its result into NaN instead of passing on whatever the memory held.
bool poison_empty() {
  static const bool on = [] {
    const char* v = std::getenv("SCALELAB_POISON_EMPTY");
    return v && *v && std::string_view(v) != "0";
  }();
  return on;
}
}  // namespace

Tensor Tensor::empty(std::vector<int64_t> shape, DType dtype, Device device) {
  for (int64_t d : shape) SCALELAB_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.storage_ = std::make_shared<Storage>(static_cast<std::size_t>(product(t.shape_)) *
                                             dtype_size(dtype), device);
  if (poison_empty()) device_fill_bytes(t.data_ptr(), t.nbytes(), 0xFF, device);
  return t;
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  device_zero(t.data_ptr(), t.nbytes(), device);
  return t;
}

Tensor Tensor::from_vector(const std::vector<double>& values, std::vector<int64_t> shape,
                           DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  SCALELAB_CHECK(static_cast<int64_t>(values.size()) == t.numel(),
                 "from_vector: {} values for shape {}", values.size(), shape_str(t.shape_));
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::f32: t.data<float>()[i] = static_cast<float>(values[i]); break;
      case DType::f64: t.data<double>()[i] = values[i]; break;
      case DType::i32: t.data<int32_t>()[i] = static_cast<int32_t>(values[i]); break;
      case DType::bf16: t.data<bf16>()[i] = bf16(static_cast<float>(values[i])); break;
    }
  }
  g_host_written_bytes.fetch_add(static_cast<int64_t>(t.nbytes()), std::memory_order_relaxed);
  return t;
}

Tensor Tensor::uniform(std::vector<int64_t> shape, uint64_t seed, DType dtype, Device device,
                       double lo, double hi) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> values(n);
  for (double& x : values) x = u(rng);
  return from_vector(values, std::move(shape), dtype).to(device);
}

int64_t Tensor::size(int d) const {
  int n = static_cast<int>(shape_.size());
  if (d < 0) d += n;
  SCALELAB_CHECK(d >= 0 && d < n, "dimension {} out of range for shape {}", d, shape_str(shape_));
  return shape_[d];
}

int64_t Tensor::numel() const { return product(shape_); }

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

std::string Tensor::str() const {
  if (!defined()) return "(undefined)";
  return fmt::format("{} {} {}", shape_str(shape_), dtype_name(dtype_), device().str());
}

void* Tensor::data_ptr() {
  SCALELAB_CHECK(defined(), "data_ptr of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_);
}

const void* Tensor::data_ptr() const {
  SCALELAB_CHECK(defined(), "data_ptr of an undefined tensor");
  return static_cast<const char*>(storage_->data()) + offset_ * dtype_size(dtype_);
}

SimKernelScope::SimKernelScope() { ++t_sim_kernel_scopes; }
SimKernelScope::~SimKernelScope() { --t_sim_kernel_scopes; }

void Tensor::check_access(DType wanted) const {
  SCALELAB_CHECK(dtype_ == wanted, "tensor {} accessed as {}", str(), dtype_name(wanted));
  if (device().is_sim() && t_sim_kernel_scopes == 0)  // one plain line: an attendee reads it
    throw CheckFailed(fmt::format(
        "host code reached the elements of {} through data<T>(), outside an op: on a GPU they "
        "are in device memory, where the host cannot read them. Compute with the ops "
        "(common/ops) on the device; a copy to the host (to(Device::cpu()), to_vector()) is "
        "for what the host must see, such as a number to print",
        str()));
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  SCALELAB_CHECK(dim() >= 1, "rows() of a 0-d tensor");
  SCALELAB_CHECK(0 <= begin && begin <= end && end <= shape_[0],
                 "rows [{}, {}) out of range for shape {}", begin, end, shape_str(shape_));
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.offset_ = offset_ + begin * strides_[0];
  return t;
}

Tensor Tensor::flat(int64_t offset, int64_t count) const {
  SCALELAB_CHECK(is_contiguous(), "flat() of a non-contiguous tensor {}", str());
  SCALELAB_CHECK(0 <= offset && 0 <= count && offset + count <= numel(),
                 "flat [{}, {}) out of range for {} elements", offset, offset + count, numel());
  Tensor t = *this;
  t.shape_ = {count};
  t.strides_ = {1};
  t.offset_ = offset_ + offset;
  return t;
}

Tensor Tensor::span(const std::vector<Tensor>& pieces) {
  if (pieces.empty()) return Tensor();
  int64_t total = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Tensor& t = pieces[i];
    if (!t.defined() || !t.is_contiguous() || t.storage_ != pieces[0].storage_ ||
        t.dtype_ != pieces[0].dtype_ || t.offset_ != pieces[0].offset_ + total)
      return Tensor();
    total += t.numel();
  }
  Tensor s = pieces[0];
  s.shape_ = {total};
  s.strides_ = {1};
  return s;
}

Tensor Tensor::view(std::vector<int64_t> shape) const {
  SCALELAB_CHECK(is_contiguous(), "view() of a non-contiguous tensor {}", str());
  int infer = -1;
  int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      SCALELAB_CHECK(infer < 0, "view: more than one -1 in {}", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    SCALELAB_CHECK(known > 0 && numel() % known == 0, "view: cannot infer {} from {} elements",
                   shape_str(shape), numel());
    shape[infer] = numel() / known;
  }
  SCALELAB_CHECK(product(shape) == numel(), "view: shape {} does not hold {} elements ({})",
                 shape_str(shape), numel(), str());
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::clone() const { return to(device()); }

void Tensor::copy_from(const Tensor& src) {
  SCALELAB_CHECK(src.numel() == numel() && src.dtype() == dtype(),
                 "copy_from: {} into {}", src.str(), str());
  SCALELAB_CHECK(is_contiguous() && src.is_contiguous(), "copy_from: non-contiguous {} or {}",
                 src.str(), str());
  device_copy(data_ptr(), device(), src.data_ptr(), src.device(), nbytes());
  if (device().is_cpu() != src.device().is_cpu() && t_uncounted_copies == 0)
    (device().is_cpu() ? g_to_host_bytes : g_to_device_bytes)
        .fetch_add(static_cast<int64_t>(nbytes()), std::memory_order_relaxed);
}

std::vector<double> Tensor::to_vector() const {
  // a copy back to the host: on a GPU it waits for every kernel queued before it (scalar.hpp)
  const HostRead read("to_vector");
  Tensor h = device().is_cpu() && is_contiguous() ? *this : to(Device::cpu());
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[i] = element(h, i);
  g_host_read_bytes.fetch_add(static_cast<int64_t>(nbytes()), std::memory_order_relaxed);
  return out;
}

double Tensor::item(int64_t i) const {
  SCALELAB_CHECK(device().is_cpu(), "item() of a {} tensor: copy it to the host first", str());
  SCALELAB_CHECK(0 <= i && i < numel(), "item({}) out of range for {}", i, str());
  g_host_read_bytes.fetch_add(static_cast<int64_t>(dtype_size(dtype_)), std::memory_order_relaxed);
  return element(*this, i);
}

}  // namespace scalelab
