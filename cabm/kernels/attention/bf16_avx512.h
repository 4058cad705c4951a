// The vdpbf16ps micro-kernels of the avx512_bf16 attention paths (internal to cabm/kernels/:
// included by attention/flash_bf16.cpp for the forward, flash_bf16_backward.cpp for the backward
// and flash_amx.cpp for the AMX forward's softmax): both products on the packed layouts of
// attention/bf16_packing.h, and the row pass of the online softmax. Compiled for AVX-512 BF16 by
// function attribute, so the library builds for any x86-64; callers run it only where the CPU
// has AVX512_BF16 (bf16_active_isa() is kAvx512Bf16 or kAmx).
//   S = Q·Kᵀ   one zmm of K = a pair of head-dim elements for 16 keys; a broadcast pair of a Q row
//              gives 16 partial scores per vdpbf16ps.
//   O += P·V   one zmm of V = two keys for 16 columns; a broadcast pair of a P row adds
//              p_j·v_j + p_j+1·v_j+1 to 16 output columns.
#pragma once

#include "cabm/kernels/attention/bf16_packing.h"
#include "cabm/kernels/exp2_poly.h"
#include "cabm/kernels/unroll.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include "cabm/kernels/x86_intrinsics.h"
#define CABM_HAVE_AVX512_BF16_CODE 1
#endif

