// Where flash attention's wgmma kernels put a tile and how they describe it
// (common/ops/cuda/wgmma_layout.hpp), replayed on the host, without a GPU, against the PTX
// manual's canonical layouts for wgmma's shared-memory operands with the 128-byte swizzle,
// written out here independently (PTX ISA, "Shared Memory Matrix Layout" of
// wgmma.mma_async; CUTLASS's GmmaDescriptor comments say the same).
//
// The model: from a descriptor the hardware takes the start address (bits 0-13, x 16), the
// stride byte offset SBO (bits 32-45, x 16) and the swizzle mode (bits 62-63). For a 16-bit
// operand with the 128-byte swizzle, element (i, k) of a k-step (i along M or N, 0..63; k along
// the reduction, 0..15) lies before swizzling at
//   K-major:  start + (i % 8) * 128 + (i / 8) * SBO + 2 k                (k within one row)
//   MN-major: start + 2 i + (k % 8) * 128 + (k / 8) * SBO                (i within one row)
// (MN-major's SBO as the step between 8-row groups of k: CUTLASS's make_gmma_desc<Major::MN>
// reads it so; its LBO, the step to the next 64-element atom of i, is never needed at N = 64,
// so this model does not decode LBO and cannot catch the two swapped)
// and the swizzle then XORs address bits 4-6 with bits 7-9. The loader writes element (row, col)
// at swizzled_offset(row, col). Each k-step of each product must read exactly what the loader
// wrote for the element the product needs: K-major, row i, column 16 kk + k; MN-major, row
// 16 kk + k, column i.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "common/ops/cuda/wgmma_layout.hpp"

namespace {
namespace wg = scalelab::ops::wgmma;

struct Fields {
  uint32_t start, lbo, sbo, base_offset, swizzle;
};
Fields decode(uint64_t d) {
  return {static_cast<uint32_t>(d & 0x3FFF) << 4, static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4,
          static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4, static_cast<uint32_t>((d >> 49) & 7),
          static_cast<uint32_t>(d >> 62)};
}
uint32_t swizzle128(uint32_t addr) { return addr ^ (((addr >> 7) & 7) << 4); }

uint32_t k_major_addr(uint64_t desc, int i, int k) {
  const Fields f = decode(desc);
  return swizzle128(f.start + (i % 8) * 128 + (i / 8) * f.sbo + 2 * k);
}
uint32_t mn_major_addr(uint64_t desc, int i, int k) {
  const Fields f = decode(desc);
  return swizzle128(f.start + 2 * i + (k % 8) * 128 + (k / 8) * f.sbo);
}

// Tiles at a few 1024-byte aligned shared addresses, as the kernels place them (the first one
// aligned up from the dynamic base, the next 8 KiB apart).
const uint32_t kTiles[] = {0, 1024, 8192, 5 * 8192 + 1024};
}  // namespace

TEST(WgmmaLayout, TheDescriptorSaysWhatTheManualAsks) {
  for (uint32_t tile : kTiles) {
    const Fields f = decode(wg::descriptor(tile));
    EXPECT_EQ(f.start, tile);
    EXPECT_EQ(f.sbo, 1024u) << "8 rows of 128 bytes to the next 8-row group";
    EXPECT_EQ(f.base_offset, 0u) << "tiles are 1024-byte aligned";
    EXPECT_EQ(f.swizzle, 1u) << "1 = the 128-byte swizzle";
  }
}

// The swizzle keeps a row's 64 elements in its own 128 bytes, every element at its own address,
// and spreads the same 16-byte chunk of 8 consecutive rows over 8 bank groups.
TEST(WgmmaLayout, TheSwizzleIsAPermutationWithinEachRow) {
  std::set<int> seen;
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < 64; ++col) {
      const int off = wg::swizzled_offset(row, col);
      EXPECT_EQ(off / 128, row);
      EXPECT_TRUE(seen.insert(off).second) << row << " " << col;
    }
  for (int chunk = 0; chunk < 8; ++chunk) {
    std::set<int> groups;
    for (int row = 0; row < 8; ++row) groups.insert(wg::swizzled_offset(row, 8 * chunk) % 128 / 16);
    EXPECT_EQ(groups.size(), 8u) << "chunk " << chunk;
  }
}

// A, or B given as B^T (Q, K, V, dO with the head dimension as K): four k-steps along a row.
TEST(WgmmaLayout, KMajorStepsReadWhatTheLoaderWrote) {
  for (uint32_t tile : kTiles)
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t desc = wg::descriptor(tile) + wg::k_major_step(kk);
      for (int i = 0; i < 64; ++i)
        for (int k = 0; k < 16; ++k)
          ASSERT_EQ(k_major_addr(desc, i, k), tile + wg::swizzled_offset(i, 16 * kk + k))
              << "tile " << tile << " k-step " << kk << " row " << i << " k " << k;
    }
}

// B with K down the rows (V in O = P V, dO and Q in dV and dK, K in dQ): four k-steps of 16 rows.
TEST(WgmmaLayout, MnMajorStepsReadWhatTheLoaderWrote) {
  for (uint32_t tile : kTiles)
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t desc = wg::descriptor(tile) + wg::mn_major_step(kk);
      for (int i = 0; i < 64; ++i)
        for (int k = 0; k < 16; ++k)
          ASSERT_EQ(mn_major_addr(desc, i, k), tile + wg::swizzled_offset(16 * kk + k, i))
              << "tile " << tile << " k-step " << kk << " column " << i << " k " << k;
    }
}

// A step never carries into the descriptor's other fields (the address field is 14 bits).
TEST(WgmmaLayout, StepsStayInTheAddressField) {
  const uint32_t last = (1u << 18) - 8 * 1024;  // the last 8 KiB tile below 256 KiB
  const uint64_t d = wg::descriptor(last);
  for (int kk = 0; kk < 4; ++kk) {
    EXPECT_EQ(decode(d + wg::k_major_step(kk)).sbo, 1024u);
    EXPECT_EQ(decode(d + wg::mn_major_step(kk)).start, last + 2048u * kk);
  }
}
