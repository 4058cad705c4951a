// SIMD vectors for the kernels with per-instruction-set variants (the attention family in
// attention/, GELU, LayerNorm): one small value type `Vec` of kWidth floats and the handful of
// operations they need, implemented three times:
//   __AVX512F__          16 lanes, zmm intrinsics
//   __AVX2__ && __FMA__   8 lanes, ymm intrinsics (what -march=native gives on Zen 2/3)
//   otherwise             8 lanes as a plain float array; loops the compiler may auto-vectorise
// Internal to kernels/: included by those kernels' bodies and their tests.
#pragma once

#include "cabm/kernels/exp2_poly.h"

#include <cmath>
#include <cstdint>
#include <cstring>

// CABM_SIMD_LEVEL chooses the flavour explicitly (2 avx512, 1 avx2, 0 portable) for code compiled
// for one instruction set inside a `#pragma GCC target` region (attention/decode_body.h: GCC does
// not define __AVX512F__ there), with CABM_SIMD_NS naming its namespace, one per flavour, so that
// the inline functions of two flavours never merge at link time. Otherwise the build's flags
// choose, in namespace cabm::simd.
#if !defined(CABM_SIMD_LEVEL)
#if defined(__AVX512F__)
#define CABM_SIMD_LEVEL 2
#elif defined(__AVX2__) && defined(__FMA__)
#define CABM_SIMD_LEVEL 1
#else
#define CABM_SIMD_LEVEL 0
#endif
#endif
#if !defined(CABM_SIMD_NS)
#define CABM_SIMD_NS simd
#endif

#if CABM_SIMD_LEVEL > 0
#include "cabm/kernels/x86_intrinsics.h"
#endif

namespace cabm::CABM_SIMD_NS {

// exp2(x) = 2^n · 2^f with n = floor(x), f = x − n ∈ [0, 1); 2^f by a polynomial of exp2_poly.h
// (exp2_nonpositive: relative error < 1e-7; exp2_weights: the bf16 kernels' weights, below the
// flavours). For x <= 0, the only arguments
// the kernels need (scores minus their running maximum); small positive x still work (up to 127),
// and callers that cannot rule out larger ones clamp first (simd::min(x, 0)). Everything below
// 2^−126 (−inf included) gives exactly 0, so masked scores contribute nothing.
using detail::kExp2Min;
using detail::kExp2Poly;

// tanh(x), for soft-capping (attention/score_variants.h): built on the primitives below, so it is
// written once after the three flavours. See there for the method and its accuracy.

// round_to_bf16(x): x rounded to the nearest bf16 value, ties to even, kept in fp32 (the low 16
// bits cleared): bit for bit bf16_to_float(float_to_bf16(x)) of cabm/core/dtype.h, NaN included (a quiet
// NaN with the upper payload). Integer form: (u + 0x7fff + lsb) & 0xffff0000, lsb = bit 16 of u.

#if CABM_SIMD_LEVEL == 2

inline constexpr int kWidth = 16;
inline constexpr const char* kIsa = "avx512";
struct Vec {
  __m512 v;
};
inline Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void store(float* p, Vec a) { _mm512_storeu_ps(p, a.v); }
inline Vec broadcast(const float* p) { return {_mm512_set1_ps(*p)}; }
inline Vec set1(float x) { return {_mm512_set1_ps(x)}; }
inline Vec zero() { return {_mm512_setzero_ps()}; }
inline Vec fma(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline Vec add(Vec a, Vec b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vec sub(Vec a, Vec b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vec mul(Vec a, Vec b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vec max(Vec a, Vec b) { return {_mm512_max_ps(a.v, b.v)}; }
inline Vec min(Vec a, Vec b) { return {_mm512_min_ps(a.v, b.v)}; }
inline bool any_greater(Vec a, Vec b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ) != 0; }
inline bool all_equal(Vec a, Vec b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_EQ_OQ) == 0xFFFF; }
inline Vec div(Vec a, Vec b) { return {_mm512_div_ps(a.v, b.v)}; }
inline Vec abs(Vec a) { return {_mm512_abs_ps(a.v)}; }
// !(a >= b) ? x : y, lane by lane: x where a < b or either is NaN.
inline Vec select_below(Vec a, Vec b, Vec x, Vec y) {
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, b.v, _CMP_NGE_UQ), y.v, x.v)};
}
// |magnitude| with the sign of sign.
inline Vec copy_sign(Vec magnitude, Vec sign) {
  const __m512i m = _mm512_set1_epi32(0x7fffffff);
  return {_mm512_castsi512_ps(_mm512_ternarylogic_epi32(m, _mm512_castps_si512(magnitude.v),
                                                         _mm512_castps_si512(sign.v), 0xca))};
}

