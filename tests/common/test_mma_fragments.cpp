// The index math of flash attention's version 2 (common/ops/cuda/mma_fragments.hpp) replayed on
// the host, without a GPU, against the PTX manual's definitions of mma.m16n8k16 (which lane
// holds which element of A, B and C) and of ldmatrix.x4 (which lane's address feeds which tile
// row, and who receives what, with and without .trans), written out here independently.
//
// A warp is emulated as 32 lanes' registers side by side. ldmatrix and mma are collective (a
// lane's result depends on other lanes' addresses and registers), so each emulated instruction
// takes the whole warp's inputs. The products run the same loops as the kernel's load_a,
// mma_tile and acc_to_a, with the header's addresses; inputs are small integers, so
// every product and sum is exact in bf16 and float and the check is equality.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "common/ops/cuda/kept_ds.hpp"
#include "common/ops/cuda/mma_fragments.hpp"

namespace {
namespace mma = scalelab::ops::mma;
constexpr int kLanes = 32;

// ---- the PTX manual's fragment layouts (g = lane / 4, c = lane % 4) ----------------------------
struct RC {
  int row, col;
};
// A (16x16), register r (0..3), half e (0 low, 1 high)
RC spec_a(int lane, int r, int e) {
  return {lane / 4 + 8 * (r % 2), 2 * (lane % 4) + 8 * (r / 2) + e};
}
// B (16x8, k x n), register r (0..1), half e
RC spec_b(int lane, int r, int e) { return {2 * (lane % 4) + 8 * r + e, lane / 4}; }
// C (16x8), register r (0..3)
RC spec_c(int lane, int r) { return {lane / 4 + 8 * (r / 2), 2 * (lane % 4) + r % 2}; }

// A register of 2 bf16 as its two values; a warp's register: one per lane.
using Pair = std::array<float, 2>;
using WarpReg = std::array<Pair, kLanes>;
using WarpAcc = std::array<std::array<float, 4>, kLanes>;  // one C tile's 4 registers per lane

// ldmatrix.x4 (.trans): lane 8i + j gives the address of row j of tile i; lane t receives in
// register i row t/4, columns 2(t%4), 2(t%4)+1 of tile i (.trans: rows 2(t%4), 2(t%4)+1 of
// column t/4).
std::array<WarpReg, 4> ldmatrix_x4(const std::vector<float>& smem,
                                   const std::array<int, kLanes>& addr, bool trans) {
  std::array<WarpReg, 4> out{};
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < kLanes; ++t)
      for (int e = 0; e < 2; ++e)
        out[i][t][e] = trans ? smem.at(addr[8 * i + 2 * (t % 4) + e] + t / 4)
                             : smem.at(addr[8 * i + t / 4] + 2 * (t % 4) + e);
  return out;
}

// mma.m16n8k16: c += a b, each operand rebuilt from the lanes' fragments.
void mma_16816(WarpAcc& c, const std::array<WarpReg, 4>& a, const WarpReg& b0, const WarpReg& b1) {
  float A[16][16], B[16][8];
  for (int t = 0; t < kLanes; ++t)
    for (int e = 0; e < 2; ++e) {
      for (int r = 0; r < 4; ++r) A[spec_a(t, r, e).row][spec_a(t, r, e).col] = a[r][t][e];
      B[spec_b(t, 0, e).row][spec_b(t, 0, e).col] = b0[t][e];
      B[spec_b(t, 1, e).row][spec_b(t, 1, e).col] = b1[t][e];
    }
  for (int t = 0; t < kLanes; ++t)
    for (int r = 0; r < 4; ++r) {
      const RC rc = spec_c(t, r);
      for (int k = 0; k < 16; ++k) c[t][r] += A[rc.row][k] * B[k][rc.col];
    }
}

// ---- the kernel's loops, with the emulated instructions ----------------------------------------
using AFrag = std::array<WarpReg, 4>;  // one k-chunk's a0..a3

// load_a: A fragments of a 16 x 16KC tile at `base` (row-major, ld).
std::vector<AFrag> load_a(const std::vector<float>& smem, int base, int KC, int ld) {
  std::vector<AFrag> a(KC);
  for (int kc = 0; kc < KC; ++kc) {
    std::array<int, kLanes> addr{};
    for (int t = 0; t < kLanes; ++t) addr[t] = base + mma::ldsm_a_offset(t, kc, ld);
    a[kc] = ldmatrix_x4(smem, addr, false);
  }
  return a;
}

