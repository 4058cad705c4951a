// The avx512_bf16 path of attention_flash_bf16_backward: FlashAttention-2's backward (Dao 2023,
// Algorithm 2) with its five block products on vdpbf16ps, through the two micro-kernels of the
// forward (attention/bf16_avx512.h):
//   scores_avx512  A rows · Bᵀ, B packed in 16-key blocks of element pairs:  S = Q·Kᵀ, dP = dO·Vᵀ
//   pv_avx512      A rows of pairs · B packed in pairs of rows:  dV += (P∘z)ᵀ·dO, dK += dSᵀ·Q,
//                  dQ += dS·K
// The operands are rounded to bf16 at the points the portable path rounds them (dO, P∘z, dS; the
// inputs are bf16 already), every sum is fp32, so the results equal the portable path's up to the
// order of fp32 sums (attention/flash_bf16.cpp derives the backward).
//
// One work item is a key/value head (b, hk). Its query heads' Q and dO are packed once; then key
// tile by key tile (K and V packed for the tile), query head by head, query tile by query tile:
// dK and dV of the key tile accumulate in registers' worth of scratch and are written once, dQ of
// every row of the group accumulates in per-thread scratch and is written at the end. Each
// gradient element has one writer and a fixed order of sums: the result is bitwise the same for
// any thread count. Score variants (soft-cap, ALiBi) are not run here (the caller sends them to
// the fp32 SIMD path).
#include "cabm/kernels/attention/flash_bf16_backward.h"

#include "cabm/core/error.h"
#include "cabm/kernels/attention/bf16_avx512.h"
#include "cabm/kernels/attention/bf16_packing.h"
#include "cabm/kernels/attention/tile_mask.h"
#include "cabm/kernels/bf16.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cabm::detail {

#if defined(CABM_HAVE_AVX512_BF16_CODE)

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kBlock = kPackedKeyBlock;  // 16 keys: one zmm of score lanes

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

struct Problem {
  int64_t B, N, H, Hkv, M, d, dv, group;
  int64_t dp, dvp2;     // d, dv rounded up to 2: rows of the products' A operands (scores_avx512)
  int64_t dqp, dvp;     // d, dv rounded up to 16: columns of dQ, dK, dV (pv_avx512)
  int64_t block_q, block_k, bq2, bk16;  // tiles; block_q rounded up to 2, block_k to 16
  int64_t query_tiles;
  float scale, qscale, keep_scale;
  bool dropout;
};

// Packs rows [0, n) of a [n][cols] bf16 operand (row r at src + r·stride) as pairs of rows,
// [n2/2][cols16][2] (the layout pv_avx512 reads as B), zero padded to n2 rows and cols16 columns.
void pack_row_pairs(const bf16* src, int64_t stride, int64_t n, int64_t cols, int64_t n2, int64_t cols16, bf16* out) {
  std::fill_n(out, n2 * cols16, bf16{0});
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < cols; ++c) out[packed_v_index(r, c, cols16)] = src[r * stride + c];
}

// Packs rows [0, n) of a [n][cols] bf16 operand as 16-row blocks of column pairs,
// [n16/16][cols2/2][16][2] (the layout scores_avx512 reads as B), zero padded.
void pack_row_blocks(const bf16* src, int64_t stride, int64_t n, int64_t cols, int64_t n16, int64_t cols2, bf16* out) {
  std::fill_n(out, n16 * cols2, bf16{0});
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < cols; ++c) out[packed_k_index(r, c, cols2)] = src[r * stride + c];
}

