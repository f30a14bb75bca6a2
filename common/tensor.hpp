#pragma once
/// @file tensor.hpp
/// scalelab's n-d tensor: a shared storage (one allocation from common/allocator), a shape, strides
/// and an element offset into the storage. Views (rows, flat, view) share the storage and copy
/// nothing, which is how later labs cut micro-batches, gradient buckets and ZeRO shards out of one
/// buffer. Every op in common/ops takes contiguous tensors; strides exist so a view can say what it
/// is, not so ops can be clever.
///
///   Tensor x = Tensor::zeros({B, T, C});           // f32 on the host
///   Tensor first = x.rows(0, 1);                     // (1, T, C), same memory
///   Tensor g = x.to(Device::cuda(0));                // explicit copy to a GPU
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/allocator.hpp"
#include "common/dtype.hpp"
#include "common/errors.hpp"

namespace scalelab {

/// Bytes per element of `dtype` (4 for f32, 2 for bf16, ...).
std::size_t dtype_size(DType dtype);
/// "f32", "bf16", ... (for messages and tables).
const char* dtype_name(DType dtype);

/// One allocation. Freed (and uncounted) when the last tensor viewing it goes away.
class Storage {
 public:
  /// Allocates `nbytes` on `device` through common/allocator.hpp, so memory_stats() counts them.
  Storage(std::size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  /// The first byte (a device pointer for a GPU storage).
  void* data() const { return ptr_; }
  /// Bytes allocated: every view of this storage lies within them.
  std::size_t nbytes() const { return nbytes_; }
  /// Where the bytes live.
  Device device() const { return device_; }

 private:
  void* ptr_ = nullptr;
  std::size_t nbytes_ = 0;
  Device device_;
};

/// An n-d array: a handle on a shared Storage with a shape, strides, an element offset and a
/// dtype. Copying a Tensor copies the handle, not the elements (both see the same memory, as a
/// NumPy view does); clone() and to() copy elements. Ops (common/ops/ops.hpp) take contiguous
/// tensors and check devices and dtypes, so a mistake is an error naming the shapes, not a silent
/// wrong answer. What one rank holds is what the allocator counts: the graders read it.
class Tensor {
 public:
  Tensor() = default;  ///< undefined: defined() is false

  /// Uninitialised memory. With SCALELAB_POISON_EMPTY=1 in the environment it holds 0xFF bytes
  /// (NaN in every float dtype): a debugging and test aid that makes a read before the first
  /// write show.
  static Tensor empty(std::vector<int64_t> shape, DType dtype = DType::f32,
                      Device device = Device::cpu());
  /// Zero-filled.
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::f32,
                      Device device = Device::cpu());
  /// A host tensor holding `values` (f32 or f64), reshaped to `shape`. Counted
  /// (host_value_bytes()).
  static Tensor from_vector(const std::vector<double>& values, std::vector<int64_t> shape,
                            DType dtype = DType::f32);
  /// Numbers drawn uniformly from [lo, hi) by a std::mt19937_64 seeded with `seed`, in double and
  /// then rounded to `dtype`: the same tensor on every rank and every run (test inputs, demos).
  static Tensor uniform(std::vector<int64_t> shape, uint64_t seed, DType dtype = DType::f32,
                        Device device = Device::cpu(), double lo = -1.0, double hi = 1.0);

  /// The size of each dimension, outermost first: (B, T, C) for a batch of activations.
  const std::vector<int64_t>& shape() const { return shape_; }
  /// Elements to step over per index of each dimension (row-major when contiguous).
  const std::vector<int64_t>& strides() const { return strides_; }
  /// The number of dimensions.
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  /// Size of dimension d; negative d counts from the end.
  int64_t size(int d) const;
  /// The number of elements: the product of the shape (1 for a 0-d tensor).
  int64_t numel() const;
  /// numel() x the element size: the bytes this view covers (what the byte counters count when
  /// it is sent), not its storage's.
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  /// The element type (f32, f64, bf16, i32, ...).
  DType dtype() const { return dtype_; }
  /// Where the elements live (the CPU for an undefined tensor).
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  /// True when the elements are back to back in row-major order (what every op needs).
  bool is_contiguous() const;
  /// False for a default-constructed Tensor (no storage), e.g. a gradient not yet bound.
  bool defined() const { return storage_ != nullptr; }
  /// Element offset of this view into its storage.
  int64_t offset() const { return offset_; }
  /// True if both tensors view the same allocation.
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }
  /// "(2, 3) f32 cpu"
  std::string str() const;