// No clamp before the polynomial: the lanes it would change (below −127, −inf) are the ones the
// final mask sets to 0 anyway. f = x − floor(x) comes from one vreduceps and vscalefps
// multiplies by 2^floor(x) itself, so n is never formed. (Intel Xeon, one core: 16 exponentials
// took 5.16 TSC cycles with vrndscaleps and a subtraction for f, 4.61 with vreduceps and a
// subtraction for n, session 30; without that subtraction the bf16 row pass of a 32 × 768 tile at
// d 64, bench_amx_tile's "rest", went from 4.44–4.48 to 4.22–4.27 µs, session 32.)
// vreduceps rounds x − floor(x) down where it is inexact (x in (−½, 0) with bits below 2^−24,
// 2^−24 at most, which adds up to 4e-8 to the relative error), so f is that rounding for every
// Degree; the other flavours reproduce it where asked (kFloorDown).
template <int Degree, bool kFloorDown>
inline Vec exp2_by(Vec x, const float (&poly)[Degree]) {
  const __m512 f = _mm512_reduce_ps(x.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(poly[0]);
  for (int c = 1; c < Degree; ++c) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(poly[c]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __mmask16 live = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(kExp2Min), _CMP_GE_OQ);
  return {_mm512_maskz_scalef_ps(live, p, x.v)};
}

// kWidth bf16 values (their bits) widened to fp32: the bits moved to the upper half, exactly.
inline Vec load_bf16(const uint16_t* p) {
  return {_mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16))};
}
// Lane l of the result = the sum of a[l]'s lanes: kWidth horizontal sums for the price of about
// three instructions each. A tree over 256-, 128-, 64- and 32-bit halves; it sums input slot
// s into lane 4·(s mod 4) + s/4, so a[] goes in with that index transposed.
inline Vec sum_each(const Vec (&a)[kWidth]) {
  __m512 b[8], c[4], e[2];
  auto in = [&](int s) { return a[(s % 4) * 4 + s / 4].v; };
  for (int i = 0; i < 8; ++i) {
    const __m512 x = in(2 * i), y = in(2 * i + 1);
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xee));
  }
  for (int i = 0; i < 4; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xdd));
  for (int i = 0; i < 2; ++i)
    e[i] =
        _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44), _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xee));
  return {_mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], 0x88), _mm512_shuffle_ps(e[0], e[1], 0xdd))};
}

inline Vec round_to_bf16(Vec x) {
  const __m512i u = _mm512_castps_si512(x.v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), high);
  const __m512i quiet = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), high);
  const __mmask16 nan = _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q);
  return {_mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, rounded, quiet))};
}

#elif CABM_SIMD_LEVEL == 1

inline constexpr int kWidth = 8;
inline constexpr const char* kIsa = "avx2";
struct Vec {
  __m256 v;
};
inline Vec load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline void store(float* p, Vec a) { _mm256_storeu_ps(p, a.v); }
inline Vec broadcast(const float* p) { return {_mm256_broadcast_ss(p)}; }
inline Vec set1(float x) { return {_mm256_set1_ps(x)}; }
inline Vec zero() { return {_mm256_setzero_ps()}; }
inline Vec fma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline Vec add(Vec a, Vec b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vec sub(Vec a, Vec b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vec mul(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vec max(Vec a, Vec b) { return {_mm256_max_ps(a.v, b.v)}; }
inline Vec min(Vec a, Vec b) { return {_mm256_min_ps(a.v, b.v)}; }
inline bool any_greater(Vec a, Vec b) { return _mm256_movemask_ps(_mm256_cmp_ps(a.v, b.v, _CMP_GT_OQ)) != 0; }
inline bool all_equal(Vec a, Vec b) { return _mm256_movemask_ps(_mm256_cmp_ps(a.v, b.v, _CMP_EQ_OQ)) == 0xFF; }
inline Vec div(Vec a, Vec b) { return {_mm256_div_ps(a.v, b.v)}; }
inline Vec abs(Vec a) { return {_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v)}; }
inline Vec select_below(Vec a, Vec b, Vec x, Vec y) {
  return {_mm256_blendv_ps(y.v, x.v, _mm256_cmp_ps(a.v, b.v, _CMP_NGE_UQ))};
}
inline Vec copy_sign(Vec magnitude, Vec sign) {
  const __m256 s = _mm256_set1_ps(-0.0f);
  return {_mm256_or_ps(_mm256_andnot_ps(s, magnitude.v), _mm256_and_ps(s, sign.v))};
}

// No clamp before the polynomial (as the AVX-512 flavour): lanes below −126 are masked to 0.
// kFloorDown: f rounded down as AVX-512's vreduceps rounds it (the bf16 weights, which every path
// computes bit for bit alike): f + n is exact but where f was rounded, and above x where it went
// up; one float down then (adding −1, the compare's all-ones, to the bits of a positive f).
template <int Degree, bool kFloorDown>
inline Vec exp2_by(Vec x, const float (&poly)[Degree]) {
  const __m256 n = _mm256_round_ps(x.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m256 f = _mm256_sub_ps(x.v, n);
  if constexpr (kFloorDown) {
    const __m256 up = _mm256_cmp_ps(_mm256_add_ps(f, n), x.v, _CMP_GT_OQ);
    f = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(f), _mm256_castps_si256(up)));
  }
  __m256 p = _mm256_set1_ps(poly[0]);
  for (int c = 1; c < Degree; ++c) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(poly[c]));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  // p · 2^n by adding n to the exponent field; valid for n >= −126, the rest is masked to 0.
  const __m256i bits = _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23));
  const __m256 live = _mm256_cmp_ps(x.v, _mm256_set1_ps(kExp2Min), _CMP_GE_OQ);
  return {_mm256_and_ps(_mm256_castsi256_ps(bits), live)};
}

