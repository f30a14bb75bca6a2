#pragma once
/// @file parameter.hpp
/// A model's parameters: named tensors that are views into ONE flat buffer of values and ONE flat
/// buffer of gradients, in a stable order. Later labs rely on that: a DDP bucket, a ZeRO shard or a
/// flat all-reduce is a slice of the flat buffer (Tensor::flat), no gathering or copying needed.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor.hpp"

namespace scalelab::nn {

/// Which part of a full weight a layer owns (tensor parallelism). `dim` 0 keeps a set of rows
/// (output features of a Linear: column parallel), 1 a set of columns (input features: row
/// parallel); `ranges` are [begin, end) along that dim, concatenated in order. Several ranges
/// let a fused QKV weight keep the q, k and v rows of its heads.
struct Shard {
  int dim = -1;  ///< 0: rows, 1: columns, -1: the whole tensor
  std::vector<std::pair<int64_t, int64_t>> ranges;  ///< [begin, end) along dim, in order
  /// True for the whole tensor (no shard).
  bool whole() const { return dim < 0; }
  /// Rows or columns kept.
  int64_t count() const;
};

/// How a parameter's initial values are drawn.
enum class Init { normal, zeros, ones };

/// One named weight of a model: what it is (name, full shape, the shard this model keeps, how
/// to initialise it) and, once bound by a ParameterSet, views of its value and gradient.
struct Parameter {
  std::string name;                ///< "blocks.0.attn.qkv.weight"
  std::vector<int64_t> full_shape; ///< the unsharded shape
  Shard shard;                     ///< which part of it this parameter holds
  Init init = Init::normal;        ///< how its full tensor is drawn
  double init_std = 0.02;          ///< the normal's standard deviation
  bool weight_decay = false;       ///< nanoGPT decays 2-d weights only
  /// Whose values to draw (defaults to name; a copy of a tied weight on another pipeline stage
  /// names the original).
  std::string init_key;
  Tensor value;                    ///< a view into the values (flat buffer or its unit's), set by ParameterSet::bind
  Tensor grad;                     ///< a view into the gradients, the shape of value
  /// Mixed precision: a view into the set's bf16 copy of the values (flat), or into its unit's
  /// bf16 compute buffer (per-unit values: bound by ParameterSet::bind_compute); undefined when
  /// the set computes in its own dtype.
  Tensor compute;

  /// What the layers compute with: the bf16 compute copy in mixed precision, else the value.
  /// Optimizers update `value` (the fp32 master) and refresh the copy (ParameterSet).
  const Tensor& compute_value() const { return compute.defined() ? compute : value; }

