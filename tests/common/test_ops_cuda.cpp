// Every CUDA op against its host twin, and a GPT step on both (label gpu; skipped without a GPU).
// Tolerance: fp32 with TF32 off, |cuda - cpu| <= 1e-4 * max(1, |cpu|) per element
// (GPT gradients: relative to the largest |gradient| of the parameter).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "common/device.hpp"
#include "common/nn/gpt.hpp"
#include "common/ops/cuda/ops_cuda.hpp"
#include "common/ops/flash_attention.hpp"
#include "common/ops/fused_backend.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "common/scalar.hpp"
#include "tests/common/cuda_checks.hpp"
#include "tests/common/gradcheck.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
constexpr double kTol = 1e-4;
const Device gpu = Device::cuda(0);

using CudaOps = CudaTest;
// the optimizer's and clipping's trial kernels (issue33.sh runs *ReductionsAndOptimizers*)
using ReductionsAndOptimizers = CudaTest;

Tensor rnd(std::vector<int64_t> shape, uint64_t seed, double lo = -1, double hi = 1) {
  return uniform(std::move(shape), seed, DType::f32, lo, hi);
}

std::vector<double> host_values(const Tensor& t) { return t.to(Device::cpu()).to_vector(); }

// How many elements of a and b (of one size) differ: an update that changed nothing has 0.
int64_t count_differing(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = host_values(a), y = host_values(b);
  int64_t n = 0;
  for (std::size_t i = 0; i < x.size(); ++i) n += x[i] != y[i];
  return n;
}

struct LayerNormGrads {
  Tensor din, dweight, dbias;
};

// LayerNorm's forward, then its backward into gradients that already hold values (it adds), for
// N rows of C of `dt` on `d`, from the same drawn inputs on every device. With `v2` the backward
// is version 2 itself (ops::cuda::layernorm_backward_v2) and *v2 says whether it took the rows
// (when not, it did nothing). With `residual` din starts as other numbers and the values it
// would have held come as the residual's gradient (din = dresidual + ...): the same bits.
LayerNormGrads layernorm_grads(int64_t N, int64_t C, DType dt, Device d, bool* v2 = nullptr,
                               bool residual = false) {
  const auto draw = [&](std::vector<int64_t> shape, uint64_t seed, double lo = -1, double hi = 1) {
    return uniform(std::move(shape), seed, dt, lo, hi).to(d);
  };
  const Tensor x = draw({N, C}, 14, -2, 2), w = draw({C}, 15), b = draw({C}, 16),
               dout = draw({N, C}, 17);
  Tensor out = Tensor::empty({N, C}, dt, d), mean = Tensor::empty({N}, dt, d),
         rstd = Tensor::empty({N}, dt, d);  // f32 data: f32 statistics; f64: f64
  ops::layernorm_forward(out, mean, rstd, x, w, b);
  LayerNormGrads g{draw({N, C}, residual ? 21 : 18), draw({C}, 19), draw({C}, 20)};
  const Tensor dres = residual ? draw({N, C}, 18) : Tensor();
  if (!v2) {
    ops::layernorm_backward(g.din, g.dweight, g.dbias, dout, x, w, mean, rstd, dres);
    return g;
  }
  *v2 = ops::cuda::layernorm_backward_v2(g.din, g.dweight, g.dbias, dout, x, w, mean, rstd,
                                         residual ? dres : g.din);
  return g;
}

// The same for bf16 data as lab 02 runs it: f32 statistics, parameter gradients of grad_dt. With
// `v3` the backward is version 3 itself (ops::cuda::layernorm_backward_v3) and *v3 says whether
// it took the rows; `residual` as above.
LayerNormGrads layernorm_grads_bf16(int64_t N, int64_t C, DType grad_dt, Device d,
                                    bool* v3 = nullptr, bool residual = false) {
  const auto draw = [&](std::vector<int64_t> shape, uint64_t seed, DType dt, double lo = -1,
                        double hi = 1) {
    return uniform(std::move(shape), seed, dt, lo, hi).to(d);
  };
  const DType bf = DType::bf16;
  const Tensor x = draw({N, C}, 14, bf, -2, 2), w = draw({C}, 15, bf), b = draw({C}, 16, bf),
               dout = draw({N, C}, 17, bf);
  Tensor out = Tensor::empty({N, C}, bf, d), mean = Tensor::empty({N}, DType::f32, d),
         rstd = Tensor::empty({N}, DType::f32, d);
  ops::layernorm_forward(out, mean, rstd, x, w, b);
  LayerNormGrads g{draw({N, C}, residual ? 21 : 18, bf), draw({C}, 19, grad_dt),
                   draw({C}, 20, grad_dt)};
  const Tensor dres = residual ? draw({N, C}, 18, bf) : Tensor();
  if (!v3) ops::layernorm_backward(g.din, g.dweight, g.dbias, dout, x, w, mean, rstd, dres);
  else *v3 = ops::cuda::layernorm_backward_v3(g.din, g.dweight, g.dbias, dout, x, w, mean, rstd,
                                              residual ? dres : g.din);
  return g;
}

