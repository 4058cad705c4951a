#include "cabm/kernels/attention/flash_amx.h"

#include "cabm/core/error.h"
#include "cabm/kernels/attention/amx_tile_gemm.h"
#include "cabm/kernels/attention/bf16_avx512.h"
#include "cabm/kernels/attention/bf16_packing.h"
#include "cabm/kernels/attention/bf16_variants.h"
#include "cabm/kernels/attention/tile_mask.h"
#include "cabm/kernels/bf16.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

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

constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kRows = 32;  // query rows per work item: two A tiles

int64_t round_up(int64_t a, int64_t b) {
  return (a + b - 1) / b * b;
}

#pragma GCC diagnostic push
#ifndef __clang__  // a GCC-only warning group; clang warns about the unknown name
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Sizes of one call. Packed, zero padded, per head:
//   K [Mp/16][dp/2][16][2]  16 keys, then pairs of head-dim elements (the B tile of S for 16 keys
//                           and 32 head-dim elements is 1 KiB, rows 64 bytes apart);
//   V [Mp/2][dvp][2]        pairs of keys, column (the B tile of O for 32 keys and 16 columns has
//                           its rows 4·dvp bytes apart).
// dp = d rounded up to 32 (an A tile's width), dvp = dv rounded up to 16 (a C tile's), and
// Mp = M rounded up to 16, plus 16: a block of 16·n keys reads P·V 32 keys at a time, so up to
// 16 keys past its end, where P is 0 and V is zero padding or the next block's (finite) values.
struct Problem {
  int64_t B, N, H, Hkv, M, d, dv;  // query head h reads key/value head h / (H / Hkv)
  int64_t dp, dvp, Mp;
  int64_t block_k;  // a multiple of 16
  int64_t lds;      // row stride of s, mask (floats) and p (bf16): block_k rounded up to 32
  float qscale;     // scale · log2(e): scores in base 2
  float keep_scale;
  bool dropout;
  bool variants;  // soft-capping or ALiBi: a pass over each score tile (attention/bf16_variants.h)
};

// Per-thread buffers; rows kRows. Rows past a short item's end hold stale, finite values: the
// tiles compute them and nothing reads the results.
struct Buffers {
  std::vector<bf16> q, p;            // [kRows][dp], [kRows][lds]
  std::vector<float> s, mask, z, o;  // [kRows][lds] (z: [2][lds]), [kRows][dvp]
  std::vector<float> m, l, alpha;    // [kRows]
  std::vector<int64_t> kpos;         // [lds]: the tile's key positions (ALiBi)
  explicit Buffers(const Problem& pr)
      : q(static_cast<size_t>(kRows * pr.dp), bf16{0}),
        p(static_cast<size_t>(kRows * pr.lds), bf16{0}),
        s(static_cast<size_t>(kRows * pr.lds), 0.0f),
        mask(static_cast<size_t>(kRows * pr.lds), 0.0f),
        z(static_cast<size_t>(2 * pr.lds), 0.0f),
        o(static_cast<size_t>(kRows * pr.dvp), 0.0f),
        m(kRows),
        l(kRows),
        alpha(kRows),
        kpos(pr.variants ? static_cast<size_t>(pr.lds) : 0) {}
};

struct Args {
  const Tensor &q, &out;
  const bf16 *kp, *vp;  // packed key/value heads, [B·Hkv][Mp·dp] and [B·Hkv][Mp·dvp]
  float* lse;
  const AttentionOptions& options;
  const TileMask& mask;
  const ScoreVariants& variants;
  const Problem& p;
};

// 2^x for x <= 0: detail::exp2_nonpositive of attention/bf16_avx512.h (the avx512_bf16 path's,
// bit for bit; its target features are a subset of CABM_AMX's, so it inlines here).

// One row of the online softmax over nk16 scores, the same operations in the same order as the
// avx512_bf16 path: x = s·qscale + mask, m' = max(m, max x), P = exp2(x − m') summed into
// l = α·l + Σ P (α = exp2(m − m')), then P·z with dropout and P rounded to bf16 into prow
// [0, nk32) (zeros past nk16). P is never subnormal (exp2_nonpositive, z >= 1), so vcvtneps2bf16
// rounds it exactly as float_to_bf16 does.
CABM_AMX void softmax_row(float* x, const float* mrow, const float* z, int64_t nk16, int64_t nk32, float qscale,
                          bf16* prow, float& m, float& l, float& alpha) {
  const __m512 qs = _mm512_set1_ps(qscale);
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t c = 0; c < nk16; c += 16) {
    __m512 t = _mm512_mul_ps(_mm512_loadu_ps(x + c), qs);
    if (mrow) t = _mm512_add_ps(t, _mm512_loadu_ps(mrow + c));
    _mm512_storeu_ps(x + c, t);
    vmax = _mm512_max_ps(vmax, t);
  }
  const float m_new = std::max(m, _mm512_reduce_max_ps(vmax));
  const __m512 mv = _mm512_set1_ps(m_new);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t c = 0; c < nk16; c += 16) {
    __m512 e = exp2_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(x + c), mv));
    vsum = _mm512_add_ps(vsum, e);
    if (z) e = _mm512_mul_ps(e, _mm512_loadu_ps(z + c));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(prow + c), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
  }
  if (nk32 > nk16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(prow + nk16), _mm256_setzero_si256());
  alpha = std::exp2(m - m_new);
  l = l * alpha + _mm512_reduce_add_ps(vsum);
  m = m_new;
}