// Per-thread buffers. Per query head u of the group: Q rows [N][dp] and dO rows [N][dvp2] (bf16,
// the A operands of S and dP), Q and dO packed per query tile as pairs of rows
// [tiles][bq2/2][dqp|dvp][2] (the B operands of dK and dV), lse2 and D [N], dq [N][dqp]. Per key
// tile: K as 16-key blocks [bk16/16][dp/2][16][2] and V likewise (dvp2), K as pairs of keys
// [bk16/2][dqp][2], the dK and dV accumulators [bk16][dqp|dvp]. Per tile pair: S and dP [bq][lds],
// the mask and dropout rows, dS [bq][bk16] and (P∘z)ᵀ, dSᵀ [bk16][bq2] in bf16.
struct Buffers {
  std::vector<bf16> q, g, qpairs, gpairs, kblocks, vblocks, kpairs, ds, pzt, dst;
  std::vector<float> lse2, delta, dq, dk, dv, s, dpp, mask, z, ones;
  int64_t lds;
  explicit Buffers(const Problem& p)
      : q(static_cast<size_t>(p.group * p.N * p.dp)),
        g(static_cast<size_t>(p.group * p.N * p.dvp2)),
        qpairs(static_cast<size_t>(p.group * p.query_tiles * p.bq2 * p.dqp)),
        gpairs(static_cast<size_t>(p.group * p.query_tiles * p.bq2 * p.dvp)),
        kblocks(static_cast<size_t>(p.bk16 * p.dp)),
        vblocks(static_cast<size_t>(p.bk16 * p.dvp2)),
        kpairs(static_cast<size_t>(p.bk16 * p.dqp)),
        ds(static_cast<size_t>(p.block_q * p.bk16)),
        pzt(static_cast<size_t>(p.bk16 * p.bq2)),
        dst(static_cast<size_t>(p.bk16 * p.bq2)),
        lse2(static_cast<size_t>(p.group * p.N)),
        delta(static_cast<size_t>(p.group * p.N)),
        dq(static_cast<size_t>(p.group * p.N * p.dqp)),
        dk(static_cast<size_t>(p.bk16 * p.dqp)),
        dv(static_cast<size_t>(p.bk16 * p.dvp)),
        s(static_cast<size_t>(p.block_q * p.bk16)),
        dpp(static_cast<size_t>(p.block_q * p.bk16)),
        mask(static_cast<size_t>(p.block_q * p.bk16)),
        z(static_cast<size_t>(p.block_q * p.bk16)),
        ones(static_cast<size_t>(std::max(p.bq2, p.bk16)), 1.0f),
        lds(p.bk16) {}
};

struct Args {
  const AttentionSaved& saved;
  const Tensor& dout;
  const AttentionGrads& grads;
  const AttentionOptions& options;
  const TileMask& mask;
  const Problem& p;
};

// Row r of head (b, h) of an F32 [B, L, H, n] view.
float* f32_row(const Tensor& t, int64_t b, int64_t r, int64_t h) {
  return t.data<float>() + b * t.stride(0) + r * t.stride(1) + h * t.stride(2);
}

// Query head u = h − hk·group of the item: its operands, lse2 = lse·log2(e) (+inf on fully masked
// rows: P = 0 there), D_i = dO_i · O_i in fp32 (on dO before rounding, as the portable path), and
// a zero dq.
void begin_query_head(const Args& args, Buffers& buf, int64_t b, int64_t h, int64_t u) {
  const Problem& p = args.p;
  const Tensor& q = args.saved.q;
  bf16* qrows = buf.q.data() + u * p.N * p.dp;
  bf16* grows = buf.g.data() + u * p.N * p.dvp2;
  const float* lse = args.saved.lse.data<float>() + (b * p.H + h) * p.N;
  for (int64_t i = 0; i < p.N; ++i) {
    const bf16* qi = bf16_head_ptr(q, b, h) + i * q.stride(1);
    std::copy_n(qi, p.d, qrows + i * p.dp);
    if (p.dp > p.d) qrows[i * p.dp + p.d] = bf16{0};
    const float *gi = f32_row(args.dout, b, i, h), *oi = f32_row(args.saved.out, b, i, h);
    float dot = 0.0f;
    for (int64_t c = 0; c < p.dv; ++c) dot += gi[c] * oi[c];
    buf.delta[u * p.N + i] = dot;
    float_to_bf16(gi, grows + i * p.dvp2, p.dv);
    if (p.dvp2 > p.dv) grows[i * p.dvp2 + p.dv] = bf16{0};
    buf.lse2[u * p.N + i] = lse[i] == -INFINITY ? INFINITY : lse[i] * kLog2e;
  }
  for (int64_t t = 0; t < p.query_tiles; ++t) {
    const int64_t i0 = t * p.block_q, ni = std::min(p.block_q, p.N - i0);
    pack_row_pairs(qrows + i0 * p.dp, p.dp, ni, p.d, p.bq2, p.dqp,
                   buf.qpairs.data() + (u * p.query_tiles + t) * p.bq2 * p.dqp);
    pack_row_pairs(grows + i0 * p.dvp2, p.dvp2, ni, p.dv, p.bq2, p.dvp,
                   buf.gpairs.data() + (u * p.query_tiles + t) * p.bq2 * p.dvp);
  }
  std::fill_n(buf.dq.data() + u * p.N * p.dqp, p.N * p.dqp, 0.0f);
}