// The A fragments of row tile mt (16 rows) and KC k-chunks from a tile that stores A transposed
// ([k][m], ld): ldmatrix.trans at ldsm_at_offset (dS read from the dS^T the warps stored).
std::vector<AFrag> load_a_transposed(const std::vector<float>& smem, int mt, int KC, int ld) {
  std::vector<AFrag> a(KC);
  for (int kc = 0; kc < KC; ++kc) {
    std::array<int, kLanes> addr{};
    for (int t = 0; t < kLanes; ++t) addr[t] = mma::ldsm_at_offset(t, mt, kc, ld);
    a[kc] = ldmatrix_x4(smem, addr, /*trans=*/true);
  }
  return a;
}

// mma_tile: acc (16 x 8N) += A * B, B at `base` stored [n][k] (nk: the kernel's BIs::NK, plain
// ldmatrix) or [k][n] (BIs::KN, ldmatrix.trans).
void mma_tile(std::vector<WarpAcc>& acc, const std::vector<AFrag>& a,
              const std::vector<float>& smem, int base, int ld, bool nk) {
  for (int kc = 0; kc < static_cast<int>(a.size()); ++kc)
    for (int np = 0; np < static_cast<int>(acc.size()) / 2; ++np) {
      std::array<int, kLanes> addr{};
      for (int t = 0; t < kLanes; ++t)
        addr[t] = base + (nk ? mma::ldsm_bt_offset(t, np, kc, ld)
                             : mma::ldsm_b_offset(t, np, kc, ld));
      const auto r = ldmatrix_x4(smem, addr, !nk);
      mma_16816(acc[2 * np], a[kc], r[0], r[1]);
      mma_16816(acc[2 * np + 1], a[kc], r[2], r[3]);
    }
}

// acc_to_a: accumulator tiles (16 x 16KC) as the next product's A fragments.
std::vector<AFrag> acc_to_a(const std::vector<WarpAcc>& acc) {
  std::vector<AFrag> a(acc.size() / 2);
  for (int kc = 0; kc < static_cast<int>(a.size()); ++kc)
    for (int r = 0; r < 4; ++r)
      for (int t = 0; t < kLanes; ++t)
        for (int e = 0; e < 2; ++e)
          a[kc][r][t][e] = acc[mma::a_from_c_tile(kc, r)][t][mma::a_from_c_reg(r, e)];
  return a;
}

// A row-major matrix of small integers in -2..2 (exact in bf16), `rows` x `cols` with row
// stride ld; the padding columns hold 1000, which would show if a lane read them.
std::vector<float> matrix(int rows, int cols, int ld, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-2, 2);
  std::vector<float> m(rows * ld, 1000.f);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) m[i * ld + j] = static_cast<float>(d(gen));
  return m;
}
}  // namespace

TEST(MmaFragments, AccumulatorLayoutIsThePtxManuals) {
  for (int t = 0; t < kLanes; ++t)
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(mma::c_row(t, r), spec_c(t, r).row) << "lane " << t << " reg " << r;
      EXPECT_EQ(mma::c_col(t, r), spec_c(t, r).col) << "lane " << t << " reg " << r;
    }
}

// P in S's registers is P's A fragment: the C element a lane holds is the A element it must hold.
TEST(MmaFragments, AccumulatorPairIsAnAOperand) {
  for (int kc = 0; kc < 4; ++kc)
    for (int t = 0; t < kLanes; ++t)
      for (int r = 0; r < 4; ++r)
        for (int e = 0; e < 2; ++e) {
          const int tile = mma::a_from_c_tile(kc, r);
          const RC c = spec_c(t, mma::a_from_c_reg(r, e)), a = spec_a(t, r, e);
          EXPECT_EQ(c.row, a.row);
          EXPECT_EQ(8 * tile + c.col, 16 * kc + a.col) << "kc " << kc << " lane " << t;
        }
}

