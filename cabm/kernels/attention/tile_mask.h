// Attention masks evaluated per tile, shared by the tiled (flash) attention kernels in fp32 and
// bf16. Internal to kernels/: not a public API.
#pragma once

#include "cabm/core/tensor.h"
#include "cabm/kernels/attention/mask.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace cabm {

// The mask, evaluated per tile.
//
// Causal (either alignment), sliding window and key padding all allow one interval of keys per
// query row, [lo(i), hi(b, i)), and both ends are non-decreasing in i. That gives each query tile
// its key range (and each key tile its query range) directly, so fully masked tiles outside it are
// never visited. Block-sparse layouts are checked per tile on the blocks the tile overlaps. Allow
// and additive tensors are per element: their tiles are always "partial".
enum class TileKind { kSkip, kFull, kPartial };

struct Range {
  int64_t begin, end;
};

// The forward's key tiles for one query tile: the grid of block_k keys from the first tile that
// meets the rows' key range, with two cuts. Keys past that range are blocked for every row: the
// last tile stops there (this changes no bit: their weights are exactly 0). And where `align` is
// not 0, the tile inside which the keys that every row sees end (a causal diagonal) is cut at the
// last multiple of `align` keys before that end, so the keys before the cut take the unmasked path
// and only the diagonal's keys the masked one; the next tile runs from the cut to the end of that
// grid tile, so that no tile crosses a multiple of block_k (the fp32 forward's V panels, which
// the bf16 kernels' fp32 SIMD path reads too, hold block_k keys each).
//   for (int64_t j0 = tiles.first(); j0 < tiles.end(); j0 += tiles.width(j0)) ...
struct KeyTiles {
  Range keys;  // the rows' key range
  int64_t block_k, cut;
  int64_t first() const { return keys.begin / block_k * block_k; }
  int64_t end() const { return keys.end; }
  int64_t width(int64_t j0) const {
    const int64_t grid_end = std::min((j0 / block_k + 1) * block_k, keys.end);
    return j0 < cut && cut < grid_end ? cut - j0 : grid_end - j0;
  }
};

// Where every bf16 forward path cuts (flash_bf16.cpp's loop and the fp32 SIMD tiles running bf16):
// one alignment for all, so that they round P over the same tiles; 16 keys, the packed K blocks.
inline constexpr int64_t kBf16DiagonalCut = 16;

class TileMask {
 public:
  // resolved_ validates the mask and broadcasts its tensors; block layouts are looked up here.
  TileMask(const Mask& mask, int64_t B, int64_t H, int64_t N, int64_t M) : resolved_(mask, B, H, N, M), N_(N), M_(M) {
    for (const BlockSparseLayout& layout : mask.block_layouts()) {
      const Tensor& blocks = layout.blocks;
      block_views_.push_back({blocks.data<uint8_t>(), blocks.size(0) == 1 ? 0 : blocks.stride(0), blocks.stride(1),
                              blocks.stride(2), layout.block_q, layout.block_k});
    }
    one_term_row_ = block_views_.empty() && (!per_element() || resolved_.tensor_terms_query_invariant());
  }

  bool per_element() const { return resolved_.has_tensor_parts(); }

  int64_t lo(int64_t i) const { return std::max<int64_t>(0, i + M_ - N_ - mask().window_left()); }
  int64_t hi(int64_t b, int64_t i) const {
    const int64_t p = i + M_ - N_;  // bottom-right position of query i among the keys
    int64_t h = std::min(M_, p + mask().window_right() + 1);
    if (mask().causal_align() == CausalAlign::kBottomRight) h = std::min(h, p + 1);
    if (mask().causal_align() == CausalAlign::kTopLeft) h = std::min(h, i + 1);
    if (!mask().key_lengths().empty()) h = std::min(h, mask().key_lengths()[b]);
    return h;
  }