namespace cabm::detail {

#if defined(CABM_HAVE_AVX512_BF16_CODE)
#define CABM_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#pragma GCC diagnostic push
#ifndef __clang__  // a GCC-only warning group; clang warns about the unknown name
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

CABM_AVX512_BF16 inline __m512 dot2(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
CABM_AVX512_BF16 inline __m512i broadcast_pair(const bf16* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return _mm512_set1_epi32(static_cast<int>(w));
}

// MR rows × NV vectors of 16 scores into acc; k over pairs of head-dim elements. Broadcasts
// first, then one K vector at a time: MR·NV accumulators + MR broadcasts + 1 load live at once.
template <int MR, int NV>
CABM_AVX512_BF16 inline void scores_accumulate(const bf16* qp, int64_t dp, const bf16* kblock, __m512 (&acc)[MR][NV]) {
  CABM_UNROLL
  for (int r = 0; r < MR; ++r) {
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  const int64_t pairs = dp / 2, block_stride = pairs * kPackedKeyBlock * 2;
  for (int64_t c = 0; c < pairs; ++c) {
    __m512i a[MR];
    CABM_UNROLL
    for (int r = 0; r < MR; ++r) a[r] = broadcast_pair(qp + r * dp + 2 * c);
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) {
      const __m512i b = _mm512_loadu_si512(kblock + v * block_stride + c * kPackedKeyBlock * 2);
      CABM_UNROLL
      for (int r = 0; r < MR; ++r) acc[r][v] = dot2(acc[r][v], a[r], b);
    }
  }
}

// The scores of MR rows × NV key blocks, stored to s (row stride lds).
template <int MR, int NV>
CABM_AVX512_BF16 void scores_block(const bf16* qp, int64_t dp, const bf16* kblock, float* s, int64_t lds) {
  __m512 acc[MR][NV];
  scores_accumulate(qp, dp, kblock, acc);
  CABM_UNROLL
  for (int r = 0; r < MR; ++r) {
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(s + r * lds + v * 16, acc[r][v]);
  }
}

// Calls fn.template operator()<R>() for the row count R = rows (1..MaxRows), a compile-time constant.
// The lambdas given here carry CABM_AVX512_BF16 themselves: without it they are compiled for the
// build's baseline, where GCC cannot inline the micro-kernels into them, and a portable build
// (CABM_NATIVE=OFF) ran the bf16 forward 7% slower than a native one (Zen 4, N 4096, d 64: the
// called scores_block zeroed a stack copy of its 24 accumulators on every call).
template <int MaxRows, class Fn>
CABM_AVX512_BF16 inline void with_rows(int64_t rows, Fn&& fn) {
  if constexpr (MaxRows >= 1) {
    if (rows == MaxRows) {
      fn.template operator()<MaxRows>();
      return;
    }
    with_rows<MaxRows - 1>(rows, fn);
  }
}

// Whole tile: 4 query rows × 6 key blocks (96 keys) per micro-kernel call (24 accumulators, 4
// broadcasts and 6 loads per 24 vdpbf16ps), smaller blocks at the edges only.
CABM_AVX512_BF16 inline void scores_avx512(const bf16* qp, int64_t ni, const bf16* kp, int64_t j0, int64_t nk16,
                                           int64_t dp, float* s, int64_t lds) {
  constexpr int kRows = 4, kBlocks = 6;
  const int64_t block_stride = dp / 2 * kPackedKeyBlock * 2;
  const bf16* kb = kp + (j0 / kPackedKeyBlock) * block_stride;
  const int64_t nb = nk16 / kPackedKeyBlock;
  for (int64_t r = 0; r < ni; r += kRows) {
    const int64_t mr = std::min<int64_t>(kRows, ni - r);
    for (int64_t v = 0; v < nb; v += kBlocks) {
      const int64_t nv = std::min<int64_t>(kBlocks, nb - v);
      with_rows<kRows>(mr, [&]<int R>() CABM_AVX512_BF16 {
        with_rows<kBlocks>(nv, [&]<int V>() CABM_AVX512_BF16 {
          scores_block<R, V>(qp + r * dp, dp, kb + v * block_stride, s + r * lds + v * 16, lds);
        });
      });
    }
  }
}

// MR rows × NV vectors of 16 output columns, k over pairs of keys; O is scaled by the rows'
// alpha (the online softmax's correction) as it is loaded, or accumulated as it is (alpha null).
template <int MR, int NV>
CABM_AVX512_BF16 void pv_block(const bf16* pt, int64_t ldp, int64_t pair_step, const bf16* vcols, int64_t dvp,
                               int64_t pairs, const float* alpha, float* o, int64_t ldo) {
  __m512 acc[MR][NV];
  CABM_UNROLL
  for (int r = 0; r < MR; ++r) {
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = _mm512_loadu_ps(o + r * ldo + v * 16);
      if (alpha) acc[r][v] = _mm512_mul_ps(acc[r][v], _mm512_set1_ps(alpha[r]));
    }
  }
  for (int64_t t = 0; t < pairs; ++t) {
    __m512i b[NV];
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_si512(vcols + t * dvp * 2 + v * 32);
    CABM_UNROLL
    for (int r = 0; r < MR; ++r) {
      const __m512i a = broadcast_pair(pt + r * ldp + t * pair_step);
      CABM_UNROLL
      for (int v = 0; v < NV; ++v) acc[r][v] = dot2(acc[r][v], a, b[v]);
    }
  }
  CABM_UNROLL
  for (int r = 0; r < MR; ++r) {
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(o + r * ldo + v * 16, acc[r][v]);
  }
}

// O = alpha ∘ O + P·V over the key pairs [j0, j0 + nk2) (O += P·V where alpha is null): 6 rows ×
// 4 column vectors per call.
// Pair t of A's row r is at pt + r·ldp + t·pair_step (row-major P: pair_step 2; an operand packed
// as pairs of rows, read transposed: ldp 2 and pair_step twice its padded width).
CABM_AVX512_BF16 inline void pv_avx512(const bf16* pt, int64_t ldp, int64_t ni, const bf16* vp, int64_t j0, int64_t nk2,
                                       int64_t dvp, const float* alpha, float* o, int64_t ldo, int64_t pair_step = 2) {
  constexpr int kRows = 6, kCols = 4;
  const bf16* vb = vp + packed_v_index(j0, 0, dvp);
  const int64_t pairs = nk2 / 2, nvec = dvp / 16;
  for (int64_t r = 0; r < ni; r += kRows) {
    const int64_t mr = std::min<int64_t>(kRows, ni - r);
    for (int64_t v = 0; v < nvec; v += kCols) {
      const int64_t nv = std::min<int64_t>(kCols, nvec - v);
      with_rows<kRows>(mr, [&]<int R>() CABM_AVX512_BF16 {
        with_rows<kCols>(nv, [&]<int V>() CABM_AVX512_BF16 {
          pv_block<R, V>(pt + r * ldp, ldp, pair_step, vb + v * 32, dvp, pairs, alpha ? alpha + r : nullptr,
                         o + r * ldo + v * 16, ldo);
        });
      });
    }
  }
}

// t[i] = column i of the 16 × 16 matrix of 32-bit elements whose rows t held.
CABM_AVX512_BF16 inline void transpose_16x16_epi32(__m512i (&t)[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane j: rows i, i+1 of columns 4j…4j+3, interleaved
    a[i] = _mm512_unpacklo_epi32(t[i], t[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(t[i], t[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // b[i + k], lane j: rows i…i+3 of column 4j + k
    b[i] = _mm512_unpacklo_epi64(a[i], a[i + 2]);
    b[i + 1] = _mm512_unpackhi_epi64(a[i], a[i + 2]);
    b[i + 2] = _mm512_unpacklo_epi64(a[i + 1], a[i + 3]);
    b[i + 3] = _mm512_unpackhi_epi64(a[i + 1], a[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {  // column 4j + k gathers lane j of b[k], b[4 + k], b[8 + k], b[12 + k]
    const __m512i lo01 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0x88), hi01 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0xdd);
    const __m512i lo23 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0x88),
                  hi23 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0xdd);
    t[k] = _mm512_shuffle_i32x4(lo01, lo23, 0x88);
    t[4 + k] = _mm512_shuffle_i32x4(hi01, hi23, 0x88);
    t[8 + k] = _mm512_shuffle_i32x4(lo01, lo23, 0xdd);
    t[12 + k] = _mm512_shuffle_i32x4(hi01, hi23, 0xdd);
  }
}

// pack_row_blocks (attention/bf16_packing.h) with the same result, 16 rows × 16 column pairs at a
// time: each pair is a 32-bit element, so a 16-key block of pairs is the transpose of a 16 × 16
// matrix of 32-bit elements (four rounds of unpack/shuffle instead of 256 scalar moves). Rows past
// n and columns past cols load as zero (masked loads, which do not touch memory they mask off).
CABM_AVX512_BF16 inline void pack_row_blocks_avx512(const bf16* src, int64_t stride, int64_t n, int64_t cols,
                                                    int64_t n16, int64_t cols2, bf16* out) {
  const int64_t pairs = cols2 / 2;
  for (int64_t r0 = 0; r0 < n16; r0 += kPackedKeyBlock) {
    bf16* block = out + (r0 / kPackedKeyBlock) * pairs * kPackedKeyBlock * 2;
    for (int64_t c0 = 0; c0 < pairs; c0 += 16) {
      const int64_t live = std::clamp<int64_t>(cols - 2 * c0, 0, 32);  // elements of the 16 pairs in the row
      const __mmask32 mask = live == 32 ? ~__mmask32{0} : (__mmask32{1} << live) - 1;
      __m512i t[16];
      for (int i = 0; i < 16; ++i)
        t[i] = r0 + i < n ? _mm512_maskz_loadu_epi16(mask, src + (r0 + i) * stride + 2 * c0) : _mm512_setzero_si512();
      transpose_16x16_epi32(t);
      const int64_t np = std::min<int64_t>(16, pairs - c0);
      for (int64_t c = 0; c < np; ++c) _mm512_storeu_si512(block + (c0 + c) * kPackedKeyBlock * 2, t[c]);
    }
  }
}

// 2^x for the softmax weights P, which are rounded to bf16 right after: the degree-4 polynomial
// of exp2_poly.h, simd.h's AVX-512 exp2_weights written again with intrinsics (that header picks
// its instruction set at compile time, and this code is compiled for AVX-512 by attribute only):
// the same operations, the same bits as detail::exp2_weight. For x <= 0 (−inf → 0).
CABM_AVX512_BF16 inline __m512 exp2_weights(__m512 x) {
  // No clamp first: the lanes a clamp would change (below −127, −inf) are masked to 0 below.
  // f = x − floor(x) by vreduceps; vscalefps scales by 2^floor(x) itself (as simd.h's exp2_by).
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 y = _mm512_set1_ps(kExp2PPoly[0]);
  for (int c = 1; c < kExp2PDegree; ++c) y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(kExp2PPoly[c]));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExp2Min), _CMP_GE_OQ);
  return _mm512_maskz_scalef_ps(live, y, x);
}

// Weights to bf16: 32 at once, lo's in the low half (bf16_pair; store_bf16x32 stores them), or 16
// (store_bf16x16). One vcvtne2ps2bf16 costs 4 slots of the vector pipes for 32 weights where two
// vcvtneps2bf16 cost 6 (Intel Xeon, session 33: each op timed beside a loop of FMAs); the same
// rounding, the same bits.
CABM_AVX512_BF16 inline __m512i bf16_pair(__m512 lo, __m512 hi) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}
CABM_AVX512_BF16 inline void store_bf16x32(bf16* dst, __m512 lo, __m512 hi) {
  _mm512_storeu_si512(dst, bf16_pair(lo, hi));
}
CABM_AVX512_BF16 inline void store_bf16x16(bf16* dst, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
}