  /// The local shape (full_shape with the shard applied).
  std::vector<int64_t> shape() const;
  /// Elements this parameter holds (of its shard).
  int64_t numel() const;
};

/// Draws parameter values: each parameter's FULL tensor from (seed, init_key), then keeps its
/// shard. So a sharded model, a pipeline stage or a model built in another order holds exactly the
/// values of the single-device model.
void init_parameter(Parameter& p, uint64_t seed);

/// A contiguous run of parameters that is stored, released and gathered together: the
/// embedding, one block, the head. ZeRO-3 gathers a unit's values before its forward and frees
/// them after; ZeRO-2 holds a unit's gradients only until they are reduced into the shard.
struct Unit {
  std::string name;          ///< "embedding", "blocks.3", "head"
  std::size_t first = 0;     ///< its first parameter's index in the set
  std::size_t last = 0;      ///< one past its last parameter's index
  int64_t lo = 0;            ///< its first element in the flat layout
  int64_t hi = 0;            ///< one past its last element
  /// Its elements.
  int64_t numel() const { return hi - lo; }
};

/// Where a set keeps its values or gradients.
///   flat      one buffer for all of them, allocated at bind (DDP, buckets, ZeRO-1): the
///             parameters are views into it, always there.
///   per_unit  one buffer per Unit, allocated by bind_values / bind_grads and freed by
///             release_values / release_grads (ZeRO-2 gradients, ZeRO-3 values). Nothing is
///             held for a released unit: the allocator's counters show the saving.
enum class Storage { flat, per_unit };

/// How a ParameterSet stores values and gradients (and pads its layout, and in what dtype the
/// layers compute): what DDP, ZeRO and mixed precision choose.
struct StorageOptions {
  Storage values = Storage::flat;  ///< flat, or per_unit (ZeRO-3)
  Storage grads = Storage::flat;   ///< flat, or per_unit (ZeRO-2 and 3)
  /// The flat layout is padded at its end to a multiple of this (the number of ZeRO shards):
  /// padded_numel() = round_up(numel(), pad_to), so n equal shards cover it exactly. The
  /// padding elements belong to no parameter; flat buffers hold them as zeros.
  int64_t pad_to = 1;
  /// The dtype the layers compute in. bf16 with f32 values is mixed precision: bind also keeps a
  /// bf16 COMPUTE copy of the values (one flat buffer, each Parameter::compute a view into it),
  /// refreshed by refresh_compute() or by the optimizer (AdamW fuses it: ops::adamw_update's
  /// `compute`). Anything else: no copy, the layers use the values. With per-unit values (ZeRO-3)
  /// there is no flat copy: each unit has a bf16 compute buffer of its own, bound and released
  /// like its values (bind_compute / release_compute), and the layers need only that one.
  DType compute_dtype = DType::f32;
};

/// Shard r of n of a flat layout of `numel` elements padded to a multiple of n: every shard is
/// the chunk [r * size, (r + 1) * size) of the padded layout, size = ceil(numel / n); its REAL
/// elements [lo, hi) are clamped to numel (the last shards may be partly or wholly padding).
struct ShardRange {
  int64_t lo = 0;    ///< min(r * size, numel): its first real element (numel if it has none)
  int64_t hi = 0;    ///< one past its last real element
  int64_t size = 0;  ///< every shard's size, padding included
  /// Its real elements (no padding).
  int64_t real() const { return hi - lo; }
};
/// Shard `rank` of `n` of a flat layout of `numel` elements (ShardRange; lab 09 writes it).
ShardRange shard_range(int64_t numel, int rank, int n);

/// Lays out parameters in one flat layout of values and of gradients, in a stable order.
class ParameterSet {
 public:
  /// Binds each parameter's value and grad to consecutive elements of the flat layout (in the
  /// order given), initialises values from `seed` (each parameter's full tensor drawn, then its
  /// shard kept) and zeroes the gradients. `units` gives how many parameters each unit has (in
  /// order, summing to params.size()); empty: one unit "all". With per_unit storage the values
  /// are initialised unit by unit and then released, so the caller keeps its shard first: see
  /// on_init.
  void bind(std::vector<Parameter*> params, DType dtype, Device device, uint64_t seed,
            const std::vector<std::pair<std::string, std::size_t>>& units = {},
            StorageOptions storage = {},
            const std::function<void(const Unit&, const Tensor& values)>& on_init = {});

  /// The parameters, in layout order.
  const std::vector<Parameter*>& list() const { return params_; }
  /// The flat value buffer without the padding. Flat storage only.
  Tensor& values();
  /// The flat gradient buffer without the padding. Flat storage only.
  Tensor& grads();
  /// The flat values with the padding (padded_numel() elements).
  Tensor& padded_values();
  /// The flat gradients with the padding.
  Tensor& padded_grads();
  /// Elements of all parameters (no padding).
  int64_t numel() const { return numel_; }
  /// Elements with the padding: a multiple of StorageOptions::pad_to.
  int64_t padded_numel() const { return padded_numel_; }
  /// Element offset of parameter i in the flat layout.
  int64_t offset(std::size_t i) const { return offsets_.at(i); }
  /// Parameter by name; throws CheckFailed if absent.
  Parameter& get(const std::string& name) const;
  /// Zeroes every gradient held (flat, or the bound units).
  void zero_grad();