inline Vec load_bf16(const uint16_t* p) {
  return {_mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16))};
}
// A tree over 128-bit halves, then two horizontal adds; it sums slot s into lane 4·(s mod 2) + s/2.
inline Vec sum_each(const Vec (&a)[kWidth]) {
  __m256 b[4], c[2];
  auto in = [&](int s) { return a[4 * (s % 2) + s / 2].v; };
  for (int i = 0; i < 4; ++i) {
    const __m256 x = in(2 * i), y = in(2 * i + 1);
    b[i] = _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
  }
  for (int i = 0; i < 2; ++i) c[i] = _mm256_hadd_ps(b[2 * i], b[2 * i + 1]);
  return {_mm256_hadd_ps(c[0], c[1])};
}

inline Vec round_to_bf16(Vec x) {
  const __m256i u = _mm256_castps_si256(x.v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), high);
  const __m256i quiet = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), high);
  const __m256 nan = _mm256_cmp_ps(x.v, x.v, _CMP_UNORD_Q);
  return {_mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan)};
}

#else

inline constexpr int kWidth = 8;
inline constexpr const char* kIsa = "portable";
struct Vec {
  float v[kWidth];
};
inline Vec load(const float* p) {
  Vec r;
  for (int l = 0; l < kWidth; ++l) r.v[l] = p[l];
  return r;
}
inline void store(float* p, Vec a) {
  for (int l = 0; l < kWidth; ++l) p[l] = a.v[l];
}
inline Vec set1(float x) {
  Vec r;
  for (int l = 0; l < kWidth; ++l) r.v[l] = x;
  return r;
}
inline Vec broadcast(const float* p) { return set1(*p); }
inline Vec zero() { return set1(0.0f); }
#define CABM_SIMD_LANEWISE(name, expr)   \
  inline Vec name(Vec a, Vec b) {        \
    Vec r;                               \
    for (int l = 0; l < kWidth; ++l) {   \
      const float x = a.v[l], y = b.v[l]; \
      r.v[l] = (expr);                   \
    }                                    \
    return r;                            \
  }
