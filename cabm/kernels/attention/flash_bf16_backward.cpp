// The avx512_bf16 path of attention_flash_bf16_backward: FlashAttention-2's backward (Dao 2023,
// Algorithm 2) with its five block products on vdpbf16ps, through the two micro-kernels of the
// forward (attention/bf16_avx512.h):
//   scores_avx512  A rows · Bᵀ, B packed in 16-key blocks of element pairs:  S = Q·Kᵀ, dP = dO·Vᵀ
//   pv_avx512      A rows of pairs · B packed in pairs of rows:  dVᵀ += dOᵀ·(P∘z), dKᵀ += Qᵀ·dS,
//                  dQ += dS·K
// dV and dK are computed transposed (keys along the lanes) so that the tile operand, P∘z or dS,
// is packed by interleaving two of its rows, which the pass that computes it has in registers;
// dO and Q are packed once per query head as pairs of rows, which pv_avx512 reads transposed.
// The operands are rounded to bf16 at the points the portable path rounds them (dO, P∘z, dS; the
// inputs are bf16 already), every sum is fp32, so the results equal the portable path's up to the
// order of fp32 sums (attention/flash_bf16.cpp derives the backward).
//
// One work item is a key/value head (b, hk). Its query heads' Q and dO are packed once; then key
// tile by key tile (K and V packed for the tile), query head by head, query tile by query tile:
// dKᵀ and dVᵀ of the key tile accumulate in per-thread scratch and are written once, dQ of
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
#include <cstring>
#include <vector>

namespace cabm::detail {

#if defined(CABM_HAVE_AVX512_BF16_CODE)

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kBlock = kPackedKeyBlock;  // 16 keys: one zmm of score lanes

int64_t round_up(int64_t a, int64_t b) {
  return (a + b - 1) / b * b;
}

struct Problem {
  int64_t B, N, H, Hkv, M, d, dv, group;
  int64_t dp, dvp2;                     // d, dv rounded up to 2: rows of the products' A operands (scores_avx512)
  int64_t dqp, dvp;                     // d, dv rounded up to 16: columns of dQ, dK, dV (pv_avx512)
  int64_t block_q, block_k, bq2, bk16;  // tiles; block_q rounded up to 2, block_k to 16
  int64_t query_tiles;
  float scale, qscale, keep_scale;
  bool dropout;
};

// Rows r (and r + 1) of a bf16 operand, 16 columns each, as 16 pairs (x_r, x_r+1): the layout
// [rows/2][cols16][2] that pv_avx512 reads as B.
CABM_AVX512_BF16 inline void store_row_pair(__m256i row0, __m256i row1, bf16* pairs) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                           21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                           11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(row0), row1, 1);
  _mm512_storeu_si512(pairs, _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), both));
}

// Packs rows [0, n) of a [n][cols] bf16 operand (row r at src + r·stride) as pairs of rows,
// [n2/2][cols16][2] (the layout pv_avx512 reads as B, or as A with ldp 2), zero padded to n2
// rows (even) and cols16 columns (a multiple of 16).
CABM_AVX512_BF16 void pack_row_pairs(const bf16* src, int64_t stride, int64_t n, int64_t cols, int64_t n2,
                                     int64_t cols16, bf16* out) {
  for (int64_t r = 0; r < n2; r += 2)
    for (int64_t c = 0; c < cols16; c += 16) {
      const __mmask16 live = cols - c >= 16 ? __mmask16(0xffff) : cols > c ? __mmask16((1u << (cols - c)) - 1) : 0;
      const __m256i row0 = r < n ? _mm256_maskz_loadu_epi16(live, src + r * stride + c) : _mm256_setzero_si256();
      const __m256i row1 =
          r + 1 < n ? _mm256_maskz_loadu_epi16(live, src + (r + 1) * stride + c) : _mm256_setzero_si256();
      store_row_pair(row0, row1, out + packed_v_index(r, c, cols16));
    }
}

