// The one block product of the AMX attention kernels (internal to cabm/kernels/: included by
// attention/flash_amx.cpp for the forward's S = Q·Kᵀ and O += P·V, and by
// attention/flash_bf16_backward.cpp for the backward's five products): C = A·B or C += A·B with
// bf16 A and B and fp32 C on the tiles of attention/amx_tiles.h, hardware or emulated.
//
// Layouts (the only ones tdpbf16ps reads):
//   A  row-major bf16, m rows of k elements (row stride lda elements): an A tile is 16 rows × 32
//      elements, i.e. 16 pairs along k.
//   B  pairs of rows of a [k][n] matrix, the two elements of a pair side by side per column
//      (VNNI): a B tile is 16 pairs of rows × 16 columns × 2. Where the 16-column blocks and the
//      pairs lie is the caller's: pair t of column block cb starts at
//      data + cb·block_stride + t·pair_stride. Row-major pairs [k/2][n][2] have pair_stride 2n and
//      block_stride 32; 16-column blocks stored one after another ([n/16][k/2][16][2], packed K)
//      have pair_stride 32 and block_stride 16·k.
//   C  row-major fp32, row stride ldc floats.
// m and n are multiples of 16 and k of 32, padded by the caller with rows and columns that are
// zero (or finite and never read back). Register blocking 2 × 2: C tiles 0-3, A tiles 4-5, B tiles
// 6-7, the caller's tile configuration (Tiles::configure). Each C tile sums over k in order, so the
// result does not depend on how m and n are split.
#pragma once

#include "cabm/kernels/attention/amx_tiles.h"

#include <cstdint>

namespace cabm::detail {

#if defined(__x86_64__)

struct TileB {
  const bf16* data;
  int64_t pair_stride;   // elements from one pair of rows to the next
  int64_t block_stride;  // elements from one 16-column block to the next
};

template <class Tiles>
CABM_AMX void tile_gemm(int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda, TileB b, float* c, int64_t ldc,
                        bool accumulate) {
  memory_barrier();  // the caller's stores to A, B and C come before the tile loads
  const int64_t as = lda * 2, bs = b.pair_stride * 2, cs = ldc * 4;
  for (int64_t r = 0; r < m; r += 32) {
    const bool two_rows = m - r >= 32;
    const bf16 *a0 = a + r * lda, *a1 = a0 + 16 * lda;
    for (int64_t col = 0; col < n; col += 32) {
      const bool two_cols = n - col >= 32;
      float *c00 = c + r * ldc + col, *c10 = c00 + 16 * ldc;
      const bf16* b0 = b.data + col / 16 * b.block_stride;
      const bf16* b1 = b0 + b.block_stride;
      if (accumulate) {
        Tiles::template load<0>(c00, cs);
        if (two_cols) Tiles::template load<1>(c00 + 16, cs);
        if (two_rows) Tiles::template load<2>(c10, cs);
        if (two_rows && two_cols) Tiles::template load<3>(c10 + 16, cs);
      } else {
        Tiles::template zero<0>();
        Tiles::template zero<1>();
        Tiles::template zero<2>();
        Tiles::template zero<3>();
      }
      for (int64_t kc = 0; kc < k; kc += 32) {
        const int64_t pair_offset = kc / 2 * b.pair_stride;
        Tiles::template load<6>(b0 + pair_offset, bs);
        if (two_cols) Tiles::template load<7>(b1 + pair_offset, bs);
        Tiles::template load<4>(a0 + kc, as);
        Tiles::template dpbf16ps<0, 4, 6>();
        if (two_cols) Tiles::template dpbf16ps<1, 4, 7>();
        if (two_rows) {
          Tiles::template load<5>(a1 + kc, as);
          Tiles::template dpbf16ps<2, 5, 6>();
          if (two_cols) Tiles::template dpbf16ps<3, 5, 7>();
        }
      }
      Tiles::template store<0>(c00, cs);
      if (two_cols) Tiles::template store<1>(c00 + 16, cs);
      if (two_rows) Tiles::template store<2>(c10, cs);
      if (two_rows && two_cols) Tiles::template store<3>(c10 + 16, cs);
    }
  }
}

#endif

}  // namespace cabm::detail