// The dispatcher's gradients (dev) against the host's: dx within dx_tol, dweight and dbias
// within tol plus `drift` (sums over the rows in another order); then, where the version called
// directly took the shape (ran), the dispatcher's bits are its bits.
void expect_layernorm_grads(const LayerNormGrads& dev, const LayerNormGrads& host,
                            const LayerNormGrads& direct, bool ran, double dx_tol, double tol,
                            double drift, const std::string& what) {
  expect_close(dev.din, host.din, dx_tol, what + " dx");
  expect_close(dev.dweight, host.dweight, tol, what + " dweight", drift);
  expect_close(dev.dbias, host.dbias, tol, what + " dbias", drift);
  if (!ran) return;
  expect_same_bits(dev.din, direct.din, what + " dx, dispatcher and the version itself");
  expect_same_bits(dev.dweight, direct.dweight, what + " dweight, dispatcher and the version");
  expect_same_bits(dev.dbias, direct.dbias, what + " dbias, dispatcher and the version");
}

}  // namespace

TEST_F(CudaOps, Matmul) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Tensor a = ta ? rnd({37, 23}, 1) : rnd({23, 37}, 1), b = tb ? rnd({19, 37}, 2) : rnd({37, 19}, 2);
      same_on_both("matmul", {rnd({23, 19}, 3), a, b}, [&](std::vector<Tensor>& t) {
        ops::matmul(t[0], t[1], t[2], ta, tb, 0.5, 1.0);
      });
      Tensor ba = ta ? rnd({3, 9, 5}, 4) : rnd({3, 5, 9}, 4), bb = tb ? rnd({3, 7, 9}, 5) : rnd({3, 9, 7}, 5);
      same_on_both("batched_matmul", {rnd({3, 5, 7}, 6), ba, bb}, [&](std::vector<Tensor>& t) {
        ops::batched_matmul(t[0], t[1], t[2], ta, tb);
      });
    }
}

TEST_F(CudaOps, Pointwise) {
  same_on_both("fill/scale/axpy/add", {rnd({1000}, 7), rnd({1000}, 8)}, [](std::vector<Tensor>& t) {
    ops::scale(t[0], 0.5);
    ops::axpy(t[0], 2.0, t[1]);
    ops::add(t[1], t[0], t[1]);
  });
  same_on_both("bias", {rnd({6, 10}, 9), rnd({10}, 10)}, [](std::vector<Tensor>& t) {
    ops::add_bias(t[0], t[1]);
    ops::bias_backward(t[1], t[0]);
  });
  same_on_both("gelu", {rnd({500}, 11, -4, 4), rnd({500}, 12), rnd({500}, 13)}, [](std::vector<Tensor>& t) {
    ops::gelu_backward(t[2], t[0], t[1]);
    ops::gelu_forward(t[1], t[0]);
  });
}

TEST_F(CudaOps, LayerNormAndSoftmax) {
  same_on_both("layernorm", {rnd({33, 70}, 14, -2, 2), rnd({70}, 15), rnd({70}, 16), rnd({33, 70}, 17),
                             rnd({33}, 0), rnd({33}, 0), rnd({33, 70}, 18), rnd({70}, 19), rnd({70}, 20)},
               [](std::vector<Tensor>& t) {
                 ops::layernorm_forward(t[3], t[4], t[5], t[0], t[1], t[2]);
                 ops::layernorm_backward(t[6], t[7], t[8], t[3], t[0], t[1], t[4], t[5]);
               });
  same_on_both("softmax", {rnd({9, 300}, 21, -5, 5), rnd({9, 300}, 0)},
               [](std::vector<Tensor>& t) { ops::softmax_forward(t[1], t[0]); });
}

// LayerNorm's backward version 2 (one read of x and dout; a trial kernel, passed on an H200 but
// slower): 33 rows make two blocks, the last one short; 700 x 768 fills a block's shared memory
// with 8 warps' column sums (gpt-85m's width); 40 x 3100 leaves room for one warp only, 3 x 6144
// for exactly one (2 C float sums: 48 KiB) and 3 x 6152 for none (version 2 declines, version 1
// runs); 50001 x 40 caps the grid at 1024 blocks of ~49 rows (more than 32 each). In f64 the
// same edges at half the width, and the capped grid. Against the host: dx at 1e-4 relative
// (f32); dweight and dbias, sums over the N rows in another order, at 1e-4 relative plus 2e-7 N
// (the host sums the rows one after the other in float: ~1e-8 N of drift, 20 times that
// allowed; a row left out or counted twice moves a sum by ~0.5); f64 at 1e-10. Version 2
// called directly must say whether it takes the shape (the threshold in its file's comment),
// and give the bits that the dispatcher gave (it has no atomics: two runs, the same bits), which
// shows that the dispatcher ran it.
TEST_F(CudaOps, LayerNormBackwardVersion2) {
  const TrialKernels trial("layernorm_backward_v2");
  const std::vector<std::tuple<DType, int64_t, int64_t>> cases = {
      {DType::f32, 33, 70},   {DType::f32, 700, 768}, {DType::f32, 40, 3100},
      {DType::f32, 3, 6144},  {DType::f32, 3, 6152},  {DType::f32, 50001, 40},
      {DType::f64, 3, 3072},  {DType::f64, 3, 3080},  {DType::f64, 50001, 40}};
  for (const auto& [dt, N, C] : cases) {
    const std::string what = std::string("layernorm v2 ") + dtype_name(dt) + " " +
                             std::to_string(N) + " x " + std::to_string(C);
    const LayerNormGrads host = layernorm_grads(N, C, dt, Device::cpu());
    const LayerNormGrads dev = layernorm_grads(N, C, dt, gpu);
    bool ran = false;
    const LayerNormGrads v2 = layernorm_grads(N, C, dt, gpu, &ran);
    const int64_t sum_bytes = dt == DType::f64 ? 8 : 4;  // its column sums' type
    EXPECT_EQ(ran, 2 * C * sum_bytes <= (48 << 10)) << what;
    const double tol = dt == DType::f64 ? 1e-10 : 1e-4, drift = dt == DType::f64 ? 0 : 2e-7 * N;
    expect_layernorm_grads(dev, host, v2, ran, tol, tol, drift, what + " (version 2)");
  }
}

