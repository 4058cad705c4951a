#include "cabm/kernels/attention/flash_amx.h"

#include "cabm/core/error.h"
#include "cabm/kernels/attention/amx_tile_gemm.h"
#include "cabm/kernels/attention/bf16_avx512.h"
#include "cabm/kernels/attention/bf16_packing.h"
#include "cabm/kernels/attention/bf16_variants.h"
#include "cabm/kernels/bf16.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include "cabm/kernels/x86_intrinsics.h"
#define CABM_HAVE_AMX_CODE 1
#endif

namespace cabm::detail {

namespace {
std::atomic<bool> g_amx_emulation{false};
}  // namespace

void set_amx_emulation(bool on) {
  CABM_CHECK(!on || cpu_has_avx512_bf16(), "the emulated AMX path needs a CPU with AVX512_BF16");
  g_amx_emulation.store(on, std::memory_order_relaxed);
}
bool amx_emulation() {
  return g_amx_emulation.load(std::memory_order_relaxed);
}

#if defined(CABM_HAVE_AMX_CODE)

namespace {

#pragma GCC diagnostic push
#ifndef __clang__  // a GCC-only warning group; clang warns about the unknown name
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// The row pass of the online softmax (softmax_rows_avx512 of attention/bf16_avx512.h, the same
// operations in the same order) for a tile of nk16 = 16·NV <= 128 keys with the rows in
// registers (no store and reload of x), R rows at a time so that one row's reductions overlap the
// other's exponentials; then zeros for P's keys [nk16, nk32), which P·V's 32-key steps read. Row
// strides: lds.
template <int NV, int R>
CABM_AMX void softmax_rows_nv(const float* x, const float* mrow, const float* z, int64_t lds, int64_t nk32,
                              float qscale, bf16* prow, float* m, float* l, float* alpha) {
  const __m512 qs = _mm512_set1_ps(qscale);
  const bool raw = raw_row_max(mrow, qscale);
  __m512 t[R][NV];  // x = s·qscale + mask with a mask, else the scores s (see raw_row_max)
  float m_new[R];
  for (int r = 0; r < R; ++r) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int c = 0; c < NV; ++c) {
      const __m512 x_rc = _mm512_loadu_ps(x + r * lds + 16 * c);
      t[r][c] = mrow ? _mm512_fmadd_ps(x_rc, qs, _mm512_loadu_ps(mrow + r * lds + 16 * c)) : x_rc;
      vmax = _mm512_max_ps(vmax, mrow ? t[r][c] : max_operand(x_rc, nullptr, qs, raw));
    }
    m_new[r] = std::max(m[r], row_max(vmax, qscale, raw));
  }
  for (int r = 0; r < R; ++r) {
    const __m512 mv = _mm512_set1_ps(m_new[r]);
    __m512 vsum = _mm512_setzero_ps();
    bf16* pr = prow + r * lds;
    __m512 e_even = _mm512_setzero_ps();  // weights converted in pairs of vectors (store_bf16x32)
    for (int c = 0; c < NV; ++c) {
      __m512 e = exp2_weights(mrow ? _mm512_sub_ps(t[r][c], mv) : exponent(t[r][c], nullptr, qs, mv));
      vsum = _mm512_add_ps(vsum, e);
      if (z) e = _mm512_mul_ps(e, _mm512_loadu_ps(z + r * lds + 16 * c));
      if (c % 2 == 1)
        store_bf16x32(pr + 16 * (c - 1), e_even, e);
      else if (c + 1 < NV)
        e_even = e;
      else if (nk32 > 16 * NV)  // the last vector with the zeros of keys [nk16, nk32)
        store_bf16x32(pr + 16 * c, e, _mm512_setzero_ps());
      else
        store_bf16x16(pr + 16 * c, e);
    }
    finish_row(m_new[r], vsum, m[r], l[r], alpha[r]);
  }
}
// R rows (1 or 2; x, mrow, z, prow at the first, rows lds apart) of nk16 <= 128 keys: the
// instance of softmax_rows_nv for the tile's number of key vectors.
template <int R>
CABM_AMX void softmax_rows_any(const float* x, const float* mrow, const float* z, int64_t lds, int64_t nk16,
                               int64_t nk32, float qscale, bf16* prow, float* m, float* l, float* alpha) {
  using RowsFn =
      void (*)(const float*, const float*, const float*, int64_t, int64_t, float, bf16*, float*, float*, float*);
  static constexpr RowsFn kByVectors[8] = {&softmax_rows_nv<1, R>, &softmax_rows_nv<2, R>, &softmax_rows_nv<3, R>,
                                           &softmax_rows_nv<4, R>, &softmax_rows_nv<5, R>, &softmax_rows_nv<6, R>,
                                           &softmax_rows_nv<7, R>, &softmax_rows_nv<8, R>};
  kByVectors[std::clamp<int64_t>(nk16 / 16, 1, 8) - 1](x, mrow, z, lds, nk32, qscale, prow, m, l, alpha);
}

