// Flash attention's two CUDA kernels against the host's flash attention (issue 32; label gpu,
// skipped without a GPU): version 1 (scalar, flash_attention_cuda.cu) and version 2 (tensor
// cores, flash_attention_tc_cuda.cu), forward and every gradient, in both layouts: the
// (BH, T, hs) tensors of flash_attention_forward (lab 11's ring) and q, k, v read in place from
// the (B, T, 3C) QKV output (flash_attention_qkv_forward, what nn::CausalSelfAttention calls).
//
// Inputs are bf16 (uniform in [-2, 2)); the host computes in float from the same bf16 numbers
// and rounds its outputs to bf16 once. Error: max |cuda - host| / max(1, max |host|), per tensor.
// Tolerances:
//  - version 1: 1e-2 (the issue-14 tolerance: float sums in another order, one bf16 rounding
//    of each output, 2^-9 relative);
//  - version 2: 2e-2 for out, dq, dk, dv: the tensor cores round P and dS to bf16 (2^-9
//    relative each) before the products that sum them over up to T keys or queries, on top of
//    the output rounding; lse (float scores summed in float from bf16 products, as the host
//    does) 1e-3.
// Shapes: T 1 (below one tile), 33 and 70 (not multiples of the 64-row tiles or of the 16-row
// warp slices), 130 (three tiles, a partial last), 64 (exactly one); head sizes 64 and 128; 16
// heads; causal, and unmasked (lab 11's off-diagonal blocks). f32 data with version 2 selected
// runs version 1 (version 2 is bf16 only), checked too.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/device.hpp"
#include "common/ops/flash_attention.hpp"
#include "common/ops/fused_backend.hpp"
#include "common/ops/ops.hpp"
#include "tests/common/cuda_checks.hpp"
#include "tests/common/gradcheck.hpp"

using namespace scalelab;
using namespace scalelab::testing;

namespace {
const Device gpu = Device::cuda(0);

// Restores the version a test found (the default, or the environment's) when it ends.
class CudaFlash : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    version_ = ops::flash_attention_version();
  }
  void TearDown() override { ops::set_flash_attention_version(version_); }

 private:
  int version_ = 2;
};

struct Shape {
  int64_t B, NH, T, hs;
  bool causal;
  std::string str() const {
    return "B " + std::to_string(B) + " NH " + std::to_string(NH) + " T " + std::to_string(T) +
           " hs " + std::to_string(hs) + (causal ? " causal" : " unmasked");
  }
};
const Shape kShapes[] = {{1, 2, 1, 64, true},   {2, 3, 70, 64, true},   {1, 2, 130, 128, true},
                         {1, 16, 64, 64, true}, {1, 2, 33, 128, true},  {2, 3, 70, 64, false},
                         {1, 2, 130, 128, false}};

Tensor rnd(std::vector<int64_t> shape, uint64_t seed, DType dtype) {
  const Tensor t = uniform(std::move(shape), seed, DType::f64, -2, 2);
  return Tensor::from_vector(t.to_vector(), t.shape(), dtype);
}

double rel_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to(Device::cpu()).to_vector(), w = want.to_vector();
  double err = 0, big = 1;
  for (std::size_t i = 0; i < w.size(); ++i) {
    err = std::max(err, std::abs(g[i] - w[i]));
    big = std::max(big, std::abs(w[i]));
  }
  return err / big;
}

// Everything one call of forward + backward gives, on the device it ran on.
struct Result {
  Tensor out, lse, dq, dk, dv;
};

// The (BH, T, hs) entry point on `dev`, from host tensors.
Result packed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
              const Shape& s, Device dev) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hs));
  const Tensor qd = q.to(dev), kd = k.to(dev), vd = v.to(dev), dod = dout.to(dev);
  Result r;
  // outputs start at garbage (7): an element a kernel fails to write shows
  auto garbage = [&] {
    return Tensor::from_vector(std::vector<double>(q.numel(), 7.0), q.shape(), q.dtype()).to(dev);
  };
  r.out = garbage();
  r.lse = Tensor::empty({q.size(0), q.size(1)}, ops::flash_attention_lse_dtype(q.dtype()), dev);
  ops::flash_attention_forward(r.out, r.lse, qd, kd, vd, scale, s.causal);
  r.dq = garbage(), r.dk = garbage(), r.dv = garbage();
  ops::flash_attention_backward(r.dq, r.dk, r.dv, dod, qd, kd, vd, r.out, r.lse, scale, s.causal);
  return r;
}