  // ---- mixed precision (StorageOptions::compute_dtype) ------------------------------------
  /// The dtype the layers compute in: bf16 in mixed precision, else dtype().
  DType compute_dtype() const { return mixed_ ? DType::bf16 : dtype_; }
  /// Mixed precision: the layers compute from a bf16 copy of the (fp32) values.
  bool mixed() const { return mixed_; }
  /// The flat bf16 compute copy (with the padding); undefined without mixed precision and with
  /// per-unit values (each unit has its own: bind_compute).
  Tensor& compute_values() { return compute_; }
  /// Casts the values (the fp32 master) into the flat compute copy: after init (bind does it),
  /// after values change outside an optimizer that refreshes it (a checkpoint load, a broadcast,
  /// an all-gather). No-op without a flat copy (per-unit compute buffers are filled by whoever
  /// binds them).
  void refresh_compute();

  // ---- units (per_unit storage) -----------------------------------------------------------
  /// The units, in layout order.
  const std::vector<Unit>& units() const { return units_; }
  /// Index of the unit holding parameter p.
  std::size_t unit_of(const Parameter* p) const;
  /// How values and gradients are stored.
  const StorageOptions& storage() const { return storage_; }
  /// The values' and gradients' dtype (the fp32 master in mixed precision).
  DType dtype() const { return dtype_; }
  /// Where they live.
  Device device() const { return device_; }
  /// Whether unit `unit`'s values are held now (always with flat storage).
  bool values_bound(std::size_t unit) const;
  /// Whether unit `unit`'s gradients are held now (always with flat storage).
  bool grads_bound(std::size_t unit) const;
  /// Allocates unit u's own value buffer (u.numel() elements, uninitialised), points its
  /// parameters' values at it and returns it (the caller fills it, e.g. by an all-gather).
  Tensor bind_values(std::size_t unit);
  /// Frees unit u's values; its parameters' values become undefined.
  void release_values(std::size_t unit);
  /// Allocates unit u's own gradient buffer, zeroed; its parameters' grads point into it.
  Tensor bind_grads(std::size_t unit);
  /// Frees unit u's gradients.
  void release_grads(std::size_t unit);
  /// Unit u's values as one 1-d tensor (flat storage: a view of the flat buffer).
  Tensor unit_values(std::size_t unit) const;
  /// Unit u's gradients as one 1-d tensor (flat storage: a view of the flat buffer).
  Tensor unit_grads(std::size_t unit) const;

  // ---- per-unit compute buffers (mixed precision with per_unit values: ZeRO-3 in bf16) -----
  // The layers read Parameter::compute_value(); in mixed precision that is the bf16 copy. ZeRO-3
  // gathers the 2-byte weights straight into a unit's compute buffer, so the unit's fp32 values
  // are never bound during a step: the fp32 master lives in the trainer's shards only.
  /// Allocates unit u's bf16 compute buffer (u.numel() elements, uninitialised), points its
  /// parameters' `compute` at it and returns it (the caller fills it, e.g. by an all-gather of
  /// bf16 shards). Needs mixed precision and per_unit values.
  Tensor bind_compute(std::size_t unit);
  /// Frees unit u's compute buffer; its parameters' `compute` become undefined.
  void release_compute(std::size_t unit);
  /// Unit u's compute copy as one 1-d tensor: a view of the flat copy, or the unit's buffer
  /// (undefined while released, and without mixed precision).
  Tensor unit_compute(std::size_t unit) const;
  /// Whether what the layers read of unit u (Parameter::compute_value()) is there: in mixed
  /// precision its compute copy (always, with flat values; bound by bind_compute, per unit), else
  /// its values (values_bound).
  bool compute_bound(std::size_t unit) const;

 private:
  std::vector<Parameter*> params_;
  std::vector<int64_t> offsets_;
  std::vector<Unit> units_;
  std::vector<Tensor> unit_values_, unit_grads_;  // per_unit storage
  std::vector<Tensor> unit_compute_;               // per_unit values in mixed precision
  bool mixed_ = false;                             // a bf16 compute copy of f32/f64 values
  StorageOptions storage_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu();
  int64_t numel_ = 0, padded_numel_ = 0;
  Tensor values_, grads_;                  // flat storage, padded
  Tensor compute_;                         // mixed precision: the bf16 copy of values_
  Tensor values_real_, grads_real_;        // views without the padding
};

/// Called when a layer's backward is done with the parameters whose gradients are now final
/// (DDP overlap launches a bucket's all-reduce from here).
using BackwardHook = std::function<void(const std::vector<Parameter*>& done)>;

}  // namespace scalelab::nn
