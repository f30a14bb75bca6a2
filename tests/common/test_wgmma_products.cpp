// One product of each kind flash attention's wgmma kernels issue, alone on the GPU, against the
// host (tests/common/wgmma_products.hpp). Where WgmmaKernelsMatchTheHostAndVersion2
// (test_ops_cuda_flash.cpp) fails, these say which piece is wrong before the flash logic is
// suspected: the K-major descriptors and the first k-step's overwrite (S = Q K^T), or the A
// fragments from registers and the MN-major descriptor (O += P V; dV, dK and dQ are the same
// product on other tiles). Built only with CUDA; skipped unless compute capability 9.0.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/device.hpp"
#include "tests/common/wgmma_products.hpp"

using namespace scalelab;

namespace {
constexpr int kN = 64;

// Values that bf16 holds exactly (k / 64, |k| <= 128): the products and their float sums of 64
// are then exact enough that only a misplaced element can miss the tolerance.
std::vector<double> exact_values(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> k(-128, 128);
  std::vector<double> v(kN * kN);
  for (double& x : v) x = k(rng) / 64.0;
  return v;
}

Tensor on_gpu(const std::vector<double>& v, DType dtype) {
  return Tensor::from_vector(v, {kN, kN}, dtype).to(Device::cuda(0));
}

// "" if got (64 x 64, on the GPU) equals want everywhere within tol; else the first few wrong
// elements, and whether each is the wanted value of another element (a misplaced one).
std::string mismatches(const Tensor& got_gpu, const std::vector<double>& want, double tol) {
  const Tensor got = got_gpu.to(Device::cpu());
  std::ostringstream os;
  int bad = 0;
  for (int i = 0; i < kN * kN; ++i) {
    const double g = got.item(i);
    if (std::abs(g - want[i]) <= tol) continue;
    if (++bad > 6) continue;
    os << "(" << i / kN << ", " << i % kN << "): " << g << " want " << want[i];
    for (int j = 0; j < kN * kN; ++j)
      if (j != i && std::abs(g - want[j]) <= tol && std::abs(want[j]) > 1.0) {
        os << " (the value of (" << j / kN << ", " << j % kN << "))";
        break;
      }
    os << "; ";
  }
  if (bad) os << bad << " of " << kN * kN << " elements wrong";
  return os.str();
}

class WgmmaProducts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    if (cuda_compute_capability(0) != 90) GTEST_SKIP() << "wgmma runs on compute capability 9.0";
  }
};
}  // namespace

TEST_F(WgmmaProducts, SharedMemoryTilesBothKMajor) {
  const std::vector<double> a = exact_values(1), b = exact_values(2);
  std::vector<double> want(kN * kN, 0.0);
  for (int i = 0; i < kN; ++i)
    for (int j = 0; j < kN; ++j)
      for (int k = 0; k < kN; ++k) want[i * kN + j] += a[i * kN + k] * b[j * kN + k];
  Tensor out = Tensor::empty({kN, kN}, DType::f32, Device::cuda(0));
  scalelab::testing::wgmma_ss_product(out, on_gpu(a, DType::bf16), on_gpu(b, DType::bf16));
  EXPECT_EQ(mismatches(out, want, 1e-4), "") << "S = Q K^T (issue_ss: K-major descriptors)";
}

TEST_F(WgmmaProducts, RegisterFragmentsTimesAnMnMajorTile) {
  const std::vector<double> init = exact_values(3), p = exact_values(4), v = exact_values(5);
  std::vector<double> want = init;
  for (int i = 0; i < kN; ++i)
    for (int j = 0; j < kN; ++j)
      for (int k = 0; k < kN; ++k) want[i * kN + j] += p[i * kN + k] * v[k * kN + j];
  Tensor out = Tensor::empty({kN, kN}, DType::f32, Device::cuda(0));
  scalelab::testing::wgmma_rs_product(out, on_gpu(init, DType::f32), on_gpu(p, DType::f32),
                            on_gpu(v, DType::bf16));
  EXPECT_EQ(mismatches(out, want, 1e-4), "")
      << "O += P V (issue_rs: A fragments from registers, V MN-major)";
}