// The row pass's two uses of 16 scores s (mask16: the tile's mask at those scores, or null).
// The running maximum is of x = s·qscale + mask. Without a mask and with qscale >= 0 ("raw"), it
// runs over s itself and the row's maximum is multiplied once: rounding is monotone, so
// round(max s · qscale) is exactly max round(s·qscale). The exponent x − m' is then one FMA,
// s·qscale − m' (s·qscale not rounded first); with a mask, (s·qscale + mask) − m'.
CABM_AVX512_BF16 inline bool raw_row_max(const float* mask, float qscale) {
  return !mask && qscale >= 0.0f;
}
CABM_AVX512_BF16 inline __m512 max_operand(__m512 s, const float* mask16, __m512 qs, bool raw) {
  if (raw) return s;
  return mask16 ? _mm512_fmadd_ps(s, qs, _mm512_loadu_ps(mask16)) : _mm512_mul_ps(s, qs);
}
CABM_AVX512_BF16 inline float row_max(__m512 vmax, float qscale, bool raw) {
  const float v = _mm512_reduce_max_ps(vmax);
  return raw ? v * qscale : v;
}
CABM_AVX512_BF16 inline __m512 exponent(__m512 s, const float* mask16, __m512 qs, __m512 mv) {
  return mask16 ? _mm512_sub_ps(_mm512_fmadd_ps(s, qs, _mm512_loadu_ps(mask16)), mv) : _mm512_fmsub_ps(s, qs, mv);
}
// The end of a row's pass: alpha = exp2(m − m'), l = alpha·l + Σ P, m = m'.
CABM_AVX512_BF16 inline void finish_row(float m_new, __m512 vsum, float& m, float& l, float& alpha) {
  alpha = m_new == m ? 1.0f : std::exp2(m - m_new);  // the call is skipped once the maximum settles
  l = std::fma(l, alpha, _mm512_reduce_add_ps(vsum));
  m = m_new;
}