// LayerNorm's backward version 3 (one read, each lane's column sums in registers; a trial kernel
// written without a GPU): bf16 data only, C a multiple of 256 up to 1024. gpt-85m's 16384 x 768
// (128 blocks of 128 rows, 3 chunks of 256 columns) and 700 x 768 (6 blocks of 116 or 117 rows:
// warps see 14 or 15), 33 x 512 (one block) with bf16 parameter gradients, 300 x 256 and
// 300 x 1024 (1 and 4 chunks); 100 x 770 and 100 x 1280 it declines (version 1 runs); 5 x 256 (warps
// with no row) and 140000 x 256 (the grid capped at 1024 blocks of ~137 rows). Against the
// host: dx within 2 bf16 steps (both round once; the row's two means are float sums in another
// order), f32 dweight and dbias at 1e-4 relative plus 2e-7 N (version 2's test says why), bf16
// ones within 2 bf16 steps. Called directly it must say whether it takes the shape and give the
// dispatcher's bits (no atomics: the same bits every run), which shows that the dispatcher ran it.
TEST_F(CudaOps, LayerNormBackwardVersion3) {
  const TrialKernels trial("layernorm_backward_v3");
  struct Case {
    int64_t N, C;
    DType grad;
    bool takes;
  };
  const Case cases[] = {{16384, 768, DType::f32, true}, {700, 768, DType::f32, true},
                        {33, 512, DType::bf16, true},   {300, 256, DType::f32, true},
                        {300, 1024, DType::f32, true},  {100, 770, DType::f32, false},
                        {100, 1280, DType::f32, false}, {5, 256, DType::bf16, true},
                        {140000, 256, DType::f32, true}};
  const double two_steps = 1.0 / 128;
  for (const Case& k : cases) {
    const std::string what = "layernorm v3 " + std::to_string(k.N) + " x " + std::to_string(k.C) +
                             " " + dtype_name(k.grad) + " gradients";
    const LayerNormGrads host = layernorm_grads_bf16(k.N, k.C, k.grad, Device::cpu());
    const LayerNormGrads dev = layernorm_grads_bf16(k.N, k.C, k.grad, gpu);
    bool ran = false;
    const LayerNormGrads v3 = layernorm_grads_bf16(k.N, k.C, k.grad, gpu, &ran);
    EXPECT_EQ(ran, k.takes) << what;
    const double tol = k.grad == DType::f32 ? 1e-4 : two_steps;
    const double drift = k.grad == DType::f32 ? 2e-7 * k.N : 0;
    expect_layernorm_grads(dev, host, v3, ran, two_steps, tol, drift, what + " (version 3)");
  }
}

// The residual's gradient given to LayerNorm's backward (din = dresidual + ..., how a block's
// backward adds its skip path without copying it into din first) gives the bits of the
// accumulating form (din held those values: din += ...), in each version: 1 (every op's first),
// 2 and 3 (on trial), at shapes each takes, with the direct calls of versions 2 and 3 given
// the residual too; and on the host.
TEST_F(CudaOps, LayerNormBackwardIntoTheResidualGradient) {
  const auto same = [](const LayerNormGrads& into, const LayerNormGrads& added,
                       const std::string& what) {
    expect_same_bits(into.din, added.din, what + " dx");
    expect_same_bits(into.dweight, added.dweight, what + " dweight");
    expect_same_bits(into.dbias, added.dbias, what + " dbias");
  };
  for (const Device d : {Device::cpu(), gpu}) {
    for (const char* version : {"none", "layernorm_backward_v2", "layernorm_backward_v3"}) {
      const TrialKernels trial(version);
      const std::string what = std::string(version) + " on " + d.str();
      same(layernorm_grads(33, 70, DType::f32, d, nullptr, true),
           layernorm_grads(33, 70, DType::f32, d), what + ", f32 33 x 70");
      same(layernorm_grads(5, 40, DType::f64, d, nullptr, true),
           layernorm_grads(5, 40, DType::f64, d), what + ", f64 5 x 40");
      same(layernorm_grads_bf16(700, 768, DType::f32, d, nullptr, true),
           layernorm_grads_bf16(700, 768, DType::f32, d), what + ", bf16 700 x 768");
    }
  }
  bool ran_into = false, ran_added = false;
  same(layernorm_grads(40, 3100, DType::f32, gpu, &ran_into, true),
       layernorm_grads(40, 3100, DType::f32, gpu, &ran_added), "version 2 called directly");
  EXPECT_TRUE(ran_into && ran_added) << "version 2 declined 40 x 3100";
  same(layernorm_grads_bf16(300, 1024, DType::bf16, gpu, &ran_into, true),
       layernorm_grads_bf16(300, 1024, DType::bf16, gpu, &ran_added), "version 3 called directly");
  EXPECT_TRUE(ran_into && ran_added) << "version 3 declined 300 x 1024";
}