// From S and dP of a tile (ni rows, nk keys; lanes past nk are padding): P = exp2(min(S·qscale +
// mask − lse2, 0)) in fp32, dS = bf16(P·(dP·z − D)) into ds rows and dst columns, bf16(P·z) into
// pzt columns. Padding keys and query pairs get zeros.
CABM_AVX512_BF16 void tile_gradients(const Problem& p, Buffers& buf, int64_t ni, int64_t nk, const float* lse2,
                                     const float* delta, bool masked) {
  const int64_t lds = buf.lds, nk16 = round_up(nk, kBlock);
  const __m512 qs = _mm512_set1_ps(p.qscale), zero = _mm512_setzero_ps();
  alignas(64) bf16 pz_row[16], ds_row[16];
  for (int64_t r = 0; r < ni; ++r) {
    const float* srow = buf.s.data() + r * lds;
    const float* dprow = buf.dpp.data() + r * lds;
    const __m512 l2 = _mm512_set1_ps(lse2[r]), dr = _mm512_set1_ps(delta[r]);
    bf16* dsrow = buf.ds.data() + r * lds;
    for (int64_t c = 0; c < nk16; c += 16) {
      const __mmask16 live = nk - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (nk - c)) - 1);
      __m512 t = _mm512_mul_ps(_mm512_loadu_ps(srow + c), qs);
      if (masked) t = _mm512_add_ps(t, _mm512_loadu_ps(buf.mask.data() + r * lds + c));
      t = _mm512_min_ps(_mm512_sub_ps(t, l2), zero);  // recomputed scores may pass lse by rounding
      const __m512 prob = _mm512_maskz_mov_ps(live, exp2_nonpositive(t));
      __m512 dprob = _mm512_loadu_ps(dprow + c), pz = prob;
      if (p.dropout) {
        const __m512 z = _mm512_loadu_ps(buf.z.data() + r * lds + c);
        dprob = _mm512_mul_ps(dprob, z);
        pz = _mm512_mul_ps(prob, z);
      }
      const __m512 dt = _mm512_mul_ps(prob, _mm512_sub_ps(dprob, dr));
      const __m256i dt16 = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(dt));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dsrow + c), dt16);
      _mm256_store_si256(reinterpret_cast<__m256i*>(ds_row), dt16);
      _mm256_store_si256(reinterpret_cast<__m256i*>(pz_row), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(pz)));
      for (int64_t e = 0; e < 16; ++e) {
        buf.pzt[(c + e) * p.bq2 + r] = pz_row[e];
        buf.dst[(c + e) * p.bq2 + r] = ds_row[e];
      }
    }
  }
  if (ni < p.bq2)  // the odd row of the last query pair
    for (int64_t c = 0; c < nk16; ++c) buf.pzt[c * p.bq2 + ni] = buf.dst[c * p.bq2 + ni] = bf16{0};
}