// The lanes' maximum of x over one row of nk16 scores (mrow: the row's mask, or null), in four
// chains (exact, so in any order): with one, the pass waited on vmaxps's latency.
CABM_AVX512_BF16 inline __m512 row_max_lanes(const float* x, const float* mrow, int64_t nk16, __m512 qs, bool raw) {
  const auto mask16 = [&](int64_t c) { return mrow ? mrow + c : nullptr; };
  __m512 vmax[4];
  for (__m512& v : vmax) v = _mm512_set1_ps(-INFINITY);
  int64_t c = 0;
  for (; c + 64 <= nk16; c += 64)
    for (int u = 0; u < 4; ++u)
      vmax[u] = _mm512_max_ps(vmax[u], max_operand(_mm512_loadu_ps(x + c + 16 * u), mask16(c + 16 * u), qs, raw));
  for (; c < nk16; c += 16) vmax[0] = _mm512_max_ps(vmax[0], max_operand(_mm512_loadu_ps(x + c), mask16(c), qs, raw));
  return _mm512_max_ps(_mm512_max_ps(vmax[0], vmax[1]), _mm512_max_ps(vmax[2], vmax[3]));
}

// The row pass of the online softmax over one tile: m' = max(m, max x) (x = s·qscale + mask),
// P = exp2(x − m') summed into l = α·l + Σ P (α = exp2(m − m')), then P·z with dropout (z: the
// tile's dropout factors, or null) and P rounded to bf16 into p [0, nk16). P is never subnormal
// (exp2_weights, z >= 1), so vcvtneps2bf16 rounds it exactly as float_to_bf16 does.
// The FMAs are explicit here and in scores_softmax_block (and the AMX softmax): written as
// a·b + c, GCC contracts them or not depending on the inlined code around them, and the fused
// and separate passes could round differently. x is not stored between the max and the weights
// but read again. Row after row, with the next row's maximum taken inside this row's loop of
// weights: its loads and vmaxps take the pipes the exponentials leave idle, and the next row's
// weights no longer wait for a separate pass over it (one Zen 4 core, 64 × 768 tile at d 64, no
// mask: 9.2 → 7.8 µs; 64 × 128: 2.1 → 2.0). Running several rows' phases together, as
// scores_softmax_block does, made this pass 13-39% slower per 128-key tile on Zen 5 (its rows
// come from memory, not registers). The raw maximum, the one-FMA exponent and the degree-4
// exponential took a 32 × 768 tile's pass from 5.8 to 4.95 µs on one Zen 4 core (7.0 to 6.2 with
// a mask): 16 to 12 vector operations per 16 weights without a mask.
// softmax_rows_avx512 runs one instance of this per kind of tile (mask or none, dropout or none,
// raw maximum or not), so that the loops test nothing but their counters: compiled once for all
// kinds, the loop of weights kept the tests and took four jumps per 16 weights. On one Intel Xeon
// core (session 29, in cache) a 32 × 768 tile's pass went from 9.9 to 9.3 cycles per 16 weights.
template <bool kMask, bool kDropout, bool kRaw>
CABM_AVX512_BF16 void softmax_rows_of_kind(const float* s, int64_t lds, int64_t ni, int64_t nk16, const float* mask_in,
                                           const float* z_in, float qscale, bf16* p, int64_t ldp, float* m, float* l,
                                           float* alpha) {
  const float* const mask = kMask ? mask_in : nullptr;
  const float* const z = kDropout ? z_in : nullptr;
  constexpr bool raw = kRaw;
  const __m512 qs = _mm512_set1_ps(qscale);
  const auto mask_row = [&](int64_t r) { return mask ? mask + r * lds : nullptr; };
  __m512 lanes_max = row_max_lanes(s, mask_row(0), nk16, qs, raw);
  for (int64_t r = 0; r < ni; ++r) {
    const float* x = s + r * lds;
    const float* mrow = mask_row(r);
    const float m_new = std::max(m[r], row_max(lanes_max, qscale, raw));
    const __m512 mv = _mm512_set1_ps(m_new);
    __m512 vsum = _mm512_setzero_ps();
    bf16* prow = p + r * ldp;
    // P's 16 weights at key c (Σ before dropout), converted to bf16 in pairs of vectors. Called
    // from three places, GCC left it out of line (13% slower) unless told.
    const auto weights = [&](int64_t c) CABM_AVX512_BF16 __attribute__((always_inline)) {
      __m512 e = exp2_weights(exponent(_mm512_loadu_ps(x + c), mrow ? mrow + c : nullptr, qs, mv));
      vsum = _mm512_add_ps(vsum, e);
      if (z) e = _mm512_mul_ps(e, _mm512_loadu_ps(z + r * lds + c));
      return e;
    };
    const int64_t pairs_end = nk16 / 32 * 32;
    if (r + 1 < ni) {
      const float *xn = x + lds, *mn = mask_row(r + 1);
      // The next row's maximum in two chains, written out (a lambda, GCC called out of line).
      __m512 next0 = _mm512_set1_ps(-INFINITY), next1 = next0;
      for (int64_t c = 0; c < pairs_end; c += 32) {
        const __m512 e0 = weights(c);
        next0 = _mm512_max_ps(next0, max_operand(_mm512_loadu_ps(xn + c), mn ? mn + c : nullptr, qs, raw));
        const __m512 e1 = weights(c + 16);
        next1 = _mm512_max_ps(next1, max_operand(_mm512_loadu_ps(xn + c + 16), mn ? mn + c + 16 : nullptr, qs, raw));
        store_bf16x32(prow + c, e0, e1);
      }
      if (pairs_end < nk16) {
        store_bf16x16(prow + pairs_end, weights(pairs_end));
        next0 =
            _mm512_max_ps(next0, max_operand(_mm512_loadu_ps(xn + pairs_end), mn ? mn + pairs_end : nullptr, qs, raw));
      }
      lanes_max = _mm512_max_ps(next0, next1);
    } else {
      for (int64_t c = 0; c < pairs_end; c += 32) {
        const __m512 e0 = weights(c);
        store_bf16x32(prow + c, e0, weights(c + 16));
      }
      if (pairs_end < nk16) store_bf16x16(prow + pairs_end, weights(pairs_end));
    }
    finish_row(m_new, vsum, m[r], l[r], alpha[r]);
  }
}

