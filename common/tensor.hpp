#pragma once
// scalelab's n-d tensor: a shared storage (one allocation from common/allocator), a shape, strides
// and an element offset into the storage. Views (rows, flat, view) share the storage and copy
// nothing, which is how later labs cut micro-batches, gradient buckets and ZeRO shards out of one
// buffer. Every op in common/ops takes contiguous tensors; strides exist so a view can say what it
// is, not so ops can be clever.
//
//   Tensor x = Tensor::zeros({B, T, C});           // f32 on the host
//   Tensor first = x.rows(0, 1);                     // (1, T, C), same memory
//   Tensor g = x.to(Device::cuda(0));                // explicit copy to a GPU
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/allocator.hpp"
#include "common/dtype.hpp"
#include "common/errors.hpp"

namespace scalelab {

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

/// One allocation. Freed (and uncounted) when the last tensor viewing it goes away.
class Storage {
 public:
  Storage(std::size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return ptr_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* ptr_ = nullptr;
  std::size_t nbytes_ = 0;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  /// Uninitialised memory.
  static Tensor empty(std::vector<int64_t> shape, DType dtype = DType::f32,
                      Device device = Device::cpu());
  /// Zero-filled.
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::f32,
                      Device device = Device::cpu());
  /// A host tensor holding `values` (f32 or f64), reshaped to `shape`.
  static Tensor from_vector(const std::vector<double>& values, std::vector<int64_t> shape,
                            DType dtype = DType::f32);

  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  /// Size of dimension d; negative d counts from the end.
  int64_t size(int d) const;
  int64_t numel() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  bool is_contiguous() const;
  bool defined() const { return storage_ != nullptr; }
  /// Element offset of this view into its storage.
  int64_t offset() const { return offset_; }
  /// True if both tensors view the same allocation.
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }
  /// "(2, 3) f32 cpu"
  std::string str() const;

  void* data_ptr();
  const void* data_ptr() const;
  /// Typed pointer to the first element; checks that T matches dtype().
  template <class T>
  T* data() {
    check_type(dtype_of<T>());
    return static_cast<T*>(data_ptr());
  }
  template <class T>
  const T* data() const {
    check_type(dtype_of<T>());
    return static_cast<const T*>(data_ptr());
  }

  /// Rows [begin, end) along dim 0: a view, no copy.
  Tensor rows(int64_t begin, int64_t end) const;
  /// Elements [offset, offset + count) of a contiguous tensor as a 1-d view.
  Tensor flat(int64_t offset, int64_t count) const;
  /// The same elements with another shape (contiguous only; one -1 is inferred).
  Tensor view(std::vector<int64_t> shape) const;

  /// A copy on `device` (a copy even if already there).
  Tensor to(Device device) const;
  /// A contiguous copy on the same device.
  Tensor clone() const;
  /// Copies `src`'s elements into this tensor (same numel and dtype; any devices).
  void copy_from(const Tensor& src);

  /// Host-side element access for tests and small tools (f32/f64 as double). Slow: copies the
  /// tensor to the host when it lives on a GPU.
  std::vector<double> to_vector() const;
  /// Reads one element of a host tensor by flat index (contiguous tensors).
  double item(int64_t flat_index = 0) const;

 private:
  void check_type(DType wanted) const;
  std::shared_ptr<Storage> storage_;
  std::vector<int64_t> shape_, strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::f32;
};

}  // namespace scalelab