  // Keys that rows [i0, i1) may see by the interval parts (empty rows ignored); {0, 0} if none.
  Range key_range(int64_t b, Range rows) const {
    Range r{M_, 0};
    for (int64_t i = rows.begin; i < rows.end; ++i) {
      const int64_t l = lo(i), h = hi(b, i);
      if (l < h) r = {std::min(r.begin, l), std::max(r.end, h)};
    }
    return r.begin < r.end ? r : Range{0, 0};
  }

  // The key tiles of query rows [i0, i1) (see KeyTiles). The keys every row sees by the interval
  // parts are [lo(i1 − 1), hi(b, i0)), both ends being non-decreasing in i (tensor terms and block
  // layouts may still block some of them, which leaves the cut harmless).
  KeyTiles key_tiles(int64_t b, Range rows, int64_t block_k, int64_t align) const {
    const int64_t common_begin = lo(rows.end - 1), common_end = hi(b, rows.begin);
    return {key_range(b, rows), block_k, align > 0 && common_begin < common_end ? common_end / align * align : 0};
  }

  // Query rows that may see some key in [j0, j1) by the interval parts: a superset, by binary search
  // on the monotone ends (rows with hi > j0 form a suffix, rows with lo < j1 a prefix).
  Range query_range(int64_t b, Range keys) const {
    int64_t first = 0, last = N_;  // first row with hi > j0
    while (first < last) {
      const int64_t mid = (first + last) / 2;
      if (hi(b, mid) > keys.begin)
        last = mid;
      else
        first = mid + 1;
    }
    int64_t lo_row = first, end = N_;  // first row with lo >= j1
    while (lo_row < end) {
      const int64_t mid = (lo_row + end) / 2;
      if (lo(mid) >= keys.end)
        end = mid;
      else
        lo_row = mid + 1;
    }
    return {first, std::max(first, end)};
  }

  TileKind classify(int64_t b, int64_t h, Range rows, Range keys) const {
    bool any = false, full = true;
    for (int64_t i = rows.begin; i < rows.end; ++i) {
      const int64_t l = lo(i), u = hi(b, i);
      any |= std::max(l, keys.begin) < std::min(u, keys.end);
      full &= l <= keys.begin && u >= keys.end;
    }
    if (!any) return TileKind::kSkip;
    for (const BlockSparseLayout& layout : mask().block_layouts()) {
      const Tensor& blocks = layout.blocks;
      const uint8_t* p = blocks.data<uint8_t>() + (blocks.size(0) == 1 ? 0 : h) * blocks.stride(0);
      int64_t allowed = 0, total = 0;
      for (int64_t qb = rows.begin / layout.block_q; qb <= (rows.end - 1) / layout.block_q; ++qb)
        for (int64_t kb = keys.begin / layout.block_k; kb <= (keys.end - 1) / layout.block_k; ++kb, ++total)
          allowed += p[qb * blocks.stride(1) + kb * blocks.stride(2)] != 0;
      if (allowed == 0) return TileKind::kSkip;
      full &= allowed == total;
    }
    return full && !per_element() ? TileKind::kFull : TileKind::kPartial;
  }

