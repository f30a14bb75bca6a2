// The turns of flash attention's one-kernel backward (common/ops/cuda/flash_turns.hpp) replayed
// on the host, without a GPU, for whole grids: which key blocks add to which query tile of dQ,
// in what order, and whether blocks that start in launch order, with only a few on the GPU at
// once, all finish.
//
// The replay runs the kernel's loop at the level of tiles: a block computes its share of a query
// tile (one round), then waits until the tile's counter equals its turn, adds (the counter goes
// up by one) and moves to its next tile. Blocks start in launch order (blockIdx.x fastest, then
// the head) into `resident` slots, and a finished block frees its slot. A round in which no block
// moves, with blocks left, is a deadlock.
#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "common/ops/cuda/flash_turns.hpp"

namespace {
namespace turns = scalelab::ops::flash_turns;
constexpr int kBk = 64;  // keys a block owns, as the kernel's

struct Grid {
  int T, Bq;
  bool causal;
  int heads = 3;
  int key_blocks() const { return (T + kBk - 1) / kBk; }
  int query_tiles() const { return (T + Bq - 1) / Bq; }
  std::string str() const {
    return "T " + std::to_string(T) + " Bq " + std::to_string(Bq) +
           (causal ? " causal" : " unmasked");
  }
};

struct Replay {
  bool deadlock = false;
  std::vector<std::vector<std::vector<int>>> adds;  // [head][query tile]: key blocks in order
};

// key_block_of: the grid's mapping from blockIdx.x to a key block (the kernel's, or a planted one)
Replay replay(const Grid& g, int resident, const std::function<int(int, int)>& key_block_of) {
  const int nk = g.key_blocks(), nq = g.query_tiles();
  struct Block {
    int head, kb, tile = 0, tiles;
    bool computed = false;
  };
  std::deque<Block> waiting;  // launch order
  for (int h = 0; h < g.heads; ++h)
    for (int x = 0; x < nk; ++x) {
      const int kb = key_block_of(x, nk);
      const int i_begin = turns::first_query(kb, kBk, g.causal);
      waiting.push_back({h, kb, 0, (g.T - i_begin + g.Bq - 1) / g.Bq});
    }
  Replay r;
  r.adds.assign(g.heads, std::vector<std::vector<int>>(nq));
  std::vector<std::vector<int>> counter(g.heads, std::vector<int>(nq, 0));
  std::vector<Block> on_gpu;
  while (!waiting.empty() || !on_gpu.empty()) {
    while (static_cast<int>(on_gpu.size()) < resident && !waiting.empty()) {
      on_gpu.push_back(waiting.front());
      waiting.pop_front();
    }
    bool moved = false;
    for (Block& b : on_gpu) {
      if (b.tile == b.tiles) continue;
      if (!b.computed) {  // this round: its share of the tile
        b.computed = moved = true;
        continue;
      }
      const int i0 = turns::first_query(b.kb, kBk, g.causal) + b.tile * g.Bq, q = i0 / g.Bq;
      if (counter[b.head][q] != turns::turn(b.kb, i0, kBk, nk, g.causal)) continue;  // waits
      ++counter[b.head][q];
      r.adds[b.head][q].push_back(b.kb);
      ++b.tile;
      b.computed = false;
      moved = true;
    }
    const std::size_t before = on_gpu.size();
    std::erase_if(on_gpu, [](const Block& b) { return b.tile == b.tiles; });
    if (!moved && on_gpu.size() == before) {
      r.deadlock = true;
      return r;
    }
  }
  return r;
}

const Grid kGrids[] = {{1, 64, true},    {33, 32, true},   {64, 64, true},  {70, 64, true},
                       {130, 32, true},  {1030, 64, true}, {300, 32, true}, {70, 64, false},
                       {300, 32, false}, {1030, 64, false}};
}  // namespace

// Every query tile gets one share from each key block that sees it and no other, from the
// first adder down to key block 0 (whose add is the last: it writes dQ).
TEST(FlashTurns, EachTileGetsEachShareOnceInOrderBlockZeroLast) {
  for (const Grid& g : kGrids) {
    const Replay r = replay(g, 1 << 20, turns::key_block);  // all on the GPU at once
    ASSERT_FALSE(r.deadlock) << g.str();
    for (int h = 0; h < g.heads; ++h)
      for (int q = 0; q < g.query_tiles(); ++q) {
        const int i0 = q * g.Bq, first = turns::first_adder(i0, kBk, g.key_blocks(), g.causal);
        std::vector<int> want;  // the key blocks whose keys some query of the tile sees
        for (int kb = g.key_blocks() - 1; kb >= 0; --kb)
          if (!g.causal || kb * kBk <= i0 + g.Bq - 1) want.push_back(kb);
        EXPECT_EQ(want.front(), first) << g.str() << " tile " << q;
        EXPECT_EQ(r.adds[h][q], want) << g.str() << " head " << h << " tile " << q;
      }
  }
}

// However few blocks fit on the GPU at once, blocks started in launch order all finish.
TEST(FlashTurns, NoDeadlockWithFewBlocksResident) {
  for (const Grid& g : kGrids)
    for (int resident : {1, 2, 3, 5, 17})
      EXPECT_FALSE(replay(g, resident, turns::key_block).deadlock)
          << g.str() << ", " << resident << " resident";
}

// The fault planted: key block = blockIdx.x (the first key block launched first). Key block 0
// then waits, at query tile 1, for key block 1, which cannot start while key block 0 holds the
// only slot: the replay must see the deadlock (why the kernel launches the last key block first).
TEST(FlashTurns, PlantedFirstKeyBlockFirstDeadlocks) {
  const auto in_order = [](int x, int) { return x; };
  EXPECT_TRUE(replay({130, 64, true}, 1, in_order).deadlock);
  EXPECT_FALSE(replay({130, 64, true}, 1 << 20, in_order).deadlock)  // all resident: it finishes
      << "the planted order deadlocks only when blocks wait for unstarted ones";
}
