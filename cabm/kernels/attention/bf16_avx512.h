// The avx512_bf16 path of attention_flash_bf16_forward (internal to cabm/kernels/: included by
// attention/flash_bf16.cpp only): both products with vdpbf16ps on the packed layouts of
// attention/bf16_packing.h, and the row pass of the online softmax. Compiled for AVX-512 BF16 by
// function attribute, so the library builds for any x86-64; callers run it only where
// bf16_active_isa() == kAvx512Bf16.
//   S = Q·Kᵀ   one zmm of K = a pair of head-dim elements for 16 keys; a broadcast pair of a Q row
//              gives 16 partial scores per vdpbf16ps.
//   O += P·V   one zmm of V = two keys for 16 columns; a broadcast pair of a P row adds
//              p_j·v_j + p_j+1·v_j+1 to 16 output columns.
#pragma once

#include "cabm/kernels/attention/bf16_packing.h"

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

// MR rows × NV vectors of 16 scores; k over pairs of head-dim elements.
template <int MR, int NV>
CABM_AVX512_BF16 void scores_block(const bf16* qp, int64_t dp, const bf16* kblock, float* s, int64_t lds) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  const int64_t pairs = dp / 2, block_stride = pairs * kPackedKeyBlock * 2;
  for (int64_t c = 0; c < pairs; ++c) {
    __m512i b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_si512(kblock + v * block_stride + c * kPackedKeyBlock * 2);
    for (int r = 0; r < MR; ++r) {
      const __m512i a = broadcast_pair(qp + r * dp + 2 * c);
      for (int v = 0; v < NV; ++v) acc[r][v] = dot2(acc[r][v], a, b[v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(s + r * lds + v * 16, acc[r][v]);
}

template <int MR>
CABM_AVX512_BF16 void scores_rows(const bf16* qp, int64_t dp, const bf16* kp, int64_t nb, float* s, int64_t lds) {
  const int64_t block_stride = dp / 2 * kPackedKeyBlock * 2;
  int64_t v = 0;
  for (; v + 4 <= nb; v += 4) scores_block<MR, 4>(qp, dp, kp + v * block_stride, s + v * 16, lds);
  for (; v < nb; ++v) scores_block<MR, 1>(qp, dp, kp + v * block_stride, s + v * 16, lds);
}

CABM_AVX512_BF16 inline void scores_avx512(const bf16* qp, int64_t ni, const bf16* kp, int64_t j0, int64_t nk16,
                                           int64_t dp, float* s, int64_t lds) {
  const bf16* kb = kp + (j0 / kPackedKeyBlock) * (dp / 2) * kPackedKeyBlock * 2;
  const int64_t nb = nk16 / kPackedKeyBlock;
  int64_t r = 0;
  for (; r + 6 <= ni; r += 6) scores_rows<6>(qp + r * dp, dp, kb, nb, s + r * lds, lds);
  for (; r < ni; ++r) scores_rows<1>(qp + r * dp, dp, kb, nb, s + r * lds, lds);
}

// MR rows × NV vectors of 16 output columns, k over pairs of keys.
template <int MR, int NV>
CABM_AVX512_BF16 void pv_block(const bf16* pt, int64_t ldp, const bf16* vcols, int64_t dvp, int64_t pairs, float* o,
                               int64_t ldo) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_loadu_ps(o + r * ldo + v * 16);
  for (int64_t t = 0; t < pairs; ++t) {
    __m512i b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_si512(vcols + t * dvp * 2 + v * 32);
    for (int r = 0; r < MR; ++r) {
      const __m512i a = broadcast_pair(pt + r * ldp + 2 * t);
      for (int v = 0; v < NV; ++v) acc[r][v] = dot2(acc[r][v], a, b[v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(o + r * ldo + v * 16, acc[r][v]);
}

template <int MR>
CABM_AVX512_BF16 void pv_rows(const bf16* pt, int64_t ldp, const bf16* vp, int64_t dvp, int64_t pairs, float* o,
                              int64_t ldo) {
  const int64_t nv = dvp / 16;
  int64_t v = 0;
  for (; v + 4 <= nv; v += 4) pv_block<MR, 4>(pt, ldp, vp + v * 32, dvp, pairs, o + v * 16, ldo);
  for (; v < nv; ++v) pv_block<MR, 1>(pt, ldp, vp + v * 32, dvp, pairs, o + v * 16, ldo);
}

CABM_AVX512_BF16 inline void pv_avx512(const bf16* pt, int64_t ldp, int64_t ni, const bf16* vp, int64_t j0, int64_t nk2,
                                       int64_t dvp, float* o, int64_t ldo) {
  const bf16* vb = vp + packed_v_index(j0, 0, dvp);
  const int64_t pairs = nk2 / 2;
  int64_t r = 0;
  for (; r + 6 <= ni; r += 6) pv_rows<6>(pt + r * ldp, ldp, vb, dvp, pairs, o + r * ldo, ldo);
  for (; r < ni; ++r) pv_rows<1>(pt + r * ldp, ldp, vb, dvp, pairs, o + r * ldo, ldo);
}

// 2^x for x <= 0 (−inf → 0): the Cephes exp2f polynomial of simd.h (copied: that header
// picks its ISA at compile time, and this code is compiled for AVX-512 by attribute only).
CABM_AVX512_BF16 inline __m512 exp2_nonpositive(__m512 x) {
  static constexpr float kPoly[6] = {1.535336188319500e-4f, 1.339887440266574e-3f, 9.618437357674640e-3f,
                                     5.550332471162809e-2f, 2.402264791363012e-1f, 6.931472028550421e-1f};
  const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-127.0f));
  const __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(xc, n);
  __m512 poly = _mm512_set1_ps(kPoly[0]);
  for (int c = 1; c < 6; ++c) poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(kPoly[c]));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.0f));
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  return _mm512_maskz_scalef_ps(live, poly, n);
}

CABM_AVX512_BF16 inline void softmax_rows_avx512(float* s, int64_t lds, int64_t ni, int64_t nk16, const float* mask,
                                                 float qscale, float* m, float* l, float* alpha) {
  const __m512 qs = _mm512_set1_ps(qscale);
  for (int64_t r = 0; r < ni; ++r) {
    float* x = s + r * lds;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t c = 0; c < nk16; c += 16) {
      __m512 t = _mm512_mul_ps(_mm512_loadu_ps(x + c), qs);
      if (mask) t = _mm512_add_ps(t, _mm512_loadu_ps(mask + r * lds + c));
      _mm512_storeu_ps(x + c, t);
      vmax = _mm512_max_ps(vmax, t);
    }
    const float m_new = std::max(m[r], _mm512_reduce_max_ps(vmax));
    const __m512 mv = _mm512_set1_ps(m_new);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t c = 0; c < nk16; c += 16) {
      const __m512 e = exp2_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(x + c), mv));
      _mm512_storeu_ps(x + c, e);
      vsum = _mm512_add_ps(vsum, e);
    }
    alpha[r] = std::exp2(m[r] - m_new);
    l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(vsum);
    m[r] = m_new;
  }
}

#pragma GCC diagnostic pop
#endif

}  // namespace cabm::detail