void backward_kv_head(const Args& args, Buffers& buf, int64_t b, int64_t hk) {
  const Problem& p = args.p;
  for (int64_t u = 0; u < p.group; ++u) begin_query_head(args, buf, b, hk * p.group + u, u);
  const Tensor &k = args.saved.k, &v = args.saved.v;
  const bf16 *kh = bf16_head_ptr(k, b, hk), *vh = bf16_head_ptr(v, b, hk);
  for (int64_t j0 = 0; j0 < p.M; j0 += p.block_k) {
    const int64_t nk = std::min(p.block_k, p.M - j0), nk16 = round_up(nk, kBlock), nk2 = round_up(nk, 2);
    const Range keys{j0, j0 + nk};
    pack_row_blocks(kh + j0 * k.stride(1), k.stride(1), nk, p.d, nk16, p.dp, buf.kblocks.data());
    pack_row_blocks(vh + j0 * v.stride(1), v.stride(1), nk, p.dv, nk16, p.dvp2, buf.vblocks.data());
    pack_row_pairs(kh + j0 * k.stride(1), k.stride(1), nk, p.d, nk16, p.dqp, buf.kpairs.data());
    std::fill(buf.dk.begin(), buf.dk.end(), 0.0f);
    std::fill(buf.dv.begin(), buf.dv.end(), 0.0f);
    const Range query_range = args.mask.query_range(b, keys);
    for (int64_t u = 0; u < p.group; ++u) {
      const int64_t h = hk * p.group + u;
      const DropoutMatrix dropout(args.options, b, h, p.H, p.M);
      for (int64_t i0 = query_range.begin / p.block_q * p.block_q; i0 < query_range.end; i0 += p.block_q) {
        const int64_t ni = std::min(p.block_q, p.N - i0), ni2 = round_up(ni, 2), t = i0 / p.block_q;
        const Range rows{i0, i0 + ni};
        const TileKind kind = args.mask.classify(b, h, rows, keys);
        if (kind == TileKind::kSkip) continue;
        if (kind == TileKind::kPartial) args.mask.fill(b, h, rows, keys, kLog2e, buf.mask.data(), buf.lds, 1);
        if (p.dropout)
          for (int64_t r = 0; r < ni; ++r) dropout.fill_row(i0 + r, j0, j0 + nk, p.keep_scale, buf.z.data() + r * buf.lds, 1);
        const bf16* qrows = buf.q.data() + (u * p.N + i0) * p.dp;
        const bf16* grows = buf.g.data() + (u * p.N + i0) * p.dvp2;
        scores_avx512(qrows, ni, buf.kblocks.data(), 0, nk16, p.dp, buf.s.data(), buf.lds);
        scores_avx512(grows, ni, buf.vblocks.data(), 0, nk16, p.dvp2, buf.dpp.data(), buf.lds);
        tile_gradients(p, buf, ni, nk, buf.lse2.data() + u * p.N + i0, buf.delta.data() + u * p.N + i0,
                       kind == TileKind::kPartial);
        const float* ones = buf.ones.data();
        pv_avx512(buf.pzt.data(), p.bq2, nk, buf.gpairs.data() + (u * p.query_tiles + t) * p.bq2 * p.dvp, 0, ni2,
                  p.dvp, ones, buf.dv.data(), p.dvp);
        pv_avx512(buf.dst.data(), p.bq2, nk, buf.qpairs.data() + (u * p.query_tiles + t) * p.bq2 * p.dqp, 0, ni2,
                  p.dqp, ones, buf.dk.data(), p.dqp);
        pv_avx512(buf.ds.data(), buf.lds, ni, buf.kpairs.data(), 0, nk2, p.dqp, ones,
                  buf.dq.data() + (u * p.N + i0) * p.dqp, p.dqp);
      }
    }
    for (int64_t j = 0; j < nk; ++j) {
      float* dkrow = f32_row(args.grads.dk, b, j0 + j, hk);
      for (int64_t e = 0; e < p.d; ++e) dkrow[e] = buf.dk[j * p.dqp + e] * p.scale;
      std::copy_n(buf.dv.data() + j * p.dvp, p.dv, f32_row(args.grads.dv, b, j0 + j, hk));
    }
  }
  for (int64_t u = 0; u < p.group; ++u)
    for (int64_t i = 0; i < p.N; ++i) {
      float* dqrow = f32_row(args.grads.dq, b, i, hk * p.group + u);
      for (int64_t e = 0; e < p.d; ++e) dqrow[e] = buf.dq[(u * p.N + i) * p.dqp + e] * p.scale;
    }
}

}  // namespace

void attention_flash_bf16_backward_avx512(const AttentionSaved& saved, const Tensor& dout,
                                          const AttentionOptions& options, const AttentionGrads& grads,
                                          const FlashConfig& tiles) {
  Problem p{};
  p.B = saved.q.size(0), p.N = saved.q.size(1), p.H = saved.q.size(2), p.Hkv = saved.k.size(2);
  p.M = saved.k.size(1), p.d = saved.q.size(3), p.dv = saved.v.size(3), p.group = p.H / p.Hkv;
  p.dp = round_up(std::max<int64_t>(p.d, 1), 2), p.dvp2 = round_up(std::max<int64_t>(p.dv, 1), 2);
  p.dqp = round_up(std::max<int64_t>(p.d, 1), 16), p.dvp = round_up(std::max<int64_t>(p.dv, 1), 16);
  p.block_q = tiles.block_q, p.block_k = tiles.block_k;
  p.bq2 = round_up(p.block_q, 2), p.bk16 = round_up(p.block_k, kBlock);
  p.query_tiles = (p.N + p.block_q - 1) / p.block_q;
  p.scale = attention_scale(options, p.d);
  p.qscale = p.scale * kLog2e;
  p.keep_scale = 1.0f / (1.0f - options.dropout);
  p.dropout = options.dropout > 0.0f;
  const TileMask mask(options.mask, p.B, p.H, p.N, p.M);
  const Args args{saved, dout, grads, options, mask, p};
#pragma omp parallel
  {
    Buffers buf(p);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < p.B * p.Hkv; ++item) backward_kv_head(args, buf, item / p.Hkv, item % p.Hkv);
  }
}

#else

void attention_flash_bf16_backward_avx512(const AttentionSaved&, const Tensor&, const AttentionOptions&,
                                          const AttentionGrads&, const FlashConfig&) {
  throw Error("attention_flash_bf16_backward: the avx512_bf16 path exists on x86-64 only");
}

#endif

}  // namespace cabm::detail