CABM_AVX512_BF16 inline void softmax_rows_avx512(const float* s, int64_t lds, int64_t ni, int64_t nk16,
                                                 const float* mask, const float* z, float qscale, bf16* p, int64_t ldp,
                                                 float* m, float* l, float* alpha) {
  if (ni <= 0) return;
  const auto run = [&]<bool kMask, bool kRaw>() CABM_AVX512_BF16 {
    if (z)
      softmax_rows_of_kind<kMask, true, kRaw>(s, lds, ni, nk16, mask, z, qscale, p, ldp, m, l, alpha);
    else
      softmax_rows_of_kind<kMask, false, kRaw>(s, lds, ni, nk16, mask, z, qscale, p, ldp, m, l, alpha);
  };
  if (mask)
    run.template operator()<true, false>();
  else if (raw_row_max(mask, qscale))
    run.template operator()<false, true>();
  else
    run.template operator()<false, false>();
}

// S = Q·Kᵀ and the row pass of the online softmax in one step for a tile of at most
// kFusedKeyBlocks·16 keys: MR rows' whole score rows stay in the accumulators, and the same
// operations as scores_avx512 followed by softmax_rows_avx512 (same order, same bits) run on them
// without storing S. mask, z: the tile's rows at stride lds (null: none).
inline constexpr int kFusedKeyBlocks = 6;