// softmax_row for nk16 = 16·NV with the rows in registers (no store and reload of x), R rows at a
// time so that one row's reductions overlap the other's exponentials. Row strides: lds.
template <int NV, int R>
CABM_AMX void softmax_rows_nv(const float* x, const float* mrow, const float* z, int64_t lds, int64_t nk32,
                              float qscale, bf16* prow, float* m, float* l, float* alpha) {
  const __m512 qs = _mm512_set1_ps(qscale);
  __m512 t[R][NV];
  float m_new[R];
  for (int r = 0; r < R; ++r) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int c = 0; c < NV; ++c) {
      t[r][c] = _mm512_mul_ps(_mm512_loadu_ps(x + r * lds + 16 * c), qs);
      if (mrow) t[r][c] = _mm512_add_ps(t[r][c], _mm512_loadu_ps(mrow + r * lds + 16 * c));
      vmax = _mm512_max_ps(vmax, t[r][c]);
    }
    m_new[r] = std::max(m[r], _mm512_reduce_max_ps(vmax));
  }
  for (int r = 0; r < R; ++r) {
    const __m512 mv = _mm512_set1_ps(m_new[r]);
    __m512 vsum = _mm512_setzero_ps();
    bf16* pr = prow + r * lds;
    for (int c = 0; c < NV; ++c) {
      __m512 e = exp2_nonpositive(_mm512_sub_ps(t[r][c], mv));
      vsum = _mm512_add_ps(vsum, e);
      if (z) e = _mm512_mul_ps(e, _mm512_loadu_ps(z + r * lds + 16 * c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + 16 * c), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
    }
    if (nk32 > 16 * NV) _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + 16 * NV), _mm256_setzero_si256());
    alpha[r] = std::exp2(m[r] - m_new[r]);
    l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(vsum);
    m[r] = m_new[r];
  }
}
template <int NV>
CABM_AMX void softmax_row_nv(const float* x, const float* mrow, const float* z, int64_t nk32, float qscale, bf16* prow,
                             float& m, float& l, float& alpha) {
  softmax_rows_nv<NV, 1>(x, mrow, z, 0, nk32, qscale, prow, &m, &l, &alpha);
}

CABM_AMX void softmax_row_any(float* x, const float* mrow, const float* z, int64_t nk16, int64_t nk32, float qscale,
                              bf16* prow, float& m, float& l, float& alpha) {
  switch (nk16 / 16) {
    case 1:
      return softmax_row_nv<1>(x, mrow, z, nk32, qscale, prow, m, l, alpha);
    case 2:
      return softmax_row_nv<2>(x, mrow, z, nk32, qscale, prow, m, l, alpha);
    case 3:
      return softmax_row_nv<3>(x, mrow, z, nk32, qscale, prow, m, l, alpha);
    case 4:
      return softmax_row_nv<4>(x, mrow, z, nk32, qscale, prow, m, l, alpha);
    case 5:
      return softmax_row_nv<5>(x, mrow, z, nk32, qscale, prow, m, l, alpha);
    case 6:
      return softmax_row_nv<6>(x, mrow, z, nk32, qscale, prow, m, l, alpha);
    case 7:
      return softmax_row_nv<7>(x, mrow, z, nk32, qscale, prow, m, l, alpha);
    case 8:
      return softmax_row_nv<8>(x, mrow, z, nk32, qscale, prow, m, l, alpha);
    default:
      return softmax_row(x, mrow, z, nk16, nk32, qscale, prow, m, l, alpha);
  }
}