CABM_SIMD_LANEWISE(add, x + y)
CABM_SIMD_LANEWISE(sub, x - y)
CABM_SIMD_LANEWISE(mul, x * y)
CABM_SIMD_LANEWISE(max, x > y ? x : y)
CABM_SIMD_LANEWISE(min, x < y ? x : y)
CABM_SIMD_LANEWISE(div, x / y)
CABM_SIMD_LANEWISE(copy_sign, std::copysign(x, y))
#undef CABM_SIMD_LANEWISE
// One rounding where the build's target has an FMA instruction, two where it has none (the
// portable regions compile with contraction off, simd_set_portable_begin.h, so the choice is this
// line's and never the optimiser's, and equal sums stay equal across the kernels' instantiations).
inline Vec fma(Vec a, Vec b, Vec c) {
  Vec r;
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  for (int l = 0; l < kWidth; ++l) r.v[l] = __builtin_fmaf(a.v[l], b.v[l], c.v[l]);
#else
  for (int l = 0; l < kWidth; ++l) r.v[l] = a.v[l] * b.v[l] + c.v[l];
#endif
  return r;
}
inline bool any_greater(Vec a, Vec b) {
  bool any = false;
  for (int l = 0; l < kWidth; ++l) any |= a.v[l] > b.v[l];
  return any;
}
inline Vec abs(Vec a) {
  Vec r;
  for (int l = 0; l < kWidth; ++l) r.v[l] = std::fabs(a.v[l]);
  return r;
}
inline Vec select_below(Vec a, Vec b, Vec x, Vec y) {
  Vec r;
  for (int l = 0; l < kWidth; ++l) r.v[l] = !(a.v[l] >= b.v[l]) ? x.v[l] : y.v[l];
  return r;
}
inline bool all_equal(Vec a, Vec b) {
  bool all = true;
  for (int l = 0; l < kWidth; ++l) all &= a.v[l] == b.v[l];
  return all;
}
template <int Degree, bool kFloorDown>
inline Vec exp2_by(Vec x, const float (&poly)[Degree]) {
  Vec r;
  for (int l = 0; l < kWidth; ++l) {
    // NaN takes the clamp too (the comparison is false): converting a NaN n to int32 is undefined
    // behaviour, and the lane is masked to 0 below anyway (tanh of NaN reaches here).
    const float xc = x.v[l] >= -127.0f ? x.v[l] : -127.0f;
    // floor: round to nearest by the 1.5·2^23 trick (exact for |x| < 2^22), one less where that
    // went up; vectorises without SSE4.1.
    const float near = (xc + 12582912.0f) - 12582912.0f;
    const float n = near > xc ? near - 1.0f : near;
    float f = xc - n;
    if (kFloorDown && f + n > xc) {  // as the AVX2 flavour
      int32_t fb;
      std::memcpy(&fb, &f, sizeof fb);
      --fb;
      std::memcpy(&f, &fb, sizeof fb);
    }
    float p = poly[0];
    for (int c = 1; c < Degree; ++c) p = p * f + poly[c];
    p = p * f + 1.0f;
    int32_t bits;
    std::memcpy(&bits, &p, sizeof bits);
    bits += static_cast<int32_t>(n) * (1 << 23);
    float y;
    std::memcpy(&y, &bits, sizeof y);
    r.v[l] = x.v[l] >= kExp2Min ? y : 0.0f;
  }
  return r;
}

inline Vec load_bf16(const uint16_t* p) {
  Vec r;
  for (int l = 0; l < kWidth; ++l) {
    const uint32_t u = static_cast<uint32_t>(p[l]) << 16;
    std::memcpy(&r.v[l], &u, sizeof u);
  }
  return r;
}
inline Vec sum_each(const Vec (&a)[kWidth]) {
  Vec r;
  for (int l = 0; l < kWidth; ++l) {
    float sum = 0.0f;
    for (int m = 0; m < kWidth; ++m) sum += a[l].v[m];
    r.v[l] = sum;
  }
  return r;
}

inline Vec round_to_bf16(Vec x) {
  Vec r;
  for (int l = 0; l < kWidth; ++l) {
    uint32_t u;
    std::memcpy(&u, &x.v[l], sizeof u);
    u = x.v[l] != x.v[l] ? (u | 0x00400000u) & 0xffff0000u : (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&r.v[l], &u, sizeof u);
  }
  return r;
}

#endif

// exp2_by with the polynomial of exp2_poly.h: kExp2Poly for everything fp32 (exp2_nonpositive),
// kExp2PPoly for the weights P of the bf16 kernels, which round P to bf16 next (exp2_weights: the
// same operations as detail::exp2_weight and the avx512_bf16 paths' exp2_weights).
inline Vec exp2_nonpositive(Vec x) {
  return exp2_by<detail::kExp2Degree, false>(x, kExp2Poly);
}
inline Vec exp2_weights(Vec x) {
  return exp2_by<detail::kExp2PDegree, true>(x, detail::kExp2PPoly);
}