template <int MR, int NV, bool kMask, bool kDropout>
CABM_AVX512_BF16 void scores_softmax_block(const bf16* qp, int64_t dp, const bf16* kblock, const float* mask,
                                           const float* z, int64_t lds, float qscale, bf16* p, int64_t ldp, float* m,
                                           float* l, float* alpha) {
  __m512 acc[MR][NV];
  scores_accumulate(qp, dp, kblock, acc);
  const __m512 qs = _mm512_set1_ps(qscale);
  const bool raw = raw_row_max(kMask ? mask : nullptr, qscale);
  // Each phase runs over all MR rows before the next starts, so the rows' horizontal maxima,
  // exponentials and sums are independent chains the core overlaps (row after row, each row's
  // reduction latency was exposed). The operations on each element and their order within a
  // row are softmax_rows_avx512's (with a mask, x replaces the scores in acc: same bits).
  float m_new[MR];
  CABM_UNROLL
  for (int r = 0; r < MR; ++r) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) {
      if constexpr (kMask) {
        acc[r][v] = _mm512_fmadd_ps(acc[r][v], qs, _mm512_loadu_ps(mask + r * lds + v * 16));
        vmax = _mm512_max_ps(vmax, acc[r][v]);
      } else {
        vmax = _mm512_max_ps(vmax, max_operand(acc[r][v], nullptr, qs, raw));
      }
    }
    m_new[r] = std::max(m[r], row_max(vmax, qscale, raw));
  }
  __m512 vsum[MR];
  CABM_UNROLL
  for (int r = 0; r < MR; ++r) {
    const __m512 mv = _mm512_set1_ps(m_new[r]);
    vsum[r] = _mm512_setzero_ps();
    __m512 e_even = _mm512_setzero_ps();  // converted in pairs of vectors (store_bf16x32)
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) {
      __m512 e = exp2_weights(kMask ? _mm512_sub_ps(acc[r][v], mv) : exponent(acc[r][v], nullptr, qs, mv));
      vsum[r] = _mm512_add_ps(vsum[r], e);
      if constexpr (kDropout) e = _mm512_mul_ps(e, _mm512_loadu_ps(z + r * lds + v * 16));
      if (v % 2 == 1)
        store_bf16x32(p + r * ldp + (v - 1) * 16, e_even, e);
      else if (v + 1 < NV)
        e_even = e;
      else
        store_bf16x16(p + r * ldp + v * 16, e);
    }
  }
  CABM_UNROLL
  for (int r = 0; r < MR; ++r) finish_row(m_new[r], vsum[r], m[r], l[r], alpha[r]);
}

