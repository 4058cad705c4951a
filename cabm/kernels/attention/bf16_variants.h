// The score variants of attention/reference.h (soft-capping, ALiBi) for the tiled bf16 forwards
// (internal to cabm/kernels/: included by attention/flash_bf16.cpp and attention/flash_amx.cpp; the
// portable backward, attention/flash_bf16_portable_backward.cpp, computes the same scores element
// by element, with the cap's derivative).
//
// A tile's products leave raw dot products q·k in s. Without variants the row pass scales them
// to base 2 itself (s·scale·log2 e + mask). With variants a pass over the tile first makes each
// score the base-2 logit without its mask parts, in the reference's order (RowScores):
//   t = scale · q·k,   t → c·tanh(t / c) (c > 0),   t −= slope_h·|qpos_i − kpos_j|,   s = log2(e)·t
// and the row pass then runs with scale 1 (an exact multiplication) and adds the mask as before:
// additive biases after soft-capping and ALiBi, as the reference adds them. Positions are read per
// tile (kpos for the tile's keys, qpos per row): never an N×M tensor. Grouped-query attention
// needs nothing here: the forwards pack K and V per key/value head and index everything else by the
// query head.
//
// The portable pass uses std::tanh (as the reference); the AVX-512 pass a vector tanh accurate to
// 2 ulp relative (Cephes tanhf) and q·k·(scale/c) for t/c, so the paths differ by a few fp32 ulps
// of the capped score.
#pragma once

#include "cabm/kernels/attention/reference.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>

#if defined(__x86_64__)
#include "cabm/kernels/x86_intrinsics.h"
#define CABM_HAVE_AVX512_VARIANTS 1
#define CABM_AVX512_VARIANTS __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#endif

namespace cabm::detail {

class ScoreVariants {
 public:
  // N query rows, M keys, d the head dim (for the default scale).
  ScoreVariants(const AttentionOptions& options, int64_t N, int64_t M, int64_t d)
      : options_(options), N_(N), M_(M), scale_(attention_scale(options, d)), cap_(options.softcap) {}

  bool active() const { return cap_ > 0.0f || alibi(); }
  bool alibi() const { return !options_.alibi_slopes.empty(); }
  float scale() const { return scale_; }
  float cap() const { return cap_; }
  float slope(int64_t h) const { return alibi() ? options_.alibi_slopes[h] : 0.0f; }
  int64_t query_position(int64_t i) const {
    return options_.q_positions.empty() ? M_ - N_ + i : options_.q_positions[i];
  }
  // kpos[c] = the position of key j0 + c for c < n; 0 for the padding keys past M (masked anyway).
  void key_positions(int64_t j0, int64_t n, int64_t* kpos) const {
    for (int64_t c = 0; c < n; ++c) {
      const int64_t j = j0 + c;
      kpos[c] = j >= M_ ? 0 : options_.k_positions.empty() ? j : options_.k_positions[j];
    }
  }