  // Additive term of element (i, j), scaled by bias_scale (> 0): 0 or the bias sum where allowed,
  // −inf where blocked. Written to tile[(i − rows.begin) · row_step + (j − keys.begin) · key_step],
  // one of the steps being 1 (key_step 1: rows of keys, the bf16 kernels' and the backwards' tiles;
  // row_step 1: rows of queries, the fp32 forward's lanes).
  //  - Where the per-element parts are the same for every query (none, or tensors broadcast over
  //    the queries: key-padding tensors [B, 1, 1, M]), one row of tensor terms serves the tile, and
  //    each row only applies its interval [lo(i), hi(b, i)).
  //  - Otherwise (block layouts, or tensors that vary by query) row by row (fill_row), and for rows
  //    of queries through a per-thread buffer written transposed.
  // Either way the tensors are read along rows, where their keys are contiguous (or broadcast),
  // never one strided element at a time.
  void fill(int64_t b, int64_t h, Range rows, Range keys, float bias_scale, float* tile, int64_t row_step,
            int64_t key_step) const {
    const int64_t ni = rows.end - rows.begin, nk = keys.end - keys.begin;
    if (!one_term_row_) {
      if (key_step == 1) {
        for (int64_t r = 0; r < ni; ++r) fill_row(b, h, rows.begin + r, keys, bias_scale, tile + r * row_step);
        return;
      }
      float* buf = thread_scratch(ni * nk);
      for (int64_t r = 0; r < ni; ++r) fill_row(b, h, rows.begin + r, keys, bias_scale, buf + r * nk);
      for (int64_t j = 0; j < nk; ++j) {
        float* out = tile + j * key_step;
        for (int64_t r = 0; r < ni; ++r) out[r * row_step] = buf[r * nk + j];
      }
      return;
    }
    float* key_terms = thread_scratch(nk);  // the tensor terms of every query row, · bias_scale
    if (per_element()) {
      resolved_.tensor_terms(b, h, rows.begin, keys.begin, nk, key_terms);
      for (int64_t j = 0; j < nk; ++j) key_terms[j] *= bias_scale;  // −inf stays −inf
    } else {
      std::fill_n(key_terms, nk, 0.0f);
    }
    if (key_step == 1) {  // rows of keys: each row is the terms' row inside its interval
      for (int64_t r = 0; r < ni; ++r) {
        const auto [l, u] = row_interval(b, rows.begin + r, keys);
        float* out = tile + r * row_step;
        std::fill(out, out + l, -INFINITY);
        std::copy(key_terms + l, key_terms + u, out + l);
        std::fill(out + u, out + nk, -INFINITY);
      }
      return;
    }
    std::vector<int32_t> lower(static_cast<size_t>(ni)), upper(static_cast<size_t>(ni));
    for (int64_t r = 0; r < ni; ++r) {
      const auto [l, u] = row_interval(b, rows.begin + r, keys);
      lower[r] = static_cast<int32_t>(l), upper[r] = static_cast<int32_t>(u);
    }
    for (int32_t j = 0; j < nk; ++j) {
      float* out = tile + j * key_step;
      const float term = key_terms[j];
      for (int64_t r = 0; r < ni; ++r) out[r * row_step] = j >= lower[r] && j < upper[r] ? term : -INFINITY;
    }
  }

  // Query row i over keys, contiguous in out: −inf outside the row's interval [lo(i), hi(b, i)) and
  // in blocks a block layout turns off; inside, the tensor terms · bias_scale (0 without tensors).
  // Tensors are looked up only inside the interval, and layouts one block-run at a time.
  void fill_row(int64_t b, int64_t h, int64_t i, Range keys, float bias_scale, float* out) const {
    const int64_t nk = keys.end - keys.begin;
    const auto [l, u] = row_interval(b, i, keys);
    std::fill(out, out + l, -INFINITY);
    std::fill(out + u, out + nk, -INFINITY);
    if (!per_element()) {
      std::fill(out + l, out + u, 0.0f);
    } else if (u > l) {
      resolved_.tensor_terms(b, h, i, keys.begin + l, u - l, out + l);
      for (int64_t j = l; j < u; ++j) out[j] *= bias_scale;  // −inf stays −inf
    }
    for (const BlockView& blocks : block_views_) {
      const uint8_t* row = blocks.data + h * blocks.sh + (i / blocks.block_q) * blocks.sq;
      for (int64_t j = l; j < u;) {
        const int64_t kb = (keys.begin + j) / blocks.block_k;
        const int64_t end = std::min(u, (kb + 1) * blocks.block_k - keys.begin);
        if (row[kb * blocks.sk] == 0) std::fill(out + j, out + end, -INFINITY);
        j = end;
      }
    }
  }