// tanh(x) in two pieces, as Cephes' tanhf, both accurate to a few float ulps relative (the test
// in test_attention_flash_variants.cpp measures it against std::tanh):
//  - |x| < 0.625: the odd polynomial x + x³·P(x²) of Cephes' tanhf (no cancellation near 0:
//    small scores keep their full relative accuracy; denormals and ±0 pass through unchanged);
//  - otherwise tanh|x| = (1 − e) / (1 + e), e = exp(−2|x|) = exp2(−2 log2(e) |x|) <= 0.29;
//    exp2_nonpositive never overflows and gives e = 0, hence exactly ±1, from |x| ≈ 44 on (inf
//    included); 1 − e rounds to 1 from |x| ≈ 9 on, where tanh does too.
// The sign of x is put back at the end (so tanh(−0) = −0); NaN takes the polynomial: NaN.
inline constexpr float kTanhPoly[5] = {-5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f, 1.33314422036e-1f,
                                       -3.33332819422e-1f};
inline constexpr float kTanhSmall = 0.625f;
inline Vec tanh(Vec x) {
  const Vec z = mul(x, x);
  Vec p = set1(kTanhPoly[0]);
  for (int c = 1; c < 5; ++c) p = fma(p, z, set1(kTanhPoly[c]));
  const Vec small = fma(mul(p, z), x, x);
  const Vec a = abs(x);
  const Vec e = exp2_nonpositive(mul(a, set1(-2.0f * 1.4426950408889634f)));
  const Vec one = set1(1.0f);
  const Vec large = div(sub(one, e), add(one, e));
  return copy_sign(select_below(a, set1(kTanhSmall), small, large), x);
}

// The sum and the maximum of a vector's lanes, in lane order (the same bits on every call).
inline float reduce_add(Vec a) {
  float lanes[kWidth];
  store(lanes, a);
  float sum = 0.0f;
  for (float x : lanes) sum += x;
  return sum;
}
inline float reduce_max(Vec a) {
  float lanes[kWidth];
  store(lanes, a);
  float m = lanes[0];
  for (float x : lanes) m = x > m ? x : m;
  return m;
}

// a · b + c rounded once, in every flavour and build (the portable `fma` above rounds twice where
// the build's target has no FMA instruction): for code whose accuracy rests on an exact product's
// low part (x² − fl(x²)) and that must give the same bits in all three flavours (activations_body.h).
#if CABM_SIMD_LEVEL > 0
inline Vec fma_exact(Vec a, Vec b, Vec c) {
  return fma(a, b, c);
}
#else
inline Vec fma_exact(Vec a, Vec b, Vec c) {
  Vec r;
  for (int l = 0; l < kWidth; ++l) r.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
  return r;
}
#endif

// x rounded to the nearest integer, ties to even (the default rounding mode), for |x| < 2^22
// (the portable flavour's 1.5·2^23 trick; the vector ones round any x).
#if CABM_SIMD_LEVEL == 2
inline Vec round_nearest(Vec x) {
  return {_mm512_roundscale_ps(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
#elif CABM_SIMD_LEVEL == 1
inline Vec round_nearest(Vec x) {
  return {_mm256_round_ps(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
#else
inline Vec round_nearest(Vec x) {
  Vec r;
  for (int l = 0; l < kWidth; ++l) r.v[l] = (x.v[l] + 12582912.0f) - 12582912.0f;
  return r;
}
#endif

// 2^n for integral n in [−126, 127] (a normal float: the exponent field n + 127, exactly).
#if CABM_SIMD_LEVEL == 2
inline Vec pow2_int(Vec n) {
  return {
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127)), 23))};
}
#elif CABM_SIMD_LEVEL == 1
inline Vec pow2_int(Vec n) {
  return {
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.v), _mm256_set1_epi32(127)), 23))};
}
#else
inline Vec pow2_int(Vec n) {
  Vec r;
  for (int l = 0; l < kWidth; ++l) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n.v[l]) + 127) << 23;
    std::memcpy(&r.v[l], &bits, sizeof bits);
  }
  return r;
}
#endif

// The first `count` (0 <= count <= kWidth) floats at p, the other lanes 0; and the first `count`
// lanes of a stored to p. A whole vector directly, a part through a stack copy: for the tail of a
// row, so that every element goes through the same vector code wherever a buffer ends.
inline Vec load_n(const float* p, int64_t count) {
  if (count == kWidth) return load(p);
  float lanes[kWidth] = {};
  std::memcpy(lanes, p, static_cast<size_t>(count) * sizeof(float));
  return load(lanes);
}
inline void store_n(float* p, Vec a, int64_t count) {
  if (count == kWidth) {
    store(p, a);
    return;
  }
  float lanes[kWidth];
  store(lanes, a);
  std::memcpy(p, lanes, static_cast<size_t>(count) * sizeof(float));
}

}  // namespace cabm::CABM_SIMD_NS