TEST_F(CudaOps, AttentionPieces) {
  same_on_both("heads", {rnd({2, 5, 24}, 22), rnd({2, 2, 5, 4}, 0), rnd({2, 2, 5, 4}, 0),
                         rnd({2, 2, 5, 4}, 0), rnd({2, 5, 8}, 0), rnd({2, 5, 24}, 0)},
               [](std::vector<Tensor>& t) {
                 ops::split_heads(t[1], t[2], t[3], t[0], 2);
                 ops::merge_heads(t[4], t[1]);
                 ops::split_heads_backward(t[5], t[3], t[1], t[2]);
                 ops::merge_heads_backward(t[1], t[4]);
               });
  same_on_both("causal softmax", {rnd({3, 40, 40}, 23, -3, 3), rnd({3, 40, 40}, 0), rnd({3, 40, 40}, 24),
                                  rnd({3, 40, 40}, 0)},
               [](std::vector<Tensor>& t) {
                 ops::causal_softmax_forward(t[1], t[0], 0.3);
                 ops::causal_softmax_backward(t[3], t[1], t[2], 0.3);
               });
}

// Ring attention's pieces (lab 11): an unmasked flash block forward and backward, and the
// online-softmax merge of two blocks' (output, log-sum-exp). Head size 16 (the kernel's sizes).
TEST_F(CudaOps, UnmaskedFlashBlocksAndMerge) {
  same_on_both("flash, causal = false", {rnd({3, 37, 16}, 40), rnd({3, 37, 16}, 41), rnd({3, 37, 16}, 42),
                                         rnd({3, 37, 16}, 43), rnd({3, 37, 16}, 0), rnd({3, 37}, 0),
                                         rnd({3, 37, 16}, 0), rnd({3, 37, 16}, 0), rnd({3, 37, 16}, 0)},
               [](std::vector<Tensor>& t) {
                 ops::flash_attention_forward(t[4], t[5], t[0], t[1], t[2], 0.25, /*causal=*/false);
                 ops::flash_attention_backward(t[6], t[7], t[8], t[3], t[0], t[1], t[2], t[4], t[5],
                                               0.25, /*causal=*/false);
               });
  same_on_both("attention_merge", {rnd({3, 37, 16}, 44), rnd({3, 37}, 45, -2, 2), rnd({3, 37, 16}, 46),
                                   rnd({3, 37}, 47, -2, 2)},
               [](std::vector<Tensor>& t) { ops::attention_merge(t[0], t[1], t[2], t[3]); });
}

TEST_F(CudaOps, EmbeddingAndCrossEntropy) {
  Tensor ids = random_tokens({3, 6}, 11, 25);
  Tensor targets = random_tokens({18}, 11, 26);
  Tensor ids_gpu = ids.to(gpu), targets_gpu = targets.to(gpu);
  same_on_both("embedding", {rnd({3, 6, 8}, 0), rnd({11, 8}, 27), rnd({6, 8}, 28), rnd({3, 6, 8}, 29),
                             rnd({11, 8}, 30), rnd({6, 8}, 31)},
               [&](std::vector<Tensor>& t) {
                 const Tensor& tok = t[0].device().is_cuda() ? ids_gpu : ids;
                 ops::embedding_forward(t[0], tok, t[1], t[2]);
                 ops::embedding_backward(t[4], t[5], t[3], tok);
               });
  same_on_both("cross entropy", {rnd({18}, 0), rnd({18, 11}, 0), rnd({18, 11}, 32, -4, 4), rnd({18, 11}, 0)},
               [&](std::vector<Tensor>& t) {
                 const Tensor& tg = t[0].device().is_cuda() ? targets_gpu : targets;
                 ops::cross_entropy_forward(t[0], t[1], t[2], tg);
                 ops::cross_entropy_backward(t[3], t[1], tg, 0.25);
               });
}

// The token embedding's gradient, version 1 (every vocabulary row scans all tokens, kept beside
// the default for scalelab_bench_kernels) against the host and against version 2: the same
// additions in the same order, so the same bits. 300 tokens over 11 ids, f32 and bf16 data.
TEST_F(CudaOps, EmbeddingBackwardVersion1) {
  const Tensor ids = random_tokens({20, 15}, 11, 33), ids_gpu = ids.to(gpu);
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor dout = Tensor::from_vector(rnd({20, 15, 8}, 34).to_vector(), {20, 15, 8}, dt);
    Tensor host = Tensor::zeros({11, 8}), no_dwpe;
    ops::embedding_backward(host, no_dwpe, dout, ids);
    Tensor v1 = Tensor::zeros({11, 8}, DType::f32, gpu), v2 = v1.clone();
    ops::cuda::embedding_backward_v1(v1, no_dwpe, dout.to(gpu), ids_gpu);
    ops::embedding_backward(v2, no_dwpe, dout.to(gpu), ids_gpu);
    expect_close(v1, host, 1e-5, std::string("version 1 ") + dtype_name(dt));
    EXPECT_EQ(v1.to(Device::cpu()).to_vector(), v2.to(Device::cpu()).to_vector()) << dtype_name(dt);
  }
}