// Forward's two products for one warp: S = Q K^T (16 queries x 64 keys, head size 64) from
// padded tiles, then O = P V with P = S taken from the registers, against plain loops. Also
// the backward's shapes: the same routines with 32-key tiles and head size 128.
TEST(MmaFragments, WarpProductsMatchPlainLoops) {
  for (auto [HS, Bc] : {std::pair{64, 64}, std::pair{128, 32}, std::pair{64, 32}}) {
    const int L = HS + 8;  // the kernel's padded row
    // one "shared memory": Q (16 rows) at 0, K (Bc rows) after it, V (Bc rows) after K
    const std::vector<float> q = matrix(16, HS, L, 1), k = matrix(Bc, HS, L, 2),
                             v = matrix(Bc, HS, L, 3);
    std::vector<float> smem = q;
    smem.insert(smem.end(), k.begin(), k.end());
    smem.insert(smem.end(), v.begin(), v.end());
    const int k_at = 16 * L, v_at = k_at + Bc * L;

    std::vector<WarpAcc> s(Bc / 8, WarpAcc{});
    mma_tile(s, load_a(smem, 0, HS / 16, L), smem, k_at, L, /*nk=*/true);
    std::vector<WarpAcc> o(HS / 8, WarpAcc{});
    mma_tile(o, acc_to_a(s), smem, v_at, L, /*nk=*/false);

    // the plain products
    std::vector<float> S(16 * Bc, 0.f), O(16 * HS, 0.f);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < Bc; ++j)
        for (int d = 0; d < HS; ++d) S[i * Bc + j] += q[i * L + d] * k[j * L + d];
    for (int i = 0; i < 16; ++i)
      for (int d = 0; d < HS; ++d)
        for (int j = 0; j < Bc; ++j) O[i * HS + d] += S[i * Bc + j] * v[j * L + d];
    // (the emulation keeps P in float: what is checked is who holds what, not bf16 rounding;
    // every value here is an integer far below 2^24, so float sums are exact)
    for (int t = 0; t < kLanes; ++t)
      for (int r = 0; r < 4; ++r) {
        const RC rc = spec_c(t, r);
        for (int n = 0; n < Bc / 8; ++n)
          ASSERT_EQ(s[n][t][r], S[rc.row * Bc + 8 * n + rc.col])
              << "S hs " << HS << " lane " << t << " reg " << r << " tile " << n;
        for (int n = 0; n < HS / 8; ++n)
          ASSERT_EQ(o[n][t][r], O[rc.row * HS + 8 * n + rc.col])
              << "O hs " << HS << " lane " << t << " reg " << r << " tile " << n;
      }
  }
}

// The one-kernel backward's dQ share (flash_attention_tc_backward_cuda.cu): four warps each
// hold 16 keys' rows of dS^T (Bq queries) as accumulators and store them as bf16 pairs in a
// [key][query] tile (c_row, c_col); then each warp reads its 16 query rows of dS from that tile
// with ldmatrix.trans (ldsm_at_offset) and multiplies by its column group of K (Bk keys x hs,
// ldmatrix.trans as V in forward). Every element of dS K must come out where the kernel adds it.
TEST(MmaFragments, OneKernelBackwardDqShareMatchesPlainLoops) {
  for (auto [HS, Bq] : {std::pair{64, 64}, std::pair{128, 32}}) {
    constexpr int Bk = 64, kWarps = 4;
    const int L = HS + 8, LS = Bq + 8;
    const int RG = Bq / 16, CG = kWarps / RG, NC = HS / CG;  // the kernel's split of dQ_i
    const std::vector<float> dst = matrix(Bk, Bq, Bq, 4);    // dS^T, keys x queries
    const std::vector<float> k = matrix(Bk, HS, L, 5);
    // the warps' accumulators, stored as the kernel stores them (padding stays 1000)
    std::vector<float> ds_smem(Bk * LS, 1000.f);
    for (int w = 0; w < kWarps; ++w)
      for (int n = 0; n < Bq / 8; ++n)
        for (int t = 0; t < kLanes; ++t)
          for (int h = 0; h < 2; ++h)
            for (int e = 0; e < 2; ++e) {
              const RC rc = spec_c(t, 2 * h + e);  // the element register 2h + e holds
              const float held = dst[(16 * w + rc.row) * Bq + 8 * n + rc.col];
              ds_smem.at((16 * w + mma::c_row(t, 2 * h)) * LS + 8 * n + mma::c_col(t, 0) + e) =
                  held;
            }
    for (int w = 0; w < kWarps; ++w) {
      const int rg = w % RG, cg = w / RG;
      const std::vector<AFrag> a = load_a_transposed(ds_smem, rg, Bk / 16, LS);
      std::vector<WarpAcc> share(NC / 8, WarpAcc{});
      mma_tile(share, a, k, cg * NC, L, /*nk=*/false);
      for (int t = 0; t < kLanes; ++t)
        for (int r = 0; r < 4; ++r)
          for (int n = 0; n < NC / 8; ++n) {
            const int i = 16 * rg + spec_c(t, r).row, d = cg * NC + 8 * n + spec_c(t, r).col;
            float want = 0;
            for (int j = 0; j < Bk; ++j) want += dst[j * Bq + i] * k[j * L + d];
            ASSERT_EQ(share[n][t][r], want)
                << "hs " << HS << " warp " << w << " lane " << t << " reg " << r << " tile " << n;
          }
    }
  }
}

