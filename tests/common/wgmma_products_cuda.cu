// The wgmma products of tests/common/wgmma_products.hpp: one block of one warpgroup (128 threads)
// loads its tiles exactly as flash_attention_wgmma_cuda.cu does (flash_wgmma::load_tile: the
// 128-byte swizzle, cp.async, then the proxy fence and the barrier) and issues one product
// through the same wrappers. Compiled for sm_90a only (tests/common/tensor.cmake).
#include <cmath>

#include "common/ops/cuda/flash_wgmma.cuh"
#include "common/ops/cuda/kernels.cuh"
#include "common/ops/cuda/mma_fragments.hpp"
#include "tests/common/wgmma_products.hpp"

namespace scalelab::testing {

namespace {
namespace wg = ops::cuda::flash_wgmma;
namespace tc = ops::cuda::flash_tc;

constexpr int kTileBytes = wg::kN * ops::wgmma::kRowBytes;
constexpr size_t kSmem = 2 * kTileBytes + ops::wgmma::kAtomBytes;

// The element (row, col) of a 64 x 64 accumulator this thread holds as d[n][r]: warp w has rows
// 16 w .. 16 w + 15, laid out as mma.sync's C fragments (mma_fragments.hpp).
__device__ int acc_index(int n, int r) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  return (16 * warp + ops::mma::c_row(lane, r)) * wg::kN + 8 * n + ops::mma::c_col(lane, r);
}

__device__ void store(float* out, const wg::Acc& d) {
  for (int n = 0; n < wg::kN / 8; ++n)
    for (int r = 0; r < 4; ++r) out[acc_index(n, r)] = d[n][r];
}

__device__ void load(wg::Acc& d, const float* in) {
  for (int n = 0; n < wg::kN / 8; ++n)
    for (int r = 0; r < 4; ++r) d[n][r] = in[acc_index(n, r)];
}

// Both tiles into shared memory, landed and visible to the tensor cores.
__device__ void load_tiles(unsigned char* first, const bf16* a, unsigned char* second,
                           const bf16* b) {
  wg::load_tile(first, tc::Rows{a, wg::kN}, 0, wg::kN);
  if (second) wg::load_tile(second, tc::Rows{b, wg::kN}, 0, wg::kN);
  tc::cp_async_commit();
  wg::tiles_landed<0>();  // the kernels' own wait, proxy fence and barrier
}

__global__ void __launch_bounds__(tc::kBlock) ss_kernel(float* out, const bf16* a, const bf16* b) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* As = wg::aligned_smem(smem_raw);
  unsigned char* Bs = As + kTileBytes;
  load_tiles(As, a, Bs, b);
  wg::Acc d;
  for (int n = 0; n < wg::kN / 8; ++n)
    for (int r = 0; r < 4; ++r) d[n][r] = NAN;  // the first k-step overwrites (scale-d 0)
  wg::pin(d);
  wg::fence();
  wg::issue_ss(d, tc::smem_u32(As), tc::smem_u32(Bs));
  wg::finish(d);
  store(out, d);
}

__global__ void __launch_bounds__(tc::kBlock)
    rs_kernel(float* out, const float* init, const float* p, const bf16* v) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* Vs = wg::aligned_smem(smem_raw);
  load_tiles(Vs, v, nullptr, nullptr);
  wg::Acc pa, d;
  load(pa, p);
  load(d, init);
  uint32_t pf[wg::kN / 16][4];
  tc::acc_to_a<wg::kN / 16>(pf, pa);
  wg::pin(d);
  wg::pin(pf);
  wg::fence();
  wg::issue_rs(d, pf, tc::smem_u32(Vs));
  wg::finish(d);
  store(out, d);
}

void check_tile(const Tensor& t, DType dtype, const char* what) {
  SCALELAB_CHECK(t.device().is_cuda() && t.dtype() == dtype && t.numel() == wg::kN * wg::kN &&
                     t.is_contiguous(),
                 "wgmma products: {} must be a contiguous 64 x 64 {} CUDA tensor", what,
                 dtype_name(dtype));
}

template <class Kernel, class... Args>
void launch(Kernel kernel, const Tensor& on, Args... args) {
  ops::cuda::use_device(on);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kSmem)));
  kernel<<<1, tc::kBlock, kSmem>>>(args...);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaDeviceSynchronize());
}
}  // namespace

void wgmma_ss_product(Tensor& out, const Tensor& a, const Tensor& b) {
  check_tile(out, DType::f32, "out");
  check_tile(a, DType::bf16, "a");
  check_tile(b, DType::bf16, "b");
  launch(ss_kernel, out, out.data<float>(), a.data<bf16>(), b.data<bf16>());
}

void wgmma_rs_product(Tensor& out, const Tensor& init, const Tensor& p, const Tensor& v) {
  check_tile(out, DType::f32, "out");
  check_tile(init, DType::f32, "init");
  check_tile(p, DType::f32, "p");
  check_tile(v, DType::bf16, "v");
  launch(rs_kernel, out, out.data<float>(), init.data<float>(), p.data<float>(),
         v.data<bf16>());
}

}  // namespace scalelab::testing