// The grouped-row sums in chunks (the trial kernel "grouped_rows_in_chunks", rows_by_id.cuh)
// against the host: an embedding gradient where one id is 7 tokens in 10 (~700 of 1000: eleven
// chunks of 64), ids 2, 4, 6, 7, 8 the rest (~60 each: one chunk), and ids 0 and 1 (the first
// rows), 5 (a middle one) and 9, 10 (the last) never occur: rows with no chunk, which the search
// from a chunk to its row must step over, left exactly 0; and a masked index add (a rank holding
// rows [0, 7) of 11: rows 0, 1 and 5 empty, the frequent id its own, ids 7 and 8 another rank's).
// Each twice, for the same bits (a fixed order of additions, no atomics). Tolerance 1e-4
// relative: ~700 f32 values summed in another order.
TEST_F(CudaOps, GroupedRowsInChunksMatchTheHost) {
  const TrialKernels trial("grouped_rows_in_chunks");
  const double others[] = {2, 4, 6, 7, 8};
  std::vector<double> skewed(1000);
  for (std::size_t n = 0; n < skewed.size(); ++n) skewed[n] = n % 10 < 7 ? 3 : others[n / 10 % 5];
  const Tensor ids = Tensor::from_vector(skewed, {10, 100}, DType::i32), ids_gpu = ids.to(gpu);
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::string what = std::string("embedding, chunks, ") + dtype_name(dt);
    const Tensor dout = Tensor::from_vector(rnd({10, 100, 8}, 38).to_vector(), {10, 100, 8}, dt);
    const Tensor dout_gpu = dout.to(gpu);
    Tensor host = Tensor::zeros({11, 8}), none;
    ops::embedding_backward(host, none, dout, ids);
    Tensor first;
    for (int run = 0; run < 2; ++run) {
      Tensor dev = Tensor::zeros({11, 8}, DType::f32, gpu);
      ops::embedding_backward(dev, none, dout_gpu, ids_gpu);
      expect_close(dev, host, 1e-4, what);
      const std::vector<double> got = host_values(dev);
      for (int64_t row : {0, 1, 5, 9, 10})
        for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(got[row * 8 + c], 0.0) << what << " row " << row;
      if (run == 0) first = dev;
      else expect_same_bits(dev, first, what + ", a second run");
    }
  }
  const Tensor src = rnd({1000, 8}, 39), flat = ids.view({1000}), flat_gpu = ids_gpu.view({1000});
  const Tensor table = rnd({7, 8}, 40), src_gpu = src.to(gpu);
  Tensor host = table.clone();
  ops::index_add_rows(host, src, flat, 0);
  Tensor first;
  for (int run = 0; run < 2; ++run) {
    Tensor dev = table.to(gpu);
    ops::index_add_rows(dev, src_gpu, flat_gpu, 0);
    expect_close(dev, host, 1e-4, "masked index add, chunks");
    for (int64_t row : {0, 1, 5})  // nothing to add: the table's own bits
      expect_same_bits(dev.flat(row * 8, 8), table.flat(row * 8, 8),
                       "masked index add, empty row " + std::to_string(row));
    if (run == 0) first = dev;
    else expect_same_bits(dev, first, "masked index add, chunks, a second run");
  }
}

// The pieces of lab 07's vocabulary-parallel embedding and cross-entropy: a rank holding rows /
// columns [4, 9) of 11, so some ids are its own and some another rank's (masked).
TEST_F(CudaOps, RowPiecesAndMaskedIndexing) {
  const int64_t lo = 4;
  Tensor ids = random_tokens({18}, 11, 33);
  Tensor ids_gpu = ids.to(gpu);
  same_on_both("masked rows", {rnd({18, 8}, 0), rnd({5, 8}, 34), rnd({18, 8}, 35), rnd({5, 8}, 36)},
               [&](std::vector<Tensor>& t) {
                 const Tensor& id = t[0].device().is_cuda() ? ids_gpu : ids;
                 ops::gather_rows(t[0], t[1], id, lo);
                 ops::index_add_rows(t[3], t[2], id, lo);
               });
  same_on_both("row softmax pieces", {rnd({18, 5}, 37, -4, 4), rnd({18}, 0), rnd({18}, 0),
                                      rnd({18}, 0), rnd({18}, 0), rnd({18, 5}, 0)},
               [&](std::vector<Tensor>& t) {
                 const Tensor& id = t[0].device().is_cuda() ? ids_gpu : ids;
                 ops::row_max(t[1], t[0]);
                 ops::pick_columns(t[3], t[0], id, lo);
                 ops::exp_rows(t[0], t[2], t[1]);
                 ops::divide_rows(t[0], t[2]);
                 ops::logarithm(t[4], t[2]);
                 ops::cross_entropy_backward(t[5], t[0], id, 0.25, lo);
               });
}

// A loss on the GPU (issue 31: a Scalar, read once a step): sum_into from f32, f64 and bf16
// values with the bits of sum() / divisor; then the arithmetic a step does with it (+= another
// loss, + a host number, * and / a number, a host number + it, -, * and / between two; its square
// root) with the bits of the same arithmetic on the host (IEEE quotients: / is a division there,
// not a product by the reciprocal) and no read until value().
TEST_F(CudaOps, ScalarArithmeticHasTheHostsBits) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const std::string what = dtype_name(dt);
    const Tensor x = uniform({100003}, 71, dt, -1, 1).to(gpu);
    Tensor s = Tensor::empty({1}, DType::f64, gpu);
    ops::sum_into(s, x, 3.0);
    const double sum = ops::sum(x), mean = sum / 3.0;
    EXPECT_EQ(s.to(Device::cpu()).item(), mean) << what;
    const int64_t reads = host_reads();
    Scalar loss(s);
    loss += Scalar(s);                           // 2 mean
    const Scalar a = (loss + 0.25) * 3 / 7;      // ((2 mean + 0.25) * 3) / 7
    Scalar b = Scalar(0.5);
    b += a;                                      // a host number + a device one: on the device
    const Scalar c = (1 - loss) * (loss / a) - -a / 3;  // between Scalars, a number on the left
    EXPECT_EQ(host_reads(), reads) << what << ": the arithmetic read a number back";
    EXPECT_EQ(a.device(), gpu) << what;
    EXPECT_EQ(b.device(), gpu) << what;
    const double host_a = (2 * mean + 0.25) * 3 / 7;
    EXPECT_EQ(a.value(), host_a) << what;
    EXPECT_EQ(b.value(), 0.5 + host_a) << what;
    EXPECT_EQ(c.device(), gpu) << what;
    EXPECT_EQ(c.value(), (1 - 2 * mean) * (2 * mean / host_a) - -host_a / 3) << what;
    // (its square root reads the number back until the trial kernel norm_on_device is checked)
    EXPECT_EQ((loss + 1000).sqrt().value(), std::sqrt(2 * mean + 1000)) << what;
    EXPECT_EQ((loss / 3).value(), 2 * mean / 3) << what;  // 1/3 is not exact: a division
  }
}