void expect_close(const Result& got, const Result& want, double tol, double lse_tol,
                  const std::string& what) {
  EXPECT_LT(rel_error(got.out, want.out), tol) << what << " out";
  EXPECT_LT(rel_error(got.lse, want.lse), lse_tol) << what << " lse";
  EXPECT_LT(rel_error(got.dq, want.dq), tol) << what << " dq";
  EXPECT_LT(rel_error(got.dk, want.dk), tol) << what << " dk";
  EXPECT_LT(rel_error(got.dv, want.dv), tol) << what << " dv";
}

void check_packed(int version, DType dt, double tol, double lse_tol, int expect_ran) {
  ops::set_flash_attention_version(version);
  for (const Shape& s : kShapes) {
    const int64_t BH = s.B * s.NH;
    const Tensor q = rnd({BH, s.T, s.hs}, 1, dt), k = rnd({BH, s.T, s.hs}, 2, dt),
                 v = rnd({BH, s.T, s.hs}, 3, dt), dout = rnd({BH, s.T, s.hs}, 4, dt);
    const std::string what = "version " + std::to_string(version) + " " + dtype_name(dt) + " " +
                             s.str();
    const Result host = packed(q, k, v, dout, s, Device::cpu());
    const Result dev = packed(q, k, v, dout, s, gpu);
    EXPECT_EQ(ops::cuda::last_flash_attention_version(), expect_ran) << what;
    expect_close(dev, host, tol, lse_tol, what);
  }
}
}  // namespace

TEST_F(CudaFlash, Version1MatchesTheHost) { check_packed(1, DType::bf16, 1e-2, 1e-2, 1); }
TEST_F(CudaFlash, Version2MatchesTheHost) { check_packed(2, DType::bf16, 2e-2, 1e-3, 2); }
// version 2 takes bf16 only: f32 runs version 1, at the f32 tolerance
TEST_F(CudaFlash, Version2FallsBackForF32) { check_packed(2, DType::f32, 1e-4, 1e-4, 1); }

namespace {
// The in-place layout: q, k, v read from (B, T, 3C), y written as (B, T, C), dqkv set. Version 2
// reads it directly; version 1 runs split_heads + its kernel + merge_heads.
void check_qkv(std::initializer_list<int> versions) {
  for (int version : versions) {
    ops::set_flash_attention_version(version);
    for (const Shape& s : kShapes) {
      if (!s.causal) continue;  // nn's attention is causal
      const int64_t C = s.NH * s.hs;
      const double scale = 1.0 / std::sqrt(static_cast<double>(s.hs));
      const Tensor qkv = rnd({s.B, s.T, 3 * C}, 5, DType::bf16),
                   dy = rnd({s.B, s.T, C}, 6, DType::bf16);
      const std::string what = "qkv version " + std::to_string(version) + " " + s.str();
      Result r[2];  // host, device
      for (int i = 0; i < 2; ++i) {
        const Device dev = i == 0 ? Device::cpu() : gpu;
        const Tensor x = qkv.to(dev), g = dy.to(dev);
        r[i].out = Tensor::from_vector(std::vector<double>(s.B * s.T * C, 7.0), {s.B, s.T, C},
                                       DType::bf16).to(dev);
        r[i].lse = Tensor::empty({s.B * s.NH, s.T}, DType::f32, dev);
        ops::flash_attention_qkv_forward(r[i].out, r[i].lse, x, s.NH, scale);
        r[i].dq = Tensor::from_vector(std::vector<double>(qkv.numel(), 7.0), qkv.shape(),
                                      DType::bf16).to(dev);
        ops::flash_attention_qkv_backward(r[i].dq, g, x, r[i].out, r[i].lse, s.NH, scale);
      }
      EXPECT_EQ(ops::cuda::last_flash_attention_version(), version) << what;
      const double tol = version == 1 ? 1e-2 : 2e-2, lse_tol = version == 1 ? 1e-2 : 1e-3;
      EXPECT_LT(rel_error(r[1].out, r[0].out), tol) << what << " y";
      EXPECT_LT(rel_error(r[1].lse, r[0].lse), lse_tol) << what << " lse";
      EXPECT_LT(rel_error(r[1].dq, r[0].dq), tol) << what << " dqkv";
    }
  }
}
}  // namespace

