// The tile instructions of the AMX attention forward (internal to cabm/kernels/: included by
// attention/flash_amx.cpp only), behind two interchangeable policies with the same static
// members, so that one kernel body runs either way:
//   HardwareTiles  the instructions themselves (tileloadd, tilestored, tilezero, tdpbf16ps,
//                  ldtilecfg, tilerelease): for CPUs with AMX-BF16 (bf16_amx_active()).
//   EmulatedTiles  a scalar model of the same instructions on per-thread arrays, following the
//                  pseudo-code of Intel's ISA reference for palette 1 with every tile configured
//                  16 rows × 64 bytes (the only configuration the kernel uses): tdpbf16ps adds,
//                  per C element, the two bf16 products of each pair in order, in fp32, treating
//                  subnormal inputs as zero and flushing subnormal results (DAZ/FTZ). It lets the
//                  tests run the AMX kernel's layouts, blocking and softmax on a CPU without AMX
//                  (the softmax needs AVX512_BF16); it is far slower than the hardware.
// Tile numbers are template arguments because the instructions encode them as immediates.
#pragma once

#include "cabm/core/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include "cabm/kernels/x86_intrinsics.h"
#endif

namespace cabm::detail {

#if defined(__x86_64__)

#define CABM_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// GCC's tileloadd asm has no memory operand: without this barrier the compiler may keep the
// stores that fill a tile's source (P, the rescaled O) after the load that reads them.
inline void memory_barrier() {
  __asm__ volatile("" ::: "memory");
}

struct HardwareTiles {
  // Palette 1, all eight tiles 16 rows × 64 bytes; per thread, until release().
  CABM_AMX static void configure() {
    TileConfig cfg{};
    cfg.palette_id = 1;
    for (int t = 0; t < 8; ++t) {
      cfg.rows[t] = 16;
      cfg.colsb[t] = 64;
    }
    memory_barrier();
    _tile_loadconfig(&cfg);
  }
  CABM_AMX static void release() { _tile_release(); }
  // GCC's tile intrinsics are macros that paste the tile number into the instruction's text, so a
  // template argument cannot reach them: one branch per tile, resolved at compile time.
#define CABM_EACH_TILE(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
  template <int T>
  CABM_AMX static void zero() {
#define CABM_TILE_ZERO(n) \
  if constexpr (T == n) _tile_zero(n);
    CABM_EACH_TILE(CABM_TILE_ZERO)
#undef CABM_TILE_ZERO
  }
  template <int T>
  CABM_AMX static void load(const void* base, int64_t stride) {
#define CABM_TILE_LOAD(n) \
  if constexpr (T == n) _tile_loadd(n, base, stride);
    CABM_EACH_TILE(CABM_TILE_LOAD)
#undef CABM_TILE_LOAD
  }
  template <int T>
  CABM_AMX static void store(void* base, int64_t stride) {
#define CABM_TILE_STORE(n) \
  if constexpr (T == n) _tile_stored(n, base, stride);
    CABM_EACH_TILE(CABM_TILE_STORE)
#undef CABM_TILE_STORE
  }
#undef CABM_EACH_TILE
  // The kernel's register blocking: C tiles 0-3 from A tiles 4-5 and B tiles 6-7.
  template <int C, int A, int B>
  CABM_AMX static void dpbf16ps() {
    if constexpr (C == 0 && A == 4 && B == 6)
      _tile_dpbf16ps(0, 4, 6);
    else if constexpr (C == 1 && A == 4 && B == 7)
      _tile_dpbf16ps(1, 4, 7);
    else if constexpr (C == 2 && A == 5 && B == 6)
      _tile_dpbf16ps(2, 5, 6);
    else if constexpr (C == 3 && A == 5 && B == 7)
      _tile_dpbf16ps(3, 5, 7);
    else
      static_assert(C < 0, "tile combination not used by the kernel");
  }
};

class EmulatedTiles {
 public:
  static void configure() {}
  static void release() {}
  template <int T>
  static void zero() {
    std::memset(tiles()[T], 0, kTileBytes);
  }
  template <int T>
  static void load(const void* base, int64_t stride) {
    for (int r = 0; r < kRows; ++r)
      std::memcpy(tiles()[T] + r * kRowBytes, static_cast<const unsigned char*>(base) + r * stride, kRowBytes);
  }
  template <int T>
  static void store(void* base, int64_t stride) {
    for (int r = 0; r < kRows; ++r)
      std::memcpy(static_cast<unsigned char*>(base) + r * stride, tiles()[T] + r * kRowBytes, kRowBytes);
  }
  // C[m][n] += Σ_k A[m][2k]·B[k][2n] + A[m][2k+1]·B[k][2n+1], k over the 16 rows of B, one fp32
  // addition per product in that order.
  template <int C, int A, int B>
  static void dpbf16ps() {
    float c[kRows][16];
    bf16 a[kRows][32], b[kRows][32];
    std::memcpy(c, tiles()[C], kTileBytes);
    std::memcpy(a, tiles()[A], kTileBytes);
    std::memcpy(b, tiles()[B], kTileBytes);
    for (int m = 0; m < kRows; ++m)
      for (int k = 0; k < kRows; ++k)
        for (int n = 0; n < 16; ++n) {
          float t = c[m][n];
          t = flush(t + widen(a[m][2 * k]) * widen(b[k][2 * n]));
          t = flush(t + widen(a[m][2 * k + 1]) * widen(b[k][2 * n + 1]));
          c[m][n] = t;
        }
    std::memcpy(tiles()[C], c, kTileBytes);
  }

 private:
  static constexpr int kRows = 16, kRowBytes = 64, kTileBytes = kRows * kRowBytes;
  static unsigned char (*tiles())[kTileBytes] {
    alignas(64) thread_local unsigned char storage[8][kTileBytes];
    return storage;
  }
  static float widen(bf16 x) {  // subnormal inputs as zero
    return (x.bits & 0x7f80) == 0 ? 0.0f : bf16_to_float(x);
  }
  static float flush(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
};

#endif

}  // namespace cabm::detail
