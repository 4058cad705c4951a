// TileMask's per-tile view of the interval masks (attention/tile_mask.h), which decides what the
// tiled kernels visit: the query tile's key range, the forward's key tiles (the grid, the stop at
// the range's end, the cut at a causal diagonal) and the tile kinds, all checked element by element
// against Mask::structurally_allows over random causal (both alignments), sliding-window and
// key-padding masks and their conjunctions, N != M, odd sizes and random row ranges.
#include "cabm/kernels/attention/tile_mask.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace cabm::test {
namespace {

struct Case {
  Mask mask;
  std::string name;
  int64_t B, N, M;
};

Case random_case(std::mt19937& rng) {
  const auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Case c{Mask(), "", uniform(1, 3), uniform(1, 300), 0};
  c.M = uniform(0, 3) == 0 ? c.N : uniform(1, 300);
  switch (uniform(0, 3)) {
    case 0:
      c.mask = Mask::causal(), c.name = "causal";
      break;
    case 1:
      c.mask = Mask::causal(CausalAlign::kTopLeft), c.name = "causal top-left";
      break;
    case 2: {
      const int64_t left = uniform(0, 80), right = uniform(0, 2) == 0 ? uniform(0, 40) : 0;
      c.mask = Mask::sliding_window(left, right),
      c.name = "window " + std::to_string(left) + "/" + std::to_string(right);
      break;
    }
    default:
      c.name = "none";
  }
  if (uniform(0, 2) == 0) {
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b < c.B; ++b) lengths.push_back(uniform(0, c.M));
    c.mask = c.mask & Mask::key_padding(lengths);
    c.name += " & key padding";
  }
  return c;
}

TEST(TileMask, KeyRangesTilesAndKindsMatchTheMask) {
  std::mt19937 rng(20261204);
  const auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int64_t cuts = 0, cut_tiles_full = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const Case c = random_case(rng);
    SCOPED_TRACE(c.name + " N " + std::to_string(c.N) + " M " + std::to_string(c.M));
    const TileMask tm(c.mask, c.B, 1, c.N, c.M);
    const auto allows = [&](int64_t b, int64_t i, int64_t j) {
      return c.mask.structurally_allows(b, 0, i, j, c.N, c.M);
    };
    for (int t = 0; t < 6; ++t) {
      const int64_t b = uniform(0, c.B - 1), i0 = uniform(0, c.N - 1), i1 = uniform(i0 + 1, std::min(c.N, i0 + 70));
      const Range rows{i0, i1};
      // The key range: every allowed key inside, its ends allowed for some row, {0, 0} if none.
      std::vector<bool> seen(static_cast<size_t>(c.M), false);
      bool any = false;
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = 0; j < c.M; ++j)
          if (allows(b, i, j)) seen[static_cast<size_t>(j)] = any = true;
      const Range range = tm.key_range(b, rows);
      if (!any) {
        EXPECT_EQ(range.begin, 0);
        EXPECT_EQ(range.end, 0);
        continue;
      }
      ASSERT_LT(range.begin, range.end);
      EXPECT_TRUE(seen[static_cast<size_t>(range.begin)]);
      EXPECT_TRUE(seen[static_cast<size_t>(range.end - 1)]);
      for (int64_t j = 0; j < c.M; ++j)
        if (seen[static_cast<size_t>(j)]) {
          EXPECT_TRUE(j >= range.begin && j < range.end) << "key " << j;
        }

      // The key tiles, with and without the cut: contiguous from the grid's first tile to the
      // range's end, each inside one grid tile of block_k keys (the fp32 forward's V panels);
      // with the cut, a tile that ends at it and starts where every row already sees its keys
      // is a full tile.
      const int64_t block_k = uniform(1, 3) * 16 + uniform(0, 1) * 7;
      for (const int64_t align : {int64_t{0}, int64_t{16}, int64_t{6}}) {
        const KeyTiles tiles = tm.key_tiles(b, rows, block_k, align);
        EXPECT_EQ(tiles.first(), range.begin / block_k * block_k);
        EXPECT_EQ(tiles.end(), range.end);
        int64_t j0 = tiles.first(), count = 0;
        while (j0 < tiles.end()) {
          const int64_t nk = tiles.width(j0);
          ASSERT_GE(nk, 1);
          ASSERT_LE(nk, block_k);
          ASSERT_LE(j0 + nk, range.end);
          EXPECT_LE(j0 + nk, (j0 / block_k + 1) * block_k) << "tile [" << j0 << ", " << j0 + nk << ") crosses the grid";
          if (align == 0) {
            EXPECT_EQ(j0 % block_k, 0) << "the grid, uncut";
          }
          const Range keys{j0, j0 + nk};
          const TileKind kind = tm.classify(b, 0, rows, keys);
          bool tile_any = false, tile_all = true;
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = keys.begin; j < keys.end; ++j) {
              tile_any |= allows(b, i, j);
              tile_all &= allows(b, i, j);
            }
          EXPECT_EQ(kind, !tile_any  ? TileKind::kSkip
                          : tile_all ? TileKind::kFull
                                     : TileKind::kPartial)
              << "tile [" << keys.begin << ", " << keys.end << ")";
          if (align > 0 && j0 + nk == tiles.cut && nk < std::min(block_k, range.end - j0)) {
            EXPECT_EQ(tiles.cut % align, 0);
            ++cuts;
            bool before_visible = true;  // keys [j0, cut) seen by every row when j0 is
            for (int64_t i = i0; i < i1; ++i) before_visible &= allows(b, i, j0);
            if (before_visible) {
              EXPECT_EQ(kind, TileKind::kFull) << "the tile before the cut";
              ++cut_tiles_full;
            }
          }
          j0 += nk;
          ASSERT_LT(++count, 1000);
        }
        EXPECT_EQ(j0, range.end);
      }
    }
  }
  // The cases must have exercised the cut, and the full tiles it makes.
  EXPECT_GT(cuts, 50);
  EXPECT_GT(cut_tiles_full, 20);
}

// A causal diagonal at the sizes: the forward's bf16 tiles (768 keys, 32 rows, 16-key
// cut) of a query tile well inside the sequence are full tiles up to the cut and one partial tile
// of the diagonal's blocks.
TEST(TileMask, CausalDiagonalIsCutAtTheBlockBeforeIt) {
  const TileMask tm(Mask::causal(), 1, 1, 4096, 4096);
  const Range rows{1000, 1032};
  const KeyTiles tiles = tm.key_tiles(0, rows, 768, 16);
  EXPECT_EQ(tiles.cut, 992);  // row 1000 sees keys [0, 1001): the last 16-key boundary is 992
  std::vector<std::pair<int64_t, int64_t>> seen;
  for (int64_t j0 = tiles.first(); j0 < tiles.end(); j0 += tiles.width(j0)) seen.push_back({j0, tiles.width(j0)});
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 768}, {768, 224}, {992, 40}};
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(tm.classify(0, 0, rows, {768, 992}), TileKind::kFull);
  EXPECT_EQ(tm.classify(0, 0, rows, {992, 1032}), TileKind::kPartial);
}

}  // namespace
}  // namespace cabm::test