TEST_F(CudaFlash, QkvLayoutMatchesTheHost) { check_qkv({1, 2}); }

namespace {
Result packed_on_gpu(const Shape& s, uint64_t seed) {
  const int64_t BH = s.B * s.NH;
  const Tensor q = rnd({BH, s.T, s.hs}, seed, DType::bf16),
               k = rnd({BH, s.T, s.hs}, seed + 1, DType::bf16),
               v = rnd({BH, s.T, s.hs}, seed + 2, DType::bf16),
               dout = rnd({BH, s.T, s.hs}, seed + 3, DType::bf16);
  return packed(q, k, v, dout, s, gpu);
}

// Two runs of version 2 on `s` give the same bits.
void expect_same_bits_twice(const Shape& s) {
  ops::set_flash_attention_version(2);
  const Result a = packed_on_gpu(s, 7), b = packed_on_gpu(s, 7);
  EXPECT_EQ(ops::cuda::last_flash_attention_version(), 2) << s.str();
  for (auto [x, y] : {std::pair{&a.out, &b.out}, std::pair{&a.lse, &b.lse},
                      std::pair{&a.dq, &b.dq}, std::pair{&a.dk, &b.dk},
                      std::pair{&a.dv, &b.dv}})
    EXPECT_EQ(x->to(Device::cpu()).to_vector(), y->to(Device::cpu()).to_vector()) << s.str();
}

// Longer than kShapes: several 128-row blocks of the two-row-tile forward (T 300, 1030) and
// many key blocks taking turns on each query tile of the one-kernel backward (17 a head at T
// 1030, head size 64), causal and unmasked.
const Shape kLongShapes[] = {{1, 2, 300, 64, true},   {1, 2, 300, 64, false},
                             {1, 2, 1030, 64, true},  {1, 2, 1030, 64, false},
                             {1, 2, 300, 128, false}, {2, 3, 300, 128, true}};

// q, k, v and dout of a long shape (seeds 11 to 14), as the trial kernels' checks take them.
std::array<Tensor, 4> long_inputs(const Shape& s) {
  const int64_t BH = s.B * s.NH;
  return {rnd({BH, s.T, s.hs}, 11, DType::bf16), rnd({BH, s.T, s.hs}, 12, DType::bf16),
          rnd({BH, s.T, s.hs}, 13, DType::bf16), rnd({BH, s.T, s.hs}, 14, DType::bf16)};
}

// The trial kernel `trial` on the long shapes: against the host at version 2's tolerances, then
// against version 2's default kernels on the GPU (checked on an H100) within two bf16 steps of
// the largest element (2^-7). Both round P and dS to bf16 alike and differ only in the order of
// float sums, so an output moves by one bf16 step at most; the host's 2e-2 (its sums are not
// rounded to bf16) could hide a part of one key block's share of dQ lost, this cannot. Then the
// trial's own bits twice. wgmma: the trial runs on Hopper's warpgroup MMA (head size 64);
// kept_ds: its dQ kernel reads back the dS^T its dK/dV kernel kept (head size 64).
void check_trial_kernel(const char* trial, int rows_per_warp, int backward_kernels,
                        bool wgmma = false, bool kept_ds = false) {
  ops::set_flash_attention_version(2);
  const double two_steps = 1.0 / 128;
  for (const Shape& s : kLongShapes) {
    const auto [q, k, v, dout] = long_inputs(s);
    const std::string what = std::string(trial) + " " + s.str();
    // every other trial kernel off, whatever SCALELAB_TRY_GPU_KERNELS says: one on trial here
    const TrialKernels none("all", TrialKernels::kOff);
    const Result v2 = packed(q, k, v, dout, s, gpu);  // the default kernels
    EXPECT_EQ(ops::cuda::last_flash_v2_kernels().forward_rows_per_warp, 16) << what;
    EXPECT_EQ(ops::cuda::last_flash_v2_kernels().backward_kernels, 2) << what;
    EXPECT_FALSE(ops::cuda::last_flash_v2_kernels().dq_from_kept_ds) << what;
    Result got;
    {
      const TrialKernels on(trial);
      got = packed(q, k, v, dout, s, gpu);
      const ops::cuda::FlashV2Kernels ran = ops::cuda::last_flash_v2_kernels();
      // the two-row-tile forward takes head size 64 only; 128 keeps 16 rows a warp
      EXPECT_EQ(ran.forward_rows_per_warp, s.hs == 64 ? rows_per_warp : 16) << what;
      EXPECT_EQ(ran.backward_kernels, backward_kernels) << what;
      EXPECT_EQ(ran.forward_wgmma, wgmma && s.hs == 64) << what;
      EXPECT_EQ(ran.backward_wgmma, wgmma && s.hs == 64) << what;
      EXPECT_EQ(ran.dq_from_kept_ds, kept_ds && s.hs == 64) << what;
      expect_close(got, packed(q, k, v, dout, s, Device::cpu()), 2e-2, 1e-3, what + " vs host");
      expect_same_bits_twice(s);
    }
    expect_close(got, v2, two_steps, 1e-5, what + " vs version 2's default kernels");
  }
}
}  // namespace