// The dS^T tiles kept for the dQ kernel (kept_ds.hpp, the trial kernel "flash_dq_from_kept_ds"):
// every (query tile, key tile) pair with scores has a place of its own among its head's tiles,
// and query tile i's key tiles lie one after another, as the dQ kernel reads them.
TEST(MmaFragments, KeptDsTilesEachHaveTheirOwnPlace) {
  namespace kept = scalelab::ops::kept_ds;
  for (bool causal : {true, false})
    for (int n : {1, 2, 5, 17}) {
      std::vector<int> seen(kept::tiles_per_head(n, causal), 0);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j <= (causal ? i : n - 1); ++j) {
          const int64_t at = kept::tile_index(i, j, n, causal);
          ASSERT_TRUE(at >= 0 && at < static_cast<int64_t>(seen.size()))
              << "tile (" << i << ", " << j << ") of " << n << " at " << at;
          ++seen[at];
          EXPECT_EQ(at, kept::tile_index(i, 0, n, causal) + j) << "row " << i << " not in order";
        }
      for (std::size_t at = 0; at < seen.size(); ++at)
        EXPECT_EQ(seen[at], 1) << "place " << at << " of " << n << (causal ? " causal" : "");
    }
}

// One kept tile's round trip: the dK/dV kernel's four warps store their dS^T accumulators as
// bf16 pairs (store_kept_ds, at kept_ds::fragment_offset), which must make the tile dS^T
// row-major with every element written once; the dQ kernel copies the tile into shared memory
// with rows padded to 72 elements (load_tile) and each warp reads its 16 query rows of dS with
// ldmatrix.trans (ldsm_at_offset) and multiplies them by K (ldmatrix.trans): dQ = dS K.
TEST(MmaFragments, KeptDsTileRoundTripGivesDsK) {
  namespace kept = scalelab::ops::kept_ds;
  constexpr int B = kept::kTile, HS = 64, L = HS + 8, LS = B + 8, kWarps = 4;
  const std::vector<float> dst = matrix(B, B, B, 6);  // dS^T: keys x queries, no padding
  const std::vector<float> k = matrix(B, HS, L, 7);
  std::vector<float> tile(kept::kTileElems, 1000.f);  // the tile in global memory
  std::vector<int> stores(kept::kTileElems, 0);
  for (int w = 0; w < kWarps; ++w)
    for (int n = 0; n < B / 8; ++n)
      for (int t = 0; t < kLanes; ++t)
        for (int h = 0; h < 2; ++h)
          for (int e = 0; e < 2; ++e) {
            const RC rc = spec_c(t, 2 * h + e);  // the element register 2h + e holds
            const int at = kept::fragment_offset(w, t, n, h) + e;
            ASSERT_TRUE(at >= 0 && at < kept::kTileElems) << "warp " << w << " lane " << t;
            tile[at] = dst[(16 * w + rc.row) * B + 8 * n + rc.col];
            ++stores[at];
          }
  for (int at = 0; at < kept::kTileElems; ++at) {
    ASSERT_EQ(stores[at], 1) << "element " << at << " stored " << stores[at] << " times";
    ASSERT_EQ(tile[at], dst[at]) << "element " << at << " is not dS^T row-major";
  }
  std::vector<float> smem(B * LS, 1000.f);  // load_tile<B, B>: rows of B + 8
  for (int r = 0; r < B; ++r)
    for (int c = 0; c < B; ++c) smem[r * LS + c] = tile[r * B + c];
  for (int w = 0; w < kWarps; ++w) {
    std::vector<WarpAcc> dq(HS / 8, WarpAcc{});
    mma_tile(dq, load_a_transposed(smem, w, B / 16, LS), k, 0, L, /*nk=*/false);
    for (int t = 0; t < kLanes; ++t)
      for (int r = 0; r < 4; ++r)
        for (int n = 0; n < HS / 8; ++n) {
          const int i = 16 * w + spec_c(t, r).row, d = 8 * n + spec_c(t, r).col;
          float want = 0;
          for (int j = 0; j < B; ++j) want += dst[j * B + i] * k[j * L + d];
          ASSERT_EQ(dq[n][t][r], want) << "warp " << w << " lane " << t << " reg " << r;
        }
  }
}