// Two rows r, r + 1 (x, mrow, z, prow at row r, rows lds apart), nk16 <= 128.
CABM_AMX void softmax_two_rows(const float* x, const float* mrow, const float* z, int64_t lds, int64_t nk16,
                               int64_t nk32, float qscale, bf16* prow, float* m, float* l, float* alpha) {
  switch (nk16 / 16) {
    case 1:
      return softmax_rows_nv<1, 2>(x, mrow, z, lds, nk32, qscale, prow, m, l, alpha);
    case 2:
      return softmax_rows_nv<2, 2>(x, mrow, z, lds, nk32, qscale, prow, m, l, alpha);
    case 3:
      return softmax_rows_nv<3, 2>(x, mrow, z, lds, nk32, qscale, prow, m, l, alpha);
    case 4:
      return softmax_rows_nv<4, 2>(x, mrow, z, lds, nk32, qscale, prow, m, l, alpha);
    case 5:
      return softmax_rows_nv<5, 2>(x, mrow, z, lds, nk32, qscale, prow, m, l, alpha);
    case 6:
      return softmax_rows_nv<6, 2>(x, mrow, z, lds, nk32, qscale, prow, m, l, alpha);
    case 7:
      return softmax_rows_nv<7, 2>(x, mrow, z, lds, nk32, qscale, prow, m, l, alpha);
    default:
      return softmax_rows_nv<8, 2>(x, mrow, z, lds, nk32, qscale, prow, m, l, alpha);
  }
}

CABM_AMX void scale_row(float* o, int64_t n, float a) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t c = 0; c < n; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), av));
}

// Rows [32·qt, 32·qt + 32) of head (b, h); the loop over key blocks is attention/flash_bf16.cpp's.
template <class Tiles>
CABM_AMX void forward_query_tile(const Args& args, Buffers& buf, int64_t b, int64_t h, int64_t qt) {
  const Problem& p = args.p;
  const int64_t i0 = qt * kRows, ni = std::min(kRows, p.N - i0);
  const int nrt = ni > 16 ? 2 : 1;
  const Range rows{i0, i0 + ni};
  const int64_t kv_head = b * p.Hkv + h / (p.H / p.Hkv);
  const bf16* kp = args.kp + kv_head * p.Mp * p.dp;
  const bf16* vp = args.vp + kv_head * p.Mp * p.dvp;
  const int64_t lds = p.lds;
  const float qscale = p.variants ? 1.0f : p.qscale;  // the variant pass scales to base 2 itself

  const bf16* qs = bf16_head_ptr(args.q, b, h);
  for (int64_t r = 0; r < ni; ++r) std::copy_n(qs + (i0 + r) * args.q.stride(1), p.d, buf.q.data() + r * p.dp);
  // −FLT_MAX, not −inf: exp2(s − m) stays free of inf − inf while a row has seen only masked keys.
  std::fill_n(buf.m.data(), ni, -FLT_MAX);
  std::fill_n(buf.l.data(), ni, 0.0f);
  std::fill_n(buf.o.data(), nrt * 16 * p.dvp, 0.0f);
  const DropoutMatrix dropout(args.options, b, h, p.H, p.M);
  float *s = buf.s.data(), *o = buf.o.data();

  const Range key_range = args.mask.key_range(b, rows);
  for (int64_t j0 = key_range.begin / p.block_k * p.block_k; j0 < key_range.end; j0 += p.block_k) {
    const int64_t nk = std::min(p.block_k, p.M - j0), nk16 = round_up(nk, 16), nk32 = round_up(nk, 32);
    const Range keys{j0, j0 + nk};
    const TileKind kind = args.mask.classify(b, h, rows, keys);
    if (kind == TileKind::kSkip) continue;
    // Blocked and padding keys get −inf; the additive bias is scaled to base 2 like the scores.
    const float* mask = padded_key_mask(args.mask, kind, b, h, rows, keys, nk16, kLog2e, buf.mask.data(), lds);

    // S = Q·Kᵀ: K in 16-key blocks of head-dim pairs, one block after another.
    tile_gemm<Tiles>(16 * nrt, nk16, p.dp, buf.q.data(), p.dp, {kp + j0 * p.dp, 32, 16 * p.dp}, s, lds, false);
    if (p.variants) {
      args.variants.key_positions(j0, nk16, buf.kpos.data());
      variant_scores_avx512(args.variants, h, i0, ni, buf.kpos.data(), nk16, s, lds);
    }
    // Row pass, two rows at a time while a block fits in registers; then O = α ∘ O.
    const int rows_at_once = nk16 <= 128 ? 2 : 1;
    for (int64_t r = 0; r < ni; r += rows_at_once) {
      const int64_t nr = std::min<int64_t>(rows_at_once, ni - r);
      const float* z = nullptr;
      if (p.dropout) {
        for (int64_t u = 0; u < nr; ++u) {
          float* zr = buf.z.data() + u * lds;
          dropout.fill_row(i0 + r + u, j0, j0 + nk, p.keep_scale, zr, 1);
          std::fill(zr + nk, zr + nk16, 0.0f);
        }
        z = buf.z.data();
      }
      const float* mrow = mask ? mask + r * lds : nullptr;
      if (nr == 2)
        softmax_two_rows(s + r * lds, mrow, z, lds, nk16, nk32, qscale, buf.p.data() + r * lds, &buf.m[r], &buf.l[r],
                         &buf.alpha[r]);
      else
        softmax_row_any(s + r * lds, mrow, z, nk16, nk32, qscale, buf.p.data() + r * lds, buf.m[r], buf.l[r],
                        buf.alpha[r]);
      for (int64_t u = r; u < r + nr; ++u)
        if (buf.alpha[u] != 1.0f) scale_row(o + u * p.dvp, p.dvp, buf.alpha[u]);
    }
    // O += P·V over 32 keys at a time: V as pairs of keys [Mp/2][dvp][2].
    tile_gemm<Tiles>(16 * nrt, p.dvp, nk32, buf.p.data(), lds, {vp + j0 * p.dvp, 2 * p.dvp, 32}, o, p.dvp, true);
  }

  // One division per row; fully masked rows (l = 0) give 0 and lse = −inf.
  detail::write_tile_output(args.out, b, h, i0, ni, p.dv, {o, p.dvp, buf.l.data(), buf.m.data()},
                            args.lse ? args.lse + (b * p.H + h) * p.N + i0 : nullptr);
}