// Which physical GPU a device is, as nvidia-smi names it (the sharing check compares these).
TEST_F(CudaOps, DeviceUuidIsNvidiaSmisName) {
  const std::regex uuid("GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");
  for (int d = 0; d < cuda_device_count(); ++d)
    EXPECT_TRUE(std::regex_match(cuda_device_uuid(d), uuid)) << d << ": " << cuda_device_uuid(d);
  EXPECT_EQ(cuda_device_uuid(-1), "");
  EXPECT_EQ(cuda_device_uuid(cuda_device_count()), "");
}

TEST_F(CudaOps, ReductionsAndOptimizers) {
  Tensor x = rnd({100003}, 33);
  EXPECT_NEAR(ops::sum(x.to(gpu)), ops::sum(x), 1e-6 * 100003);
  EXPECT_NEAR(ops::sum_squares(x.to(gpu)), ops::sum_squares(x), 1e-6 * 100003);
  // sum_into keeps the sum on the GPU, with the bits of sum() (the same additions, in order)
  Tensor s = Tensor::empty({1}, DType::f64, gpu);
  ops::sum_into(s, x.to(gpu), 7.0);
  EXPECT_EQ(s.to(Device::cpu()).item(), ops::sum(x.to(gpu)) / 7.0);
  // a Scalar on the GPU: arithmetic there, one read
  const int64_t reads = host_reads();
  Scalar loss(s);
  loss += Scalar(s);
  const Scalar mean = loss / 2;
  EXPECT_EQ(host_reads(), reads);
  EXPECT_EQ(mean.device(), gpu);
  EXPECT_NEAR(mean.value(), ops::sum(x) / 7.0, 1e-9 * 100003);
  // clipping on the GPU: the sum of squares accumulated there (the bits of the host's
  // `s += sum_squares(x)`), the norm's square root and the scaling without a read
  // ("norm_on_device", the default since it passed this on an H200)
  const TrialKernels trial("norm_on_device");
  Tensor sq = Tensor::zeros({1}, DType::f64, gpu);
  ops::sum_squares_into(sq, x.to(gpu));
  ops::sum_squares_into(sq, x.to(gpu));
  const double twice = ops::sum_squares(x.to(gpu)) + ops::sum_squares(x.to(gpu));
  const int64_t before_clip = host_reads();
  const Scalar norm = Scalar(sq).sqrt();
  EXPECT_EQ(host_reads(), before_clip);
  EXPECT_EQ(norm.value(), std::sqrt(twice));
  same_on_both("clip_scale", {rnd({1000}, 41), Tensor::from_vector({25.0}, {1}, DType::f64)},
               [](std::vector<Tensor>& t) { ops::clip_scale(t[0], t[1], 2.0); });  // norm 5 > 2
  same_on_both("clip_scale below", {rnd({1000}, 42), Tensor::from_vector({1.0}, {1}, DType::f64)},
               [](std::vector<Tensor>& t) { ops::clip_scale(t[0], t[1], 2.0); });  // untouched
  ops::AdamWArgs a{1e-2, 0.9, 0.95, 1e-8, 0.1, 3};
  same_on_both("adamw", {rnd({500}, 34), rnd({500}, 35), rnd({500}, 36, 0, 1), rnd({500}, 37, 0, 1)},
               [&](std::vector<Tensor>& t) { ops::adamw_update(t[0], t[1], t[2], t[3], a); });
  // one launch over a flat buffer of three segments, the middle one not decaying
  const ops::DecaySegments segments{{100, 250, 500}, {true, false, true}};
  same_on_both("adamw segments",
               {rnd({500}, 34), rnd({500}, 35), rnd({500}, 36, 0, 1), rnd({500}, 37, 0, 1)},
               [&](std::vector<Tensor>& t) {
                 ops::adamw_update_segments(t[0], t[1], t[2], t[3], segments, a);
               });
  same_on_both("sgd", {rnd({500}, 38), rnd({500}, 39), rnd({500}, 40)},
               [&](std::vector<Tensor>& t) { ops::sgd_update(t[0], t[1], t[2], 0.1, 0.9, 0.01, false); });
}

// Sums of f32 in 16-byte pieces (trial kernel "sums_16_bytes", 512 blocks): near the host's,
// the same bits twice, sum_into with sum()'s bits (the same partials added in the same order),
// sum_squares_into adding into what out holds, and which version ran: a multiple of 4 elements
// (aligned, a fresh tensor) takes version 2; 100003 elements and bf16 data run version 1.
TEST_F(CudaOps, SumsIn16BytePieces) {
  const TrialKernels trial("sums_16_bytes");
  for (int64_t n : {int64_t{4} * 250001, int64_t{8}, int64_t{100003}}) {
    const std::string what = "sums_16_bytes over " + std::to_string(n);
    const Tensor x = rnd({n}, 34), xd = x.to(gpu);
    const double s = ops::sum(xd);
    EXPECT_EQ(ops::cuda::last_sum_blocks(), n % 4 == 0 ? 512 : 256) << what;
    EXPECT_NEAR(s, ops::sum(x), 1e-6 * n) << what;
    EXPECT_EQ(ops::sum(xd), s) << what << ": the same bits twice";
    const double q = ops::sum_squares(xd);
    EXPECT_NEAR(q, ops::sum_squares(x), 1e-6 * n) << what;
    Tensor mean = Tensor::empty({1}, DType::f64, gpu);
    ops::sum_into(mean, xd, 7.0);
    EXPECT_EQ(mean.to(Device::cpu()).item(), s / 7.0) << what;
    Tensor acc = Tensor::from_vector({2.5}, {1}, DType::f64).to(gpu);
    ops::sum_squares_into(acc, xd);
    EXPECT_EQ(acc.to(Device::cpu()).item(), 2.5 + q) << what;
  }
  ops::sum(uniform({1000}, 35, DType::bf16).to(gpu));
  EXPECT_EQ(ops::cuda::last_sum_blocks(), 256) << "bf16";
}

