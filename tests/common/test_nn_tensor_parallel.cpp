// Tensor-parallel Blocks (2 ranks): each rank holds half the heads and half the MLP; with the
// partial outputs all-reduced (Block::reduce_forward) and the partial input gradients all-reduced
// (Block::reduce_backward), output, input gradient and every gradient shard equal the unsharded
// block's. float64; tolerance 1e-12 relative to the largest value (only summation order differs).
#include <gtest/gtest.h>

#include <mpi.h>

#include <cmath>

#include "common/nn/block.hpp"
#include "common/runtime.hpp"
#include "tests/common/gradcheck.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
void all_reduce(Tensor& t) {
  MPI_Allreduce(MPI_IN_PLACE, t.data<double>(), static_cast<int>(t.numel()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
}

// The local part of a full tensor, as a parameter's shard describes it.
std::vector<double> shard_of(const Tensor& full, const nn::Shard& s) {
  if (s.whole()) return full.to_vector();
  std::vector<double> out;
  const int64_t R = full.size(0), C = full.dim() > 1 ? full.size(1) : 1;
  if (s.dim == 0) {
    for (auto [b, e] : s.ranges)
      for (int64_t r = b; r < e; ++r)
        for (int64_t c = 0; c < C; ++c) out.push_back(full.item(r * C + c));
  } else {
    for (int64_t r = 0; r < R; ++r)
      for (auto [b, e] : s.ranges)
        for (int64_t c = b; c < e; ++c) out.push_back(full.item(r * C + c));
  }
  return out;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-300;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-12 * scale) << what << " element " << i;
}
}  // namespace

TEST(TensorParallel, ShardedBlockMatchesTheWholeBlock) {
  if (world_size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const int rank = world_rank();
  const int64_t C = 8, NH = 2, L = 2;
  nn::Block whole(0, C, NH, L), half(0, C, NH, L, rank, 2);
  nn::ParameterSet ws, hs;
  ws.bind(whole.parameters(), DType::f64, Device::cpu(), 3);
  hs.bind(half.parameters(), DType::f64, Device::cpu(), 3);
  // kept whole on both ranks: ln1 and ln2 (2C each) and the two row-parallel biases (C each)
  EXPECT_EQ(hs.numel() * 2, ws.numel() + 6 * C)
      << "only the weights and the column-parallel biases are split";
  // random values (the same on both ranks: same seed), then cut the shards from them
  fill_uniform(ws.values(), 4, -0.5, 0.5);
  for (nn::Parameter* p : half.parameters()) {
    const nn::Parameter& full = ws.get(p->name);
    const std::vector<double> v = shard_of(full.value, p->shard);
    for (int64_t i = 0; i < p->numel(); ++i) p->value.data<double>()[i] = v[i];
  }
  // the row-parallel projections' biases are whole on both ranks: add them once (rank 0)
  if (rank == 1) {
    for (nn::Parameter* b : {&half.attn.proj.bias, &half.mlp.proj.bias})
      for (int64_t i = 0; i < b->numel(); ++i) b->value.data<double>()[i] = 0;
  }
  half.reduce_forward = all_reduce;
  half.reduce_backward = all_reduce;

  Tensor x = uniform({2, 5, C}, 5), dout = uniform({2, 5, C}, 6);
  expect_close(half.forward(x).to_vector(), whole.forward(x).to_vector(), "output");
  expect_close(half.backward(dout, x).to_vector(), whole.backward(dout, x).to_vector(), "dx");
  for (nn::Parameter* p : half.parameters())
    expect_close(p->grad.to_vector(), shard_of(ws.get(p->name).grad, p->shard), p->name);
}