// One thread's share: its tile configuration is per thread (loaded here, released at the end).
template <class Tiles>
CABM_AMX void run_items(const Args& args, const std::vector<QueryTileItem>& items) {
  Buffers buf(args.p);
  Tiles::configure();
#pragma omp for schedule(dynamic, 1)
  for (size_t n = 0; n < items.size(); ++n) forward_query_tile<Tiles>(args, buf, items[n].b, items[n].h, items[n].qt);
  Tiles::release();
}

#pragma GCC diagnostic pop

}  // namespace

void attention_flash_bf16_forward_amx(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const AttentionOptions& options, const Tensor& out, const Tensor* lse,
                                      const FlashConfig& tiles, AmxTiles run_on) {
  Problem p{};
  p.B = q.size(0), p.N = q.size(1), p.H = q.size(2), p.Hkv = k.size(2), p.M = k.size(1);
  p.d = q.size(3), p.dv = v.size(3);
  p.dp = round_up(std::max<int64_t>(p.d, 1), 32), p.dvp = round_up(std::max<int64_t>(p.dv, 1), 16);
  p.Mp = round_up(p.M, 16) + 16;
  CABM_CHECK(tiles.block_k > 0 && tiles.block_k % 16 == 0, "AMX forward needs block_k a multiple of 16, got {}",
             tiles.block_k);
  p.block_k = tiles.block_k;
  p.lds = round_up(p.block_k, 32);
  p.qscale = attention_scale(options, p.d) * kLog2e;
  p.keep_scale = 1.0f / (1.0f - options.dropout);
  p.dropout = options.dropout > 0.0f;
  const ScoreVariants variants(options, p.N, p.M, p.d);
  p.variants = variants.active();
  const TileMask mask(options.mask, p.B, p.H, p.N, p.M);

  // Once per key/value head: the query heads of a group read the same packed K and V.
  const PackedKV packed = packed_kv_storage(p.B * p.Hkv * p.Mp * p.dp, p.B * p.Hkv * p.Mp * p.dvp);
  bf16 *const kp = packed.k, *const vp = packed.v;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hkv; ++h)
      pack_kv_head(k, v, b, h, p.Mp, p.dp, p.dvp, kp + (b * p.Hkv + h) * p.Mp * p.dp,
                   vp + (b * p.Hkv + h) * p.Mp * p.dvp);
  const Args args{q, out, kp, vp, lse ? lse->data<float>() : nullptr, options, mask, variants, p};

  // Head by head, heaviest first within a head (see forward_work_items).
  const std::vector<QueryTileItem> items = forward_work_items(mask, p.H, p.N, kRows, 0, p.B * p.H);
  if (run_on == AmxTiles::kEmulated) {
#pragma omp parallel
    run_items<EmulatedTiles>(args, items);
  } else {
#pragma omp parallel
    run_items<HardwareTiles>(args, items);
  }
}

#else

void attention_flash_bf16_forward_amx(const Tensor&, const Tensor&, const Tensor&, const AttentionOptions&,
                                      const Tensor&, const Tensor*, const FlashConfig&, AmxTiles) {
  CABM_CHECK(false, "the AMX attention forward is only built for x86-64");
}

#endif

}  // namespace cabm::detail