// Per-thread buffers. Per query head u of the group: Q rows [N][dp] and dO rows [N][dvp2] (bf16,
// the A operands of S and dP), Q and dO per query tile as pairs of rows [tiles][bq2/2][dqp|dvp][2]
// (bf16, read transposed: the A operands of dKᵀ and dVᵀ), lse2 and D [N], dq [N][dqp]. Per key tile: K and V as 16-key
// blocks [bk16/16][dp|dvp2 / 2][16][2], K as pairs of keys [bk16/2][dqp][2], the dKᵀ and dVᵀ accumulators [d|dv][bk16].
// Per tile pair: S and dP [bq][lds], the mask and dropout rows, dS [bq][lds] in bf16 (A of dQ), and P∘z and dS as pairs
// of query rows [bq2/2][bk16][2] (B of dVᵀ and dKᵀ).
struct Buffers {
  std::vector<bf16> q, g, qpairs, gpairs, kblocks, vblocks, kpairs, ds, pz_pairs, ds_pairs;
  std::vector<float> lse2, delta, dq, dkt, dvt, s, dpp, mask, z;
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
        pz_pairs(static_cast<size_t>(p.bq2 * p.bk16)),
        ds_pairs(static_cast<size_t>(p.bq2 * p.bk16)),
        lse2(static_cast<size_t>(p.group * p.N)),
        delta(static_cast<size_t>(p.group * p.N)),
        dq(static_cast<size_t>(p.group * p.N * p.dqp)),
        dkt(static_cast<size_t>(p.d * p.bk16)),
        dvt(static_cast<size_t>(p.dv * p.bk16)),
        s(static_cast<size_t>(p.block_q * p.bk16)),
        dpp(static_cast<size_t>(p.block_q * p.bk16)),
        mask(static_cast<size_t>(p.block_q * p.bk16)),
        z(static_cast<size_t>(p.block_q * p.bk16)),
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

// Query head u = h − hk·group of the item: its operands, its rows' lse2 and D (backward_row_terms),
// and a zero dq.
void begin_query_head(const Args& args, Buffers& buf, int64_t b, int64_t h, int64_t u) {
  const Problem& p = args.p;
  const Tensor& q = args.saved.q;
  bf16* qrows = buf.q.data() + u * p.N * p.dp;
  bf16* grows = buf.g.data() + u * p.N * p.dvp2;
  backward_row_terms(args.saved, args.dout, b, h, buf.delta.data() + u * p.N, buf.lse2.data() + u * p.N);
  for (int64_t i = 0; i < p.N; ++i) {
    const bf16* qi = bf16_head_ptr(q, b, h) + i * q.stride(1);
    std::copy_n(qi, p.d, qrows + i * p.dp);
    if (p.dp > p.d) qrows[i * p.dp + p.d] = bf16{0};
    float_to_bf16(f32_row(args.dout, b, i, h), grows + i * p.dvp2, p.dv);
    if (p.dvp2 > p.dv) grows[i * p.dvp2 + p.dv] = bf16{0};
  }
  // Q and dO of each query tile as pairs of rows (read transposed: the A operands of dKᵀ and dVᵀ).
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
// mask − lse2, 0)) in fp32, dS = bf16(P·(dP·z − D)) into ds rows and ds_pairs, bf16(P·z) into
// pz_pairs (pairs of rows [ni2/2][nk16][2]). Padding keys, and the odd row of a last row pair, get
// zeros.
CABM_AVX512_BF16 void tile_gradients(const Problem& p, Buffers& buf, int64_t ni, int64_t nk, const float* lse2,
                                     const float* delta, bool masked) {
  const int64_t lds = buf.lds, nk16 = round_up(nk, kBlock);
  const __m512 qs = _mm512_set1_ps(p.qscale), zero = _mm512_setzero_ps();
  for (int64_t r0 = 0; r0 < ni; r0 += 2) {
    for (int64_t c = 0; c < nk16; c += 16) {
      const __mmask16 live = nk - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (nk - c)) - 1);
      __m256i pz16[2], ds16[2];
      for (int64_t h = 0; h < 2; ++h) {
        const int64_t r = r0 + h;
        if (r == ni) {
          pz16[h] = ds16[h] = _mm256_setzero_si256();
          continue;
        }
        __m512 t = _mm512_mul_ps(_mm512_loadu_ps(buf.s.data() + r * lds + c), qs);
        if (masked) t = _mm512_add_ps(t, _mm512_loadu_ps(buf.mask.data() + r * lds + c));
        t = _mm512_min_ps(_mm512_sub_ps(t, _mm512_set1_ps(lse2[r])), zero);  // recomputed scores may pass lse
        const __m512 prob = _mm512_maskz_mov_ps(live, exp2_nonpositive(t));
        __m512 dprob = _mm512_loadu_ps(buf.dpp.data() + r * lds + c), pz = prob;
        if (p.dropout) {
          const __m512 z = _mm512_loadu_ps(buf.z.data() + r * lds + c);
          dprob = _mm512_mul_ps(dprob, z);
          pz = _mm512_mul_ps(prob, z);
        }
        const __m512 dt = _mm512_mul_ps(prob, _mm512_sub_ps(dprob, _mm512_set1_ps(delta[r])));
        ds16[h] = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(dt));
        pz16[h] = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(pz));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf.ds.data() + r * lds + c), ds16[h]);
      }
      store_row_pair(pz16[0], pz16[1], buf.pz_pairs.data() + packed_v_index(r0, c, nk16));
      store_row_pair(ds16[0], ds16[1], buf.ds_pairs.data() + packed_v_index(r0, c, nk16));
    }
  }
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
    std::fill(buf.dkt.begin(), buf.dkt.end(), 0.0f);
    std::fill(buf.dvt.begin(), buf.dvt.end(), 0.0f);
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
          for (int64_t r = 0; r < ni; ++r)
            dropout.fill_row(i0 + r, j0, j0 + nk, p.keep_scale, buf.z.data() + r * buf.lds, 1);
        const bf16* qrows = buf.q.data() + (u * p.N + i0) * p.dp;
        const bf16* grows = buf.g.data() + (u * p.N + i0) * p.dvp2;
        scores_avx512(qrows, ni, buf.kblocks.data(), 0, nk16, p.dp, buf.s.data(), buf.lds);
        scores_avx512(grows, ni, buf.vblocks.data(), 0, nk16, p.dvp2, buf.dpp.data(), buf.lds);
        tile_gradients(p, buf, ni, nk, buf.lse2.data() + u * p.N + i0, buf.delta.data() + u * p.N + i0,
                       kind == TileKind::kPartial);
        const bf16* gpairs = buf.gpairs.data() + (u * p.query_tiles + t) * p.bq2 * p.dvp;
        const bf16* qpairs = buf.qpairs.data() + (u * p.query_tiles + t) * p.bq2 * p.dqp;
        pv_avx512(gpairs, 2, p.dv, buf.pz_pairs.data(), 0, ni2, nk16, nullptr, buf.dvt.data(), p.bk16, 2 * p.dvp);
        pv_avx512(qpairs, 2, p.d, buf.ds_pairs.data(), 0, ni2, nk16, nullptr, buf.dkt.data(), p.bk16, 2 * p.dqp);
        pv_avx512(buf.ds.data(), buf.lds, ni, buf.kpairs.data(), 0, nk2, p.dqp, nullptr,
                  buf.dq.data() + (u * p.N + i0) * p.dqp, p.dqp);
      }
    }
    for (int64_t j = 0; j < nk; ++j) {
      float* dkrow = f32_row(args.grads.dk, b, j0 + j, hk);
      for (int64_t e = 0; e < p.d; ++e) dkrow[e] = buf.dkt[e * p.bk16 + j] * p.scale;
      float* dvrow = f32_row(args.grads.dv, b, j0 + j, hk);
      for (int64_t e = 0; e < p.dv; ++e) dvrow[e] = buf.dvt[e * p.bk16 + j];
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
