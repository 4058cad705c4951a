// Transposes between the row layout of q, k, v, out, dk and dv ([.., N, H, d]: one row per
// position) and the tiles of the fp32 attention kernel, which hold them transposed (lanes over
// positions; attention/tile_product.h). Internal to kernels/: included by the tile loops
// (attention/flash_{forward,backward}_body.h) once per instruction set, in the namespace of that
// set's simd flavour (CABM_SIMD_NS, simd.h).
//
// The vector sets move square blocks of kWidth × kWidth through registers: kWidth row loads, an
// in-register transpose (64 shuffles for 16 × 16, 24 for 8 × 8), kWidth column stores; the
// portable set copies element by element. At the training shape (B 32, N 128, H 8, d 32, one
// thread, Intel Xeon, session 28) the forward ran 3-12% faster than with element-by-element loops
// (with out's rows prefetched), the backward 8-13% (with its rows prefetched into L2: without, the
// blocks' loads waited longer than the element-by-element ones and the backward ran 2-4 ms slower).
#pragma once

#include "cabm/core/dtype.h"
#include "cabm/kernels/attention/flash_item.h"
#include "cabm/kernels/simd.h"
#include "cabm/kernels/unroll.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace cabm::CABM_SIMD_NS::tile {

namespace simd = ::cabm::CABM_SIMD_NS;
using simd::kWidth;
using simd::Vec;

#if CABM_SIMD_LEVEL > 0

// The first `count` elements of a row as floats (bf16 widened exactly), the other lanes 0.
template <typename T>
inline Vec load_row(const T* p, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::load_n(p, count);
  } else {
    if (count == kWidth) return simd::load_bf16(reinterpret_cast<const uint16_t*>(p));
    uint16_t bits[kWidth] = {};
    std::memcpy(bits, p, static_cast<size_t>(count) * sizeof(T));
    return simd::load_bf16(bits);
  }
}

#if CABM_SIMD_LEVEL == 2
// r[i] = row i of a 16 × 16 block in, column i out.
inline void transpose_block(Vec (&r)[kWidth]) {
  __m512 t[16], u[16];
  CABM_UNROLL
  for (int i = 0; i < 8; ++i) {  // lane L of t[2i]: (a0 b0 a1 b1) of rows a = 2i, b = 2i + 1, columns 4L + 0, 1
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i].v, r[2 * i + 1].v);
  }
  CABM_UNROLL
  for (int i = 0; i < 4; ++i) {  // lane L of u[4i + k]: column 4L + k of rows 4i .. 4i + 3
    const __m512d lo0 = _mm512_castps_pd(t[4 * i]), lo1 = _mm512_castps_pd(t[4 * i + 2]);
    const __m512d hi0 = _mm512_castps_pd(t[4 * i + 1]), hi1 = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
  }
  CABM_UNROLL
  for (int k = 0; k < 4; ++k) {
    // Lanes (0, 2) and (1, 3) of rows 0-3 and 4-7 (v), of rows 8-11 and 12-15 (w).
    const __m512 v02 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), v13 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
    const __m512 w02 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    const __m512 w13 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
    r[k].v = _mm512_shuffle_f32x4(v02, w02, 0x88);       // column k      (lane 0)
    r[4 + k].v = _mm512_shuffle_f32x4(v13, w13, 0x88);   // column 4 + k  (lane 1)
    r[8 + k].v = _mm512_shuffle_f32x4(v02, w02, 0xdd);   // column 8 + k  (lane 2)
    r[12 + k].v = _mm512_shuffle_f32x4(v13, w13, 0xdd);  // column 12 + k (lane 3)
  }
}
#else
// r[i] = row i of an 8 × 8 block in, column i out.
inline void transpose_block(Vec (&r)[kWidth]) {
  __m256 t[8], u[8];
  CABM_UNROLL
  for (int i = 0; i < 4; ++i) {  // lane L of t[2i]: (a0 b0 a1 b1) of rows a = 2i, b = 2i + 1, columns 4L + 0, 1
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i].v, r[2 * i + 1].v);
  }
  CABM_UNROLL
  for (int i = 0; i < 2; ++i) {  // lane L of u[4i + k]: column 4L + k of rows 4i .. 4i + 3
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  CABM_UNROLL
  for (int k = 0; k < 4; ++k) {
    r[k].v = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);      // column k     (lane 0)
    r[4 + k].v = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);  // column 4 + k (lane 1)
  }
}
#endif

#endif  // CABM_SIMD_LEVEL > 0

// dst[j·ldd + i] = src[i·lds + j]·scale (kAdd: dst[..] += ..) for i < rows, j < cols, src widened
// to fp32; x·scale is rounded as element by element, kAdd adds it with one FMA in the vector sets.
// kPad: dst's positions i in [rows, round_up(rows, kWidth)) get zeros, as the tiles' padding lanes
// need. Prefetches the source rows of the next block of rows (q's rows come from memory, H·d floats
// apart).
template <bool kPad, bool kAdd = false, typename T>
void transpose_scaled(const T* src, int64_t lds, int64_t rows, int64_t cols, float scale, float* dst, int64_t ldd) {
  static_assert(!(kPad && kAdd));
#if CABM_SIMD_LEVEL > 0
  const Vec s = simd::set1(scale);
  for (int64_t i0 = 0; i0 < rows; i0 += kWidth) {
    const int64_t ni = std::min<int64_t>(kWidth, rows - i0), stored = kPad ? kWidth : ni;
    for (int64_t r = 0; r < kWidth && i0 + kWidth + r < rows; ++r) {
      const char* ahead = reinterpret_cast<const char*>(src + (i0 + kWidth + r) * lds);
      for (int64_t line = 0; line < cols * static_cast<int64_t>(sizeof(T)); line += 64)
        __builtin_prefetch(ahead + line);
    }
    for (int64_t j0 = 0; j0 < cols; j0 += kWidth) {
      const int64_t nj = std::min<int64_t>(kWidth, cols - j0);
      const T* in = src + i0 * lds + j0;
      // Every index into block is a constant (loops unrolled, bounds tested inside), so that GCC
      // keeps it in registers: a variable one put it on the stack.
      Vec block[kWidth];
      if (ni == kWidth && nj == kWidth) {
        CABM_UNROLL
        for (int r = 0; r < kWidth; ++r) block[r] = load_row(in + r * lds, kWidth);
      } else {
        CABM_UNROLL
        for (int r = 0; r < kWidth; ++r) block[r] = r < ni ? load_row(in + r * lds, nj) : simd::zero();
      }
      transpose_block(block);
      CABM_UNROLL
      for (int c = 0; c < kWidth; ++c) {
        if (c >= nj) break;
        float* out = dst + (j0 + c) * ldd + i0;
        if constexpr (kAdd) {
          simd::store_n(out, simd::fma(block[c], s, simd::load_n(out, stored)), stored);
        } else {
          simd::store_n(out, simd::mul(block[c], s), stored);
        }
      }
    }
  }
#else
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const float x = ::cabm::flash::widen(src[i * lds + j]) * scale;
      dst[j * ldd + i] = kAdd ? dst[j * ldd + i] + x : x;
    }
  if constexpr (kPad) {
    const int64_t padded = (rows + kWidth - 1) / kWidth * kWidth;
    for (int64_t j = 0; j < cols; ++j) std::fill(dst + j * ldd + rows, dst + j * ldd + padded, 0.0f);
  }
#endif
}

}  // namespace cabm::CABM_SIMD_NS::tile