// The fused step over a tile of ni rows and nk16 <= kFusedKeyBlocks·16 keys, 4 rows at a time.
CABM_AVX512_BF16 inline void scores_softmax_avx512(const bf16* qp, int64_t ni, const bf16* kp, int64_t j0, int64_t nk16,
                                                   int64_t dp, const float* mask, const float* z, int64_t lds,
                                                   float qscale, bf16* p, int64_t ldp, float* m, float* l,
                                                   float* alpha) {
  constexpr int kRows = 4;
  const bf16* kb = kp + (j0 / kPackedKeyBlock) * (dp / 2) * kPackedKeyBlock * 2;
  const int64_t nb = nk16 / kPackedKeyBlock;
  for (int64_t r = 0; r < ni; r += kRows) {
    const int64_t mr = std::min<int64_t>(kRows, ni - r);
    const float* mr_mask = mask ? mask + r * lds : nullptr;
    const float* mr_z = z ? z + r * lds : nullptr;
    with_rows<kRows>(mr, [&]<int R>() CABM_AVX512_BF16 {
      with_rows<kFusedKeyBlocks>(nb, [&]<int V>() CABM_AVX512_BF16 {
        auto block = mask ? (z ? scores_softmax_block<R, V, true, true> : scores_softmax_block<R, V, true, false>)
                          : (z ? scores_softmax_block<R, V, false, true> : scores_softmax_block<R, V, false, false>);
        block(qp + r * dp, dp, kb, mr_mask, mr_z, lds, qscale, p + r * ldp, ldp, m + r, l + r, alpha + r);
      });
    });
  }
}

#pragma GCC diagnostic pop
#endif

}  // namespace cabm::detail