 private:
  // Row i's interval [lo(i), hi(b, i)) within the tile's keys, relative to keys.begin (l <= u).
  Range row_interval(int64_t b, int64_t i, Range keys) const {
    const int64_t nk = keys.end - keys.begin;
    const int64_t l = std::clamp(lo(i) - keys.begin, int64_t{0}, nk);
    return {l, std::clamp(hi(b, i) - keys.begin, l, nk)};
  }

  // The calling thread's buffer of at least n floats, kept (and grown) for its later tiles.
  static float* thread_scratch(int64_t n) {
    thread_local std::vector<float> buffer;
    if (buffer.size() < static_cast<size_t>(n)) buffer.resize(static_cast<size_t>(n));
    return buffer.data();
  }

  // A block layout's entries by index arithmetic alone (as detail::MaskElements for tensors);
  // points into the layouts' storage, which resolved_'s mask shares.
  struct BlockView {
    const uint8_t* data;
    int64_t sh, sq, sk;  // sh 0: one layout for every head
    int64_t block_q, block_k;
  };

  const Mask& mask() const { return resolved_.mask(); }

  ResolvedMask resolved_;  // holds a copy of the mask (tensors are shared): never dangles
  int64_t N_, M_;
  std::vector<BlockView> block_views_;
  // No block layouts, and the tensor parts (if any) the same for every query: fill builds one row
  // of terms per tile.
  bool one_term_row_;
};

// The additive mask of a bf16 forward's tile (rows queries, lanes keys in 16-key blocks; rows
// `ld` floats apart), the bias scaled by bias_scale, with the padding keys [nk, nk16) of a short
// last tile blocked (−inf), written to `tile`; null where the tile needs none (full, no padding).
inline const float* padded_key_mask(const TileMask& mask, TileKind kind, int64_t b, int64_t h, Range rows, Range keys,
                                    int64_t nk16, float bias_scale, float* tile, int64_t ld) {
  const int64_t ni = rows.end - rows.begin, nk = keys.end - keys.begin;
  if (kind != TileKind::kPartial && nk == nk16) return nullptr;
  if (kind == TileKind::kPartial) {
    mask.fill(b, h, rows, keys, bias_scale, tile, ld, 1);
  } else {
    for (int64_t r = 0; r < ni; ++r) std::fill_n(tile + r * ld, nk, 0.0f);
  }
  for (int64_t r = 0; r < ni; ++r) std::fill(tile + r * ld + nk, tile + r * ld + nk16, -INFINITY);
  return tile;
}

// The forward's work items: one query tile of one head each, for heads [first_head, end_head) in
// b·H + h order, handed out dynamically. Items go head by head, and within a head heaviest first
// (causal and windowed tiles differ in cost) so that the light ones fill the gaps at the end. Head
// by head matters: the threads then stream the same head's K and V through the shared L3. Sorting
// all heads' items by cost alone had the threads walk all heads' K and V at once and made the
// causal forward 25% slower per FLOP (N = 4096, 8 heads).
struct QueryTileItem {
  int64_t b, h, qt;
};
inline std::vector<QueryTileItem> forward_work_items(const TileMask& mask, int64_t H, int64_t N, int64_t block_q,
                                                     int64_t first_head, int64_t end_head) {
  const int64_t n_qt = (N + block_q - 1) / block_q;
  std::vector<QueryTileItem> items;
  items.reserve(static_cast<size_t>((end_head - first_head) * n_qt));
  std::vector<std::pair<int64_t, int64_t>> by_cost;  // (keys in range, query tile) of one head
  for (int64_t hd = first_head; hd < end_head; ++hd) {
    const int64_t b = hd / H, h = hd % H;
    by_cost.clear();
    for (int64_t qt = 0; qt < n_qt; ++qt) {
      const Range keys = mask.key_range(b, {qt * block_q, std::min(N, (qt + 1) * block_q)});
      by_cost.push_back({keys.end - keys.begin, qt});
    }
    std::stable_sort(by_cost.begin(), by_cost.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    for (const auto& [cost, qt] : by_cost) items.push_back({b, h, qt});
  }
  return items;
}

}  // namespace cabm
