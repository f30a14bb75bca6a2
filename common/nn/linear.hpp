#pragma once
/// @file linear.hpp
/// y = x W^T + b, with W stored (out, in) as PyTorch's nn.Linear.
/// A Linear may own a slice of its full weight (Shard): rows = some output features (column
/// parallel: each rank computes part of y), columns = some input features (row parallel: each rank
/// computes a partial sum of y, to be all-reduced). A row-parallel layer keeps its bias whole and
/// does NOT add it in forward: the caller adds it once, after the all-reduce (add_bias), so the
/// sum over ranks counts it once and every rank's copy gets the same, whole gradient.
#include <string>
#include <vector>

#include "common/nn/parameter.hpp"

namespace scalelab::nn {

/// How a backward writes an input's gradient. `add`: din += its share (the ops' convention, so
/// the gradients of a tensor read by two layers sum). `set`: din = its share, din's old contents
/// never read, so din may come from Tensor::empty: no zero-fill before it, and the GEMM does not
/// read it back (on a GPU each is a pass over the activation's bytes).
enum class InputGrad { add, set };

/// A fully connected layer, possibly holding only a slice of its weight (Shard): the column-
/// and row-parallel Linear of tensor parallelism are this class with a shard.
class Linear {
 public:
  /// `std` is the init scale of the weight; `shard` which rows (dim 0) or columns (dim 1) of
  /// the full (out_features, in_features) weight this layer holds.
  Linear(std::string name, int64_t in_features, int64_t out_features, bool bias = true,
         double std = 0.02, Shard shard = {});

  /// out (N, out_local) = in (N, in_local) @ W^T + b (+ b only if !row_parallel()).
  void forward(Tensor& out, const Tensor& in) const;
  /// out = GELU(pre), pre (N, out_local) = in @ W^T + b: the MLP's first layer with its GELU,
  /// fused into the matmul where the device can (ops::linear_gelu_forward). Not row parallel.
  void forward_gelu(Tensor& out, Tensor& pre, const Tensor& in) const;
  /// out (N, out) += b: for a row-parallel layer, after its partial sums are reduced.
  void add_bias(Tensor& out) const;
  /// din (N, in_local) += dout @ W (`into` set: din = dout @ W; skipped if din is undefined);
  /// dW += dout^T @ in; db += column sums of dout.
  void backward(Tensor& din, const Tensor& dout, const Tensor& in,
                InputGrad into = InputGrad::add);
  /// The backward of a layer whose input was in = GELU(pre) (the MLP's proj after its fc):
  /// dpre (N, in_local) = (dout @ W) * GELU'(pre), set, not accumulated, the gradient carried
  /// through the GELU in one op where the device can (ops::linear_dgelu_backward); dW and db as
  /// in backward.
  void backward_through_gelu(Tensor& dpre, const Tensor& dout, const Tensor& in,
                             const Tensor& pre);

  /// Input features this layer holds (all of them unless row parallel).
  int64_t in_features() const { return weight.shape()[1]; }
  /// Output features this layer holds (all of them unless column parallel).
  int64_t out_features() const { return weight.shape()[0]; }
  /// Whether it has a bias.
  bool has_bias() const { return has_bias_; }
  /// Holds a slice of the input features (its output is a partial sum).
  bool row_parallel() const { return weight.shard.dim == 1; }
  /// weight, then bias (if any).
  std::vector<Parameter*> parameters();

  Parameter weight;  ///< (out, in), or this layer's slice of it
  Parameter bias;    ///< (out), or this layer's slice (whole in a row-parallel layer)

 private:
  /// dW += dy^T @ x; db += column sums of dy (x, dy viewed as rows).
  void parameter_backward(const Tensor& dy, const Tensor& x);
  bool has_bias_;
};

}  // namespace scalelab::nn
