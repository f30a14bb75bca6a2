#pragma once
// A model's parameters: named tensors that are views into ONE flat buffer of values and ONE flat
// buffer of gradients, in a stable order. Later labs rely on that: a DDP bucket, a ZeRO shard or a
// flat all-reduce is a slice of the flat buffer (Tensor::flat), no gathering or copying needed.
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
  int dim = -1;  // -1: the whole tensor
  std::vector<std::pair<int64_t, int64_t>> ranges;
  bool whole() const { return dim < 0; }
  /// Rows or columns kept.
  int64_t count() const;
};

enum class Init { normal, zeros, ones };

struct Parameter {
  std::string name;                // "blocks.0.attn.qkv.weight"
  std::vector<int64_t> full_shape; // the unsharded shape
  Shard shard;                     // which part of it this parameter holds
  Init init = Init::normal;
  double init_std = 0.02;
  bool weight_decay = false;       // nanoGPT decays 2-d weights only
  std::string init_key;            // whose values to draw (defaults to name; a copy of a tied
                                   // weight on another pipeline stage names the original)
  Tensor value, grad;              // views into the flat buffers, set by ParameterSet::bind

  /// The local shape (full_shape with the shard applied).
  std::vector<int64_t> shape() const;
  int64_t numel() const;
};

/// Draws parameter values: each parameter's FULL tensor from (seed, init_key), then keeps its
/// shard. So a sharded model, a pipeline stage or a model built in another order holds exactly the
/// values of the single-device model.
void init_parameter(Parameter& p, uint64_t seed);

/// Lays out parameters in one flat value buffer and one flat gradient buffer.
class ParameterSet {
 public:
  /// Binds each parameter's value and grad to consecutive views of two new flat buffers (in the
  /// order given), initialises values from `seed` and zeroes the gradients.
  void bind(std::vector<Parameter*> params, DType dtype, Device device, uint64_t seed);

  const std::vector<Parameter*>& list() const { return params_; }
  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  int64_t numel() const { return values_.defined() ? values_.numel() : 0; }
  /// Element offset of parameter i in the flat buffers.
  int64_t offset(std::size_t i) const { return offsets_.at(i); }
  /// Parameter by name; throws CheckFailed if absent.
  Parameter& get(const std::string& name) const;
  void zero_grad();

 private:
  std::vector<Parameter*> params_;
  std::vector<int64_t> offsets_;
  Tensor values_, grads_;
};

/// Called when a layer's backward is done with the parameters whose gradients are now final
/// (DDP overlap launches a bucket's all-reduce from here).
using BackwardHook = std::function<void(const std::vector<Parameter*>& done)>;

}  // namespace scalelab::nn