// norm_on_device's kernels (sum_squares_into, sqrt_into, clip_scale) against the way through
// the host that they replace (the trial off: the same arithmetic on numbers read back), on the
// GPU: the same bits, as their comments claim (the partial sums added in the host's order; sqrt
// and the division correctly rounded in double on both sides), with no number read back, where
// the host's way reads (so the switch was seen). Then sqrt_into over many elements: the bits of
// the host's std::sqrt (correctly rounded on both).
TEST_F(ReductionsAndOptimizers, NormOnDeviceHasTheBitsOfTheWayThroughTheHost) {
  const Tensor x = rnd({100003}, 33).to(gpu), y = rnd({517}, 34, -3, 3).to(gpu);
  struct Out {
    std::vector<double> sum_squares, norm, clipped, kept;
    int64_t reads = 0;
  };
  const auto run = [&] {
    Out o;
    const int64_t before = host_reads();
    Tensor sq = Tensor::zeros({1}, DType::f64, gpu), norm = Tensor::empty({1}, DType::f64, gpu);
    ops::sum_squares_into(sq, x);
    ops::sum_squares_into(sq, y);
    ops::sqrt_into(norm, sq);
    Tensor clipped = y.clone(), kept = y.clone();
    ops::clip_scale(clipped, sq, 2.0);  // the norm is ~190: scaled by ~2 / 190
    ops::clip_scale(kept, sq, 1e6);     // below: untouched
    o.reads = host_reads() - before;
    o.sum_squares = host_values(sq);
    o.norm = host_values(norm);
    o.clipped = host_values(clipped);
    o.kept = host_values(kept);
    return o;
  };
  Out on, off;
  {
    const TrialKernels trial("norm_on_device");
    on = run();
  }
  {
    const TrialKernels reference("norm_on_device", TrialKernels::kOff);
    off = run();
  }
  EXPECT_EQ(on.reads, 0);
  EXPECT_GT(off.reads, 0);
  EXPECT_EQ(on.sum_squares, off.sum_squares);
  EXPECT_EQ(on.norm, off.norm);
  EXPECT_EQ(on.clipped, off.clipped);
  EXPECT_NE(on.clipped, host_values(y));
  EXPECT_EQ(on.kept, host_values(y));
  EXPECT_EQ(on.sum_squares[0], ops::sum_squares(x) + ops::sum_squares(y));  // grad_norm's sum
  const TrialKernels trial("norm_on_device");
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor v = uniform({1000}, 35, dt, 0, 100);
    Tensor host = Tensor::empty({1000}, dt), dev = Tensor::empty({1000}, dt, gpu);
    ops::sqrt_into(host, v);
    ops::sqrt_into(dev, v.to(gpu));
    EXPECT_EQ(host_values(dev), host.to_vector()) << dtype_name(dt);
  }
}

// optim::clip_grad_norm on the GPU over four groups (sizes that leave a grid's last block part
// full) with the norm on the device (trial kernel "norm_on_device") against the way through the
// host (the trial off): the returned norm, on the GPU, with grad_norm's bits; the gradients
// after it bit for bit, clipped to the norm max_norm or, below it, as drawn; and nothing read
// back while it runs with the trial on.
TEST_F(ReductionsAndOptimizers, ClipGradNormOnTheDeviceReadsNothing) {
  const std::vector<int64_t> sizes = {1000, 100003, 37, 4096};
  const auto make = [&] {
    std::vector<optim::Group> g;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      g.push_back({Tensor::zeros({sizes[i]}, DType::f32, gpu), rnd({sizes[i]}, 50 + i).to(gpu),
                   i % 2 == 0});
    return g;
  };
  for (double max_norm : {1.0, 1e6}) {  // the norm is ~190: clipped, then not
    const std::string what = "max_norm " + std::to_string(max_norm);
    std::vector<optim::Group> on = make(), off = make();
    const double norm = optim::grad_norm(on);  // reads; before any clipping
    Scalar on_norm, off_norm;
    {
      const TrialKernels trial("norm_on_device");
      const int64_t before = host_reads();
      on_norm = optim::clip_grad_norm(on, max_norm);
      EXPECT_EQ(host_reads(), before) << what << ": clipping read a number back";
    }
    {
      const TrialKernels reference("norm_on_device", TrialKernels::kOff);
      const int64_t before = host_reads();
      off_norm = optim::clip_grad_norm(off, max_norm);
      EXPECT_GT(host_reads(), before) << what;
    }
    EXPECT_EQ(on_norm.device(), gpu) << what;
    EXPECT_EQ(on_norm.value(), off_norm.value()) << what;
    EXPECT_EQ(on_norm.value(), norm) << what;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::string group = what + ", group " + std::to_string(i);
      expect_same_bits(on[i].grad, off[i].grad, group);
      if (max_norm > norm) expect_same_bits(on[i].grad, rnd({sizes[i]}, 50 + i), group);
    }
    if (max_norm < norm) EXPECT_NEAR(optim::grad_norm(on), max_norm, 1e-5) << what;
  }
}