  /// The address of the first element of this view (a device address for a GPU tensor): for
  /// APIs that take device addresses (copies, communication), not for reading elements.
  void* data_ptr();
  /// The address of the first element of this view, read-only.
  const void* data_ptr() const;
  /// Typed pointer to the first element, for a kernel to read and write elements through; checks
  /// that T matches dtype(), and on the simulated GPU that an op's kernel is running
  /// (SimKernelScope): elsewhere it throws, as reading a GPU's memory from the host would fail.
  template <class T>
  T* data() {
    check_access(dtype_of<T>());
    return static_cast<T*>(data_ptr());
  }
  /// Typed read-only pointer to the first element; the same checks as data().
  template <class T>
  const T* data() const {
    check_access(dtype_of<T>());
    return static_cast<const T*>(data_ptr());
  }

  /// Rows [begin, end) along dim 0: a view, no copy.
  Tensor rows(int64_t begin, int64_t end) const;
  /// Elements [offset, offset + count) of a contiguous tensor as a 1-d view.
  Tensor flat(int64_t offset, int64_t count) const;
  /// The same elements with another shape (contiguous only; one -1 is inferred).
  Tensor view(std::vector<int64_t> shape) const;
  /// One 1-d view over `pieces` when they lie back to back in one storage, in order (each
  /// contiguous, each starting where the one before ends, one dtype): e.g. every parameter's
  /// view of a model's flat buffer. Undefined when they do not (or `pieces` is empty).
  static Tensor span(const std::vector<Tensor>& pieces);

  /// A copy on `device` (a copy even if already there).
  Tensor to(Device device) const;
  /// A contiguous copy on the same device.
  Tensor clone() const;
  /// Copies `src`'s elements into this tensor (same numel and dtype; any devices).
  void copy_from(const Tensor& src);

  /// Host-side element access for tests and small tools (f32/f64 as double). Slow: copies the
  /// tensor to the host when it lives on a GPU, a wait for every kernel before it. Counted
  /// (host_value_bytes(), and one read in host_reads(), scalar.hpp, as a Scalar's read).
  std::vector<double> to_vector() const;
  /// Reads one element of a host tensor by flat index (contiguous tensors). Counted
  /// (host_value_bytes()).
  double item(int64_t flat_index = 0) const;

 private:
  void check_access(DType wanted) const;
  std::shared_ptr<Storage> storage_;
  std::vector<int64_t> shape_, strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::f32;
};

/// While one lives, this thread's code may read and write simulated-GPU tensors through data<T>():
/// the ops open one around a CPU kernel they run for a `Device::sim()` tensor (common/ops), as a
/// GPU runs its kernels on its own memory. Nothing outside common/ops opens one: code that needs
/// a tensor's numbers on the host copies them there (to(Device::cpu()), to_vector()).
class SimKernelScope {
 public:
  SimKernelScope();
  ~SimKernelScope();
  SimKernelScope(const SimKernelScope&) = delete;
  SimKernelScope& operator=(const SimKernelScope&) = delete;
};

/// The bytes of tensor values that passed through the Tensor API's doors to host numbers since
/// start-up, on any thread: out through to_vector() and item(), in through from_vector() (each
/// element at its dtype's size). Graders watch them as they watch the work counters: a dispatch
/// that moves rows by index on the tensors' device passes a few indices through them; one that
/// loops over the rows on the host passes every row (right numbers on a laptop, a host round
/// trip a layer on a GPU). data<T>() is no door: it is the ops' own access, not counted.
struct HostValueBytes {
  int64_t read = 0;     ///< to_vector(), item(): tensor values read into host numbers
  int64_t written = 0;  ///< from_vector(): host numbers written into tensors
  /// Both ways.
  int64_t total() const { return read + written; }
};

/// This process's counts so far (HostValueBytes).
HostValueBytes host_value_bytes();

/// The bytes Tensor::to() and copy_from() copied between the host (Device::cpu()) and a device
/// (a GPU, the simulated GPU) since start-up, on any thread: a batch moved to the model's
/// device, a number read back, a gradient taken to the host and back (right numbers; on a GPU
/// twice its size over PCIe). Graders compare them with what a step must move. The MPI backend's
/// staging of device buffers is the library's (NCCL needs none): not counted
/// (HostDeviceCopiesUncounted). On the CPU alone nothing is a device: both stay 0.
struct HostDeviceCopies {
  int64_t to_host = 0;    ///< from a device to the host
  int64_t to_device = 0;  ///< from the host to a device
};

/// This process's counts so far (HostDeviceCopies).
HostDeviceCopies host_device_copies();

/// While one lives, this thread's host-device copies are not counted (a communication backend
/// staging a device buffer through host memory for MPI).
class HostDeviceCopiesUncounted {
 public:
  HostDeviceCopiesUncounted();
  ~HostDeviceCopiesUncounted();
  HostDeviceCopiesUncounted(const HostDeviceCopiesUncounted&) = delete;
  HostDeviceCopiesUncounted& operator=(const HostDeviceCopiesUncounted&) = delete;
};

}  // namespace scalelab