// No atomics, no order that changes from run to run: two runs give the same bits.
TEST_F(CudaFlash, Version2IsDeterministic) { expect_same_bits_twice({2, 3, 130, 64, true}); }

// The forward with 32 query rows a warp (trial kernel "flash_forward_two_row_tiles", head size 64;
// 128 keeps 16 rows): every shape and both layouts at version 2's tolerances, the long shapes
// against the host and version 2, its own bits twice.
TEST_F(CudaFlash, TwoRowTileForwardMatchesTheHost) {
  {
    const TrialKernels trial("flash_forward_two_row_tiles");
    check_packed(2, DType::bf16, 2e-2, 1e-3, 2);
    check_qkv({2});
  }
  check_trial_kernel("flash_forward_two_row_tiles", 32, 2);
}

// The dK/dV kernel held to 3 blocks an SM (trial kernel "flash_dkdv_three_blocks", head size 64):
// the same instructions as the default's, only registers allocated under a bound, so the same
// bits as the default kernels on every long shape (head size 128 runs the default: checked too).
TEST_F(CudaFlash, DkdvKernelAtThreeBlocksHasTheDefaultsBits) {
  ops::set_flash_attention_version(2);
  for (const Shape& s : kLongShapes) {
    const auto [q, k, v, dout] = long_inputs(s);
    const std::string what = "flash_dkdv_three_blocks " + s.str();
    const TrialKernels none("all", TrialKernels::kOff);
    const Result want = packed(q, k, v, dout, s, gpu);
    EXPECT_EQ(ops::cuda::last_flash_v2_kernels().dkdv_min_blocks, 1) << what;
    const TrialKernels on("flash_dkdv_three_blocks");
    const Result got = packed(q, k, v, dout, s, gpu);
    EXPECT_EQ(ops::cuda::last_flash_v2_kernels().dkdv_min_blocks, s.hs == 64 ? 3 : 1) << what;
    expect_same_bits(got.dk, want.dk, what + " dk");
    expect_same_bits(got.dv, want.dv, what + " dv");
    expect_same_bits(got.dq, want.dq, what + " dq");
  }
}