CABM_AMX void scale_row(float* o, int64_t n, float a) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t c = 0; c < n; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), av));
}

// One key tile (attention/flash_amx.h): S = Q·Kᵀ on tiles, the variant pass, the row pass (two rows
// at a time while a tile fits in registers), O = α ∘ O, then O += P·V on tiles.
template <class Tiles>
CABM_AMX void forward_tile(const AmxForwardTile& t) {
  const int64_t rows16 = (t.ni + 15) / 16 * 16, nk16 = (t.nk + 15) / 16 * 16, nk32 = (t.nk + 31) / 32 * 32;
  // S = Q·Kᵀ: K in 16-key blocks of head-dim pairs, one block after another.
  tile_gemm<Tiles>(rows16, nk16, t.dp, t.q, t.dp, {t.k, 32, 16 * t.dp}, t.s, t.lds, false);
  if (t.variants) variant_scores_avx512(*t.variants, t.h, t.i0, t.ni, t.kpos, nk16, t.s, t.lds);
  if (nk16 <= 128) {
    for (int64_t r = 0; r < t.ni; r += 2) {
      const int64_t nr = std::min<int64_t>(2, t.ni - r);
      const float* mrow = t.mask ? t.mask + r * t.lds : nullptr;
      const float* z = t.z ? t.z + r * t.lds : nullptr;
      const auto rows = nr == 2 ? &softmax_rows_any<2> : &softmax_rows_any<1>;
      rows(t.s + r * t.lds, mrow, z, t.lds, nk16, nk32, t.qscale, t.p + r * t.lds, t.m + r, t.l + r, t.alpha + r);
    }
  } else {
    // All rows in one call: each row's maximum is taken during the previous row's weights. P's
    // keys [nk16, nk32) then get zeros.
    softmax_rows_avx512(t.s, t.lds, t.ni, nk16, t.mask, t.z, t.qscale, t.p, t.lds, t.m, t.l, t.alpha);
    if (nk32 > nk16)
      for (int64_t r = 0; r < t.ni; ++r)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.p + r * t.lds + nk16), _mm256_setzero_si256());
  }
  for (int64_t r = 0; r < t.ni; ++r)
    if (t.alpha[r] != 1.0f) scale_row(t.o + r * t.dvp, t.dvp, t.alpha[r]);
  // O += P·V over 32 keys at a time: V as pairs of keys [.][dvp][2].
  tile_gemm<Tiles>(rows16, t.dvp, nk32, t.p, t.lds, {t.v, 2 * t.dvp, 32}, t.o, t.dvp, true);
}

#pragma GCC diagnostic pop

}  // namespace

void amx_forward_tile(const AmxForwardTile& tile, Bf16Products run_on) {
  CABM_CHECK(run_on != Bf16Products::kVdpbf16ps, "amx_forward_tile runs AMX products only");
  if (run_on == Bf16Products::kAmxEmulated)
    forward_tile<EmulatedTiles>(tile);
  else
    forward_tile<HardwareTiles>(tile);
}

void amx_tiles_begin(Bf16Products run_on) {
  if (run_on == Bf16Products::kAmxTiles) HardwareTiles::configure();
}
void amx_tiles_end(Bf16Products run_on) {
  if (run_on == Bf16Products::kAmxTiles) HardwareTiles::release();
}

#else

void amx_forward_tile(const AmxForwardTile&, Bf16Products) {
  CABM_CHECK(false, "the AMX attention forward is only built for x86-64");
}
void amx_tiles_begin(Bf16Products) {}
void amx_tiles_end(Bf16Products) {}

#endif

}  // namespace cabm::detail