 private:
  const AttentionOptions& options_;
  int64_t N_, M_;
  float scale_, cap_;
};

inline constexpr float kVariantsLog2e = 1.4426950408889634f;

// Rows [i0, i0 + ni) of head h, keys kpos[0, nk) of the tile: s [ni][lds] from raw dot products to
// base-2 logits (the formula at the top), scalar and in the reference's operations.
inline void variant_scores_portable(const ScoreVariants& v, int64_t h, int64_t i0, int64_t ni, const int64_t* kpos,
                                    int64_t nk, float* s, int64_t lds) {
  const float scale = v.scale(), cap = v.cap(), slope = v.slope(h);
  for (int64_t r = 0; r < ni; ++r) {
    float* x = s + r * lds;
    const int64_t qpos = v.query_position(i0 + r);
    for (int64_t c = 0; c < nk; ++c) {
      float t = x[c] * scale;
      if (cap > 0.0f) t = cap * std::tanh(t / cap);
      if (slope != 0.0f) t -= slope * static_cast<float>(std::llabs(qpos - kpos[c]));
      x[c] = t * kVariantsLog2e;
    }
  }
}

#if defined(CABM_HAVE_AVX512_VARIANTS)

// tanh(x) to about 2 ulp relative, odd, ±1 for |x| >= 10 (Cephes tanhf: an odd polynomial below
// |x| = 0.625, where it keeps the relative accuracy down to 0 and subnormals, and (1 − e)/(1 + e)
// with e = exp(−2|x|) above, exp by Cody–Waite reduction and a degree-5 polynomial).
CABM_AVX512_VARIANTS inline __m512 tanh_avx512(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  // |x| < 0.625: |x| + |x|·z·P(z), z = x².
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), ax, ax);
  // |x| >= 0.625: e = exp(y), y = −2|x| in [−20, −1.25].
  const __m512 y = _mm512_mul_ps(_mm512_min_ps(ax, _mm512_set1_ps(10.0f)), _mm512_set1_ps(-2.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(kVariantsLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), y);
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
  __m512 q = _mm512_set1_ps(1.9875691500e-4f);
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(1.3981999507e-3f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(8.3334519073e-3f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(4.1665795894e-2f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(1.6666665459e-1f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e = _mm512_scalef_ps(_mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(q, f), f, f), _mm512_set1_ps(1.0f)), n);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 large = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  // tanh(|x|), then the sign of x (−0 stays −0).
  return _mm512_or_ps(_mm512_mask_blend_ps(is_small, large, small), _mm512_and_ps(x, _mm512_set1_ps(-0.0f)));
}

// |qpos − kpos[c]| for 16 keys as floats (rounded as static_cast<float> of the int64 is).
CABM_AVX512_VARIANTS inline __m512 alibi_distance(int64_t qpos, const int64_t* kpos) {
  const __m512i qv = _mm512_set1_epi64(qpos);
  const __m512i lo = _mm512_abs_epi64(_mm512_sub_epi64(qv, _mm512_loadu_si512(kpos)));
  const __m512i hi = _mm512_abs_epi64(_mm512_sub_epi64(qv, _mm512_loadu_si512(kpos + 8)));
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtepi64_ps(lo)), _mm512_cvtepi64_ps(hi), 1);
}

// With the cap, t/c is taken as q·k·(scale/c): one division per tile instead of one per score (a
// rounding of its own, which the tests' bounds count).
template <bool kCap, bool kAlibi>
CABM_AVX512_VARIANTS void variant_scores_rows(const ScoreVariants& v, int64_t h, int64_t i0, int64_t ni,
                                              const int64_t* kpos, int64_t nk16, float* s, int64_t lds) {
  const __m512 scale = _mm512_set1_ps(v.scale()), cap = _mm512_set1_ps(v.cap());
  const __m512 scale_over_cap = _mm512_set1_ps(kCap ? v.scale() / v.cap() : 0.0f);
  const __m512 slope = _mm512_set1_ps(v.slope(h)), log2e = _mm512_set1_ps(kVariantsLog2e);
  for (int64_t r = 0; r < ni; ++r) {
    float* x = s + r * lds;
    const int64_t qpos = v.query_position(i0 + r);
    for (int64_t c = 0; c < nk16; c += 16) {
      const __m512 dot = _mm512_loadu_ps(x + c);
      __m512 t;
      if constexpr (kCap)
        t = _mm512_mul_ps(cap, tanh_avx512(_mm512_mul_ps(dot, scale_over_cap)));
      else
        t = _mm512_mul_ps(dot, scale);
      if constexpr (kAlibi) t = _mm512_sub_ps(t, _mm512_mul_ps(slope, alibi_distance(qpos, kpos + c)));
      _mm512_storeu_ps(x + c, _mm512_mul_ps(t, log2e));
    }
  }
}

// variant_scores_portable over nk16 keys (a multiple of 16; kpos has nk16 entries). Once per tile
// and never inlined: inlined, its four bodies enlarged the tile loops around it and made the plain
// AMX forward (which never calls it) 5% slower.
__attribute__((noinline)) CABM_AVX512_VARIANTS inline void variant_scores_avx512(const ScoreVariants& v, int64_t h,
                                                                                 int64_t i0, int64_t ni,
                                                                                 const int64_t* kpos, int64_t nk16,
                                                                                 float* s, int64_t lds) {
  const bool cap = v.cap() > 0.0f, alibi = v.slope(h) != 0.0f;
  if (cap && alibi)
    variant_scores_rows<true, true>(v, h, i0, ni, kpos, nk16, s, lds);
  else if (cap)
    variant_scores_rows<true, false>(v, h, i0, ni, kpos, nk16, s, lds);
  else if (alibi)
    variant_scores_rows<false, true>(v, h, i0, ni, kpos, nk16, s, lds);
  else
    variant_scores_rows<false, false>(v, h, i0, ni, kpos, nk16, s, lds);
}

#endif

}  // namespace cabm::detail