// The one-kernel backward (trial kernel "flash_backward_one_kernel",
// flash_attention_tc_backward_cuda.cu): every shape and both layouts at version 2's tolerances,
// then the long shapes against the host and version 2's two kernels, and twice for the same
// bits: its dQ shares are added in a fixed order, not by atomics. Last in this file: a turn that
// never comes ends in a trap (its watchdog), which takes the process's CUDA context with it.
// (Only the tests of kernels written without a GPU come after it, kept dS then wgmma: the newest
// kernels' faults would take the context too.)
TEST_F(CudaFlash, OneKernelBackwardMatchesTheHostAndItsOwnBits) {
  {
    const TrialKernels trial("flash_backward_one_kernel");
    check_packed(2, DType::bf16, 2e-2, 1e-3, 2);
    check_qkv({2});
  }
  check_trial_kernel("flash_backward_one_kernel", 16, 1);
}

// dQ from the dS^T the dK/dV kernel kept (trial kernel "flash_dq_from_kept_ds", kept_ds.hpp;
// head size 64, 128 runs version 2's dQ kernel: checked too): every shape and both layouts at
// version 2's tolerances (T 1, 33, 70, 130: partial tiles whose keys and queries past T must come
// out of the kept tiles as zeros; causal and unmasked, whose tiles lie differently), and which
// kernels ran. Its own test (and compute-sanitizer's memcheck in issue33.sh): written without a
// GPU, it stores to a buffer of its own.
TEST_F(CudaFlash, KeptDsBackwardMatchesTheHost) {
  const TrialKernels trial("flash_dq_from_kept_ds");
  check_packed(2, DType::bf16, 2e-2, 1e-3, 2);
  check_qkv({2});
  for (int64_t hs : {64, 128}) {
    const Shape s{1, 2, 70, hs, true};
    packed_on_gpu(s, 3);
    EXPECT_EQ(ops::cuda::last_flash_v2_kernels().dq_from_kept_ds, hs == 64) << s.str();
    EXPECT_EQ(ops::cuda::last_flash_v2_kernels().backward_kernels, 2) << s.str();
  }
}

// The same on the long shapes (17 query tiles a head at T 1030: the kept tiles of row i are
// i + 1 causal, 17 unmasked): against the host and within two bf16 steps of version 2's dQ
// kernel, which computes the same dS again (the same roundings), and the same bits twice.
TEST_F(CudaFlash, KeptDsBackwardOnLongShapes) {
  check_trial_kernel("flash_dq_from_kept_ds", 16, 2, /*wgmma=*/false, /*kept_ds=*/true);
}

// Flash attention on Hopper's warpgroup MMA (trial kernels "flash_forward_wgmma" and
// "flash_backward_wgmma", flash_attention_wgmma_cuda.cu; head size 64 on compute capability 9.0,
// version 2 elsewhere): every shape and both layouts at version 2's tolerances (head size 128
// runs version 2's kernels: checked too), then the long shapes against the host and version 2's
// mma.sync kernels within two bf16 steps (the same bf16 roundings of P and dS, float sums in
// another order), and twice for the same bits.
TEST_F(CudaFlash, WgmmaKernelsMatchTheHostAndVersion2) {
  if (cuda_compute_capability(0) != 90)
    GTEST_SKIP() << "wgmma runs on compute capability 9.0 only";
  const char* both = "flash_forward_wgmma,flash_backward_wgmma";
  {
    const TrialKernels trial(both);
    check_packed(2, DType::bf16, 2e-2, 1e-3, 2);
    // the last shape has head size 128: version 2's kernels ran (head size 64: below)
    EXPECT_FALSE(ops::cuda::last_flash_v2_kernels().forward_wgmma);
    check_qkv({2});
  }
  check_trial_kernel(both, 16, 2, /*wgmma=*/true);
}

// wgmma's dK/dV kernel keeping dS^T for version 2's kept-dS dQ kernel (the trial kernels
// "flash_backward_wgmma" and "flash_dq_from_kept_ds" together): the long shapes against the host
// and version 2, and the same bits twice.
TEST_F(CudaFlash, WgmmaKeptDsBackwardMatchesTheHost) {
  if (cuda_compute_capability(0) != 90)
    GTEST_SKIP() << "wgmma runs on compute capability 9.0 only";
  check_trial_kernel("flash_forward_wgmma,flash_backward_wgmma,flash_dq_from_kept_ds", 16, 2,
                     /*wgmma=*/true, /*kept_ds=*/true);
}