// AdamW over a model's flat buffers in one launch (the trial kernel "adamw_one_launch", which
// AdamW's constructor reads: the guard lives around the construction) against one adamw_update
// launch per parameter (the trial off), both on the GPU, two steps: the same bits in the master
// weights, m, v and, in mixed precision, the bf16 compute copies (the same arithmetic per
// element; the host's Optim.AdamWOverAFlatModelIsOnePassWithThePerParameterBits).
TEST_F(ReductionsAndOptimizers, AdamWInOneLaunchHasThePerParameterBits) {
  for (const DType compute : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(compute));
    const nn::GPTOptions o{.dtype = DType::f32, .device = gpu, .seed = 3, .compute_dtype = compute};
    nn::GPT a(model_config("tiny"), o), b(model_config("tiny"), o);
    for (nn::GPT* m : {&a, &b})
      m->params().grads().copy_from(
          Tensor::uniform({m->num_parameters()}, 9, DType::f32, Device::cpu(), -1, 1));
    const Tensor initial = a.params().values().clone();
    const optim::AdamWConfig c{0.9, 0.95, 1e-8, 0.1};
    std::unique_ptr<optim::AdamW> one, per_parameter;
    {
      const TrialKernels trial("adamw_one_launch");
      one = std::make_unique<optim::AdamW>(optim::groups(a.parameters()), c);
    }
    {
      const TrialKernels reference("adamw_one_launch", TrialKernels::kOff);
      per_parameter = std::make_unique<optim::AdamW>(optim::groups(b.parameters()), c);
    }
    ASSERT_TRUE(one->one_pass()) << "the trial on, AdamW does not take its one pass";
    ASSERT_FALSE(per_parameter->one_pass());
    for (int t = 0; t < 2; ++t) {
      one->step(1e-2);
      per_parameter->step(1e-2);
    }
    EXPECT_GT(count_differing(a.params().values(), initial), 0);  // it stepped
    expect_same_bits(a.params().values(), b.params().values(), "master weights");
    expect_same_bits(one->m(), per_parameter->m(), "m");
    expect_same_bits(one->v(), per_parameter->v(), "v");
    for (std::size_t i = 0; i < a.parameters().size(); ++i)
      if (a.parameters()[i]->compute.defined())
        expect_same_bits(a.parameters()[i]->compute, b.parameters()[i]->compute,
                         a.parameters()[i]->name + " compute copy");
  }
}

// ops::adamw_update_segments on the GPU over 256 segments (one launch, its table full) and over
// 300 (more than a launch's table holds: the dispatcher's one update per segment), weight decay
// on and off in turn, some segments empty, against one adamw_update per segment on the GPU, with
// and without the bf16 copy, two steps: the same bits.
TEST_F(ReductionsAndOptimizers, AdamWSegmentsHaveThePerSegmentBits) {
  for (int k : {256, 300})
    for (bool with_copy : {false, true}) {
      const std::string what = std::to_string(k) + " segments" + (with_copy ? ", bf16 copy" : "");
      ops::DecaySegments segments;
      int64_t n = 0;
      for (int i = 0; i < k; ++i) {
        n += i % 7 == 3 ? 0 : 1 + i * 37 % 50;
        segments.ends.push_back(n);
        segments.decay.push_back(i % 2 == 0);
      }
      std::vector<Tensor> one = {rnd({n}, 60).to(gpu), rnd({n}, 61).to(gpu),
                                 rnd({n}, 62, 0, 1).to(gpu), rnd({n}, 63, 0, 1).to(gpu),
                                 Tensor::zeros({n}, DType::bf16, gpu)};
      std::vector<Tensor> per;
      for (const Tensor& t : one) per.push_back(t.clone());
      const Tensor initial = one[0].clone();
      for (int64_t step = 1; step <= 2; ++step) {
        const ops::AdamWArgs a{1e-2, 0.9, 0.95, 1e-8, 0.1, step};
        ops::adamw_update_segments(one[0], one[1], one[2], one[3], segments, a,
                                   with_copy ? &one[4] : nullptr);
        int64_t lo = 0;
        for (int i = 0; i < k; ++i) {
          const int64_t len = segments.ends[i] - lo;
          if (len > 0) {
            ops::AdamWArgs ai = a;
            if (!segments.decay[i]) ai.weight_decay = 0;
            Tensor p = per[0].flat(lo, len), m = per[2].flat(lo, len), v = per[3].flat(lo, len);
            Tensor copy = per[4].flat(lo, len);
            ops::adamw_update(p, per[1].flat(lo, len), m, v, ai, with_copy ? &copy : nullptr);
          }
          lo = segments.ends[i];
        }
      }
      EXPECT_GT(count_differing(one[0], initial), 0) << what;  // it stepped
      for (int i : {0, 2, 3, 4})
        expect_same_bits(one[i], per[i], what + ", argument " + std::to_string(i));
    }
}

TEST_F(CudaOps, GptStepMatchesTheHost) {
  const auto gpu_model =
      expect_gpt_step_matches_host(model_config("tiny"), {}, gpu, 41, kTol, kTol);
  // the allocator counts device memory separately from the host's
  EXPECT_GE(memory_stats(gpu).current, static_cast<std::size_t>(gpu_model->num_parameters()) * 8);
}
