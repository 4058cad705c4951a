// The fast paths of attention_flash_bf16_backward: FlashAttention-2's backward (Dao 2023,
// Algorithm 2) with its five block products on one of two product policies, the same body:
//   Vdpbf16ps  (path avx512_bf16) the micro-kernels of the forward (attention/bf16_avx512.h):
//              scores_avx512 for S = Q·Kᵀ and dP = dO·Vᵀ (B packed in 16-key blocks of element
//              pairs), pv_avx512 for dVᵀ += dOᵀ·(P∘z), dKᵀ += Qᵀ·dS (A: Q and dO packed as pairs
//              of rows, read transposed) and dQ += dS·K;
//   Amx<Tiles> (paths amx_bf16, amx_bf16_emulated) the same five products as tile_gemm
//              (attention/amx_tile_gemm.h) on AMX tiles or on their scalar model: the inner
//              dimension of every product padded to 32, rows to 16, Qᵀ and dOᵀ packed row-major.
// dV and dK are computed transposed (keys along the columns) so that the operand computed per
// tile, P∘z or dS, is packed by interleaving two of its rows, which the pass that computes it has
// in registers. The operands are rounded to bf16 at the points the portable path rounds them (dO,
// P∘z, dS; the inputs are bf16 already), every sum is fp32, so the results equal the portable
// path's up to the order of fp32 sums (attention/flash_bf16_portable_backward.cpp derives it).
//
// One work item is a key/value head (b, hk). Its query heads' Q and dO are packed once; then key
// tile by key tile (K and V packed for the tile), query head by head, query tile by query tile:
// dKᵀ and dVᵀ of the key tile accumulate in per-thread scratch and are written once, dQ of
// every row of the group accumulates in per-thread scratch and is written at the end. With fewer
// heads than keep the threads busy, the items are (head, key tile) instead, cut into runs whose
// dQ partials are added in run order (attention/backward_split.h). Each gradient element has one
// writer and a fixed order of sums: the result is bitwise the same for any thread count. Score
// variants (soft-cap, ALiBi) are not run here (the caller sends them to the fp32 SIMD path).
#include "cabm/kernels/attention/flash_bf16_backward.h"

#include "cabm/core/error.h"
#include "cabm/kernels/aligned_vector.h"
#include "cabm/kernels/attention/amx_tile_gemm.h"
#include "cabm/kernels/attention/backward_split.h"
#include "cabm/kernels/attention/bf16_avx512.h"
#include "cabm/kernels/attention/bf16_packing.h"
#include "cabm/kernels/attention/row_prefetch.h"
#include "cabm/kernels/attention/tile_mask.h"
#include "cabm/kernels/bf16.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
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

// Rows r and r + 1 of a bf16 operand, 16 columns each (`both`: row r's in the low half), as 16
// pairs (x_r, x_r+1): the layout [rows/2][cols16][2] that pv_avx512 reads as B.
CABM_AVX512_BF16 inline void store_row_pair(__m512i both, bf16* pairs) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                           21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                           11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
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
      store_row_pair(_mm512_inserti64x4(_mm512_castsi256_si512(row0), row1, 1), out + packed_v_index(r, c, cols16));
    }
}

// The vdpbf16ps products (path avx512_bf16).
struct Vdpbf16ps {
  static constexpr int64_t kInner = 2;   // every product's inner dimension is padded to this
  static constexpr int64_t kRowPad = 1;  // S, dP and dQ are computed for rows in multiples of this
  static void begin() {}
  static void end() {}
  // s[r][c] = Σ_e a[r][e]·B[c][e] for rows r < ni (a's row stride lda, its padded width) and keys
  // c < nk16, B the 16-key blocks of element pairs (pack_row_blocks).
  static void scores(const bf16* a, int64_t ni, int64_t lda, const bf16* blocks, int64_t nk16, float* s, int64_t lds) {
    scores_avx512(a, ni, blocks, 0, nk16, lda, s, lds);
  }
  // The A operand of transposed_product from rows [0, ni) of a [ni][cols] operand, zero padded to
  // ni_in rows and cols16 columns: here pairs of rows, which pv_avx512 reads transposed.
  static void pack_transposed(const bf16* rows, int64_t stride, int64_t ni, int64_t cols, int64_t ni_in, int64_t cols16,
                              bf16* out) {
    pack_row_pairs(rows, stride, ni, cols, ni_in, cols16, out);
  }
  // c[e][j] += Σ_i A[i][e]·B[i][j] for e < cols (C's row stride ldc), j < nk16, i < ni_in; at from
  // pack_transposed (its ni_in: width), B pairs of rows [ni_in/2][nk16][2].
  static void transposed_product(const bf16* at, int64_t /*width*/, int64_t cols, int64_t cols16, int64_t ni_in,
                                 const bf16* pairs, int64_t nk16, float* c, int64_t ldc) {
    pv_avx512(at, 2, cols, pairs, 0, ni_in, nk16, nullptr, c, ldc, 2 * cols16);
  }
  // dq[r][e] += Σ_j ds[r][j]·K[j][e] for r < ni, e < dqp, j < nk_in; K as pairs of keys
  // [.][dqp][2] (pack_row_pairs).
  static void dq_product(const bf16* ds, int64_t ldds, int64_t ni, const bf16* kpairs, int64_t nk_in, int64_t dqp,
                         float* dq) {
    pv_avx512(ds, ldds, ni, kpairs, 0, nk_in, dqp, nullptr, dq, dqp);
  }
};

// The same products on AMX tiles or their scalar model (paths amx_bf16, amx_bf16_emulated): a tile
// product's inner dimension is 32 elements and its rows come 16 at a time, so operands are padded
// to those (with zeros, or with finite rows whose results are not read), and the transposed
// products' A operand is Qᵀ or dOᵀ row-major.
template <class Tiles>
struct Amx {
  static constexpr int64_t kInner = 32;
  static constexpr int64_t kRowPad = 16;
  static void begin() { Tiles::configure(); }
  static void end() { Tiles::release(); }
  static void scores(const bf16* a, int64_t ni, int64_t lda, const bf16* blocks, int64_t nk16, float* s, int64_t lds) {
    tile_gemm<Tiles>(round_up(ni, 16), nk16, lda, a, lda, {blocks, 32, 16 * lda}, s, lds, false);
  }
  static void pack_transposed(const bf16* rows, int64_t stride, int64_t ni, int64_t cols, int64_t ni_in, int64_t cols16,
                              bf16* out) {
    std::fill_n(out, cols16 * ni_in, bf16{0});
    for (int64_t i = 0; i < ni; ++i)
      for (int64_t e = 0; e < cols; ++e) out[e * ni_in + i] = rows[i * stride + e];
  }
  static void transposed_product(const bf16* at, int64_t width, int64_t /*cols*/, int64_t cols16, int64_t ni_in,
                                 const bf16* pairs, int64_t nk16, float* c, int64_t ldc) {
    tile_gemm<Tiles>(cols16, nk16, ni_in, at, width, {pairs, 2 * nk16, 32}, c, ldc, true);
  }
  static void dq_product(const bf16* ds, int64_t ldds, int64_t ni, const bf16* kpairs, int64_t nk_in, int64_t dqp,
                         float* dq) {
    tile_gemm<Tiles>(round_up(ni, 16), dqp, nk_in, ds, ldds, {kpairs, 2 * dqp, 32}, dq, dqp, true);
  }
};

struct Problem {
  int64_t B, N, H, Hkv, M, d, dv, group;
  int64_t inner, row_pad;    // the products' (kInner, kRowPad)
  int64_t d_in, dv_in;       // d, dv rounded up to inner: the A rows of S and dP
  int64_t dqp, dvp;          // d, dv rounded up to 16: columns of dQ, rows of dKᵀ and dVᵀ
  int64_t chunk;             // query rows per chunk (backward_chunk_rows): N or a multiple of block_q
  int64_t rows;              // Q, dO, dQ rows kept per query head: chunk + row_pad (whole row blocks)
  int64_t block_q, block_k;  // tiles
  int64_t bq_rows, bq_in;    // block_q rounded up to row_pad (S, dP, dS rows), to inner (Qᵀ, dOᵀ width)
  int64_t bk16, bk_in;       // block_k rounded up to 16 (S, dP columns), bk16 to inner (dS row stride)
  int64_t query_tiles;       // of a chunk
  int64_t key_tiles;
  float scale, qscale, keep_scale;
  bool dropout;
};

// Per-thread buffers. Per query head u of the group, for the chunk of query rows in hand: Q rows
// [rows][d_in] and dO rows [rows][dv_in] (bf16, the A operands of S and dP; rows past the chunk's
// are zero), Q and dO per query tile as the A operand of the transposed products
// ([tiles][bq_in·dqp|dvp], pack_transposed), lse2 and D [chunk], dq [rows][dqp]. Per key tile: K
// and V as 16-key blocks [bk16/16][d_in|dv_in / 2][16][2], K as pairs of keys [bk_in/2][dqp][2],
// the dKᵀ and dVᵀ accumulators [dqp|dvp][bk16]. Per tile pair: S, dP, the mask and dropout rows
// [bq_rows][bk16], dS [bq_rows][bk_in] in bf16 (A of dQ), and P∘z and dS as pairs of query rows
// [bq_in/2][bk16][2] (B of dVᵀ and dKᵀ).
// All 64-byte aligned (detail::AlignedVector): the AMX tiles' rows and the zmm loads each stay
// within one cache line where the row strides allow it.
struct Buffers {
  AlignedVector<bf16> q, g, qt, gt, kblocks, vblocks, kpairs, ds, pz_pairs, ds_pairs;
  AlignedVector<float> lse2, delta, dq, dkt, dvt, s, dpp, mask, z;
  AlignedVector<float> split;  // the split's sums and partials (attention/backward_split.h), sized there
  int64_t lds = 0, ldds = 0;
  RowPrefetch prefetch;  // the rows of the thread's next item (run)
  // Sized for p and zeroed, as fresh vectors would be, in the storage the thread already has
  // (thread_buffers): at N 4096 these are megabytes, and a first-touched page costs more than
  // clearing it again.
  void reset(const Problem& p) {
    const auto zeroed = [](auto& v, int64_t n) { v.assign(static_cast<size_t>(n), {}); };
    zeroed(q, p.group * p.rows * p.d_in);
    zeroed(g, p.group * p.rows * p.dv_in);
    zeroed(qt, p.group * p.query_tiles * p.bq_in * p.dqp);
    zeroed(gt, p.group * p.query_tiles * p.bq_in * p.dvp);
    zeroed(kblocks, p.bk16 * p.d_in);
    zeroed(vblocks, p.bk16 * p.dv_in);
    zeroed(kpairs, p.bk_in * p.dqp);
    zeroed(ds, p.bq_rows * p.bk_in);
    zeroed(pz_pairs, p.bq_in * p.bk16);
    zeroed(ds_pairs, p.bq_in * p.bk16);
    zeroed(lse2, p.group * p.chunk);
    zeroed(delta, p.group * p.chunk);
    zeroed(dq, p.group * p.rows * p.dqp);
    zeroed(dkt, p.dqp * p.bk16);
    zeroed(dvt, p.dvp * p.bk16);
    zeroed(s, p.bq_rows * p.bk16);
    zeroed(dpp, p.bq_rows * p.bk16);
    zeroed(mask, p.bq_rows * p.bk16);
    zeroed(z, p.bq_rows * p.bk16);
    lds = p.bk16;
    ldds = p.bk_in;
  }
};

// The calling thread's buffers, reset for p. They keep the largest size the thread has needed
// and are freed when the thread ends (as the fp32 kernels' scratch, attention/flash_item.h).
Buffers& thread_buffers(const Problem& p) {
  thread_local Buffers buffers;
  buffers.reset(p);
  return buffers;
}

struct Args {
  const AttentionSaved& saved;
  const Tensor& dout;
  const AttentionGrads& grads;
  const AttentionOptions& options;
  const TileMask& mask;
  const Problem& p;
};

// Query head u = h − hk·group of the item, rows [chunk.begin, chunk.end): their operands, lse2
// and D (backward_row_terms), and a zero dq.
template <class Products>
void begin_query_head(const Args& args, Buffers& buf, int64_t b, int64_t h, int64_t u, Range chunk) {
  const Problem& p = args.p;
  const Tensor& q = args.saved.q;
  const int64_t n = chunk.end - chunk.begin;
  bf16* qrows = buf.q.data() + u * p.rows * p.d_in;
  bf16* grows = buf.g.data() + u * p.rows * p.dv_in;
  backward_row_terms(args.saved, args.dout, b, h, chunk.begin, chunk.end, buf.delta.data() + u * p.chunk,
                     buf.lse2.data() + u * p.chunk);
  const bf16* qh = bf16_head_ptr(q, b, h) + chunk.begin * q.stride(1);
  const int64_t q_stride = q.stride(1);
  const HeadRows g_rows = head_rows(args.dout, b, h);
  for (int64_t i = 0; i < n; ++i) {
    const bf16* qi = qh + i * q_stride;
    std::copy_n(qi, p.d, qrows + i * p.d_in);
    std::fill(qrows + i * p.d_in + p.d, qrows + (i + 1) * p.d_in, bf16{0});
    float_to_bf16(g_rows.row(chunk.begin + i), grows + i * p.dv_in, p.dv);
    std::fill(grows + i * p.dv_in + p.dv, grows + (i + 1) * p.dv_in, bf16{0});
  }
  std::fill(qrows + n * p.d_in, qrows + p.rows * p.d_in, bf16{0});  // a shorter last chunk
  std::fill(grows + n * p.dv_in, grows + p.rows * p.dv_in, bf16{0});
  // Q and dO of each query tile as the A operands of dKᵀ and dVᵀ.
  for (int64_t t = 0; t * p.block_q < n; ++t) {
    const int64_t i0 = t * p.block_q, ni = std::min(p.block_q, n - i0);
    Products::pack_transposed(qrows + i0 * p.d_in, p.d_in, ni, p.d, p.bq_in, p.dqp,
                              buf.qt.data() + (u * p.query_tiles + t) * p.bq_in * p.dqp);
    Products::pack_transposed(grows + i0 * p.dv_in, p.dv_in, ni, p.dv, p.bq_in, p.dvp,
                              buf.gt.data() + (u * p.query_tiles + t) * p.bq_in * p.dvp);
  }
  std::fill_n(buf.dq.data() + u * p.rows * p.dqp, p.rows * p.dqp, 0.0f);
}

// From S and dP of a tile (ni rows, nk keys; lanes past nk are padding): P = exp2(min(S·qscale +
// mask − lse2, 0)) in fp32 (the forward's weights: exp2_weights), dS = bf16(P·(dP·z − D)) into ds
// rows and ds_pairs, bf16(P·z) into pz_pairs (pairs of rows [ni_in/2][nk16][2]). Padding keys (to
// nk_in in ds), padding rows (to ni_in in the pairs, to the row padding in ds) get zeros: the
// products read them.
CABM_AVX512_BF16 void tile_gradients(const Problem& p, Buffers& buf, int64_t ni, int64_t nk, const float* lse2,
                                     const float* delta, bool masked) {
  const int64_t lds = buf.lds, ldds = buf.ldds, nk16 = round_up(nk, kBlock), nk_in = round_up(nk, p.inner);
  const __m512 qs = _mm512_set1_ps(p.qscale), zero = _mm512_setzero_ps();
  for (int64_t r0 = 0; r0 < ni; r0 += 2) {
    for (int64_t c = 0; c < nk16; c += 16) {
      const __mmask16 live = nk - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (nk - c)) - 1);
      __m512 pz32[2], ds32[2];  // rows r0 and r0 + 1, converted together (bf16_pair)
      for (int64_t h = 0; h < 2; ++h) {
        const int64_t r = r0 + h;
        if (r == ni) {
          pz32[h] = ds32[h] = zero;
          continue;
        }
        // The exponent as the forward's (exponent, attention/bf16_avx512.h) with lse for the maximum.
        const __m512 t =
            _mm512_min_ps(exponent(_mm512_loadu_ps(buf.s.data() + r * lds + c),
                                   masked ? buf.mask.data() + r * lds + c : nullptr, qs, _mm512_set1_ps(lse2[r])),
                          zero);  // recomputed scores may pass lse
        const __m512 prob = _mm512_maskz_mov_ps(live, exp2_weights(t));
        __m512 dprob = _mm512_loadu_ps(buf.dpp.data() + r * lds + c), pz = prob;
        if (p.dropout) {
          const __m512 z = _mm512_loadu_ps(buf.z.data() + r * lds + c);
          dprob = _mm512_mul_ps(dprob, z);
          pz = _mm512_mul_ps(prob, z);
        }
        ds32[h] = _mm512_mul_ps(prob, _mm512_sub_ps(dprob, _mm512_set1_ps(delta[r])));
        pz32[h] = pz;
      }
      const __m512i ds_rows = bf16_pair(ds32[0], ds32[1]);  // row r0's 16 in the low half
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf.ds.data() + r0 * ldds + c), _mm512_castsi512_si256(ds_rows));
      if (r0 + 1 < ni)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf.ds.data() + (r0 + 1) * ldds + c),
                            _mm512_extracti64x4_epi64(ds_rows, 1));
      store_row_pair(bf16_pair(pz32[0], pz32[1]), buf.pz_pairs.data() + packed_v_index(r0, c, nk16));
      store_row_pair(ds_rows, buf.ds_pairs.data() + packed_v_index(r0, c, nk16));
    }
  }
  if (nk_in > nk16)
    for (int64_t r = 0; r < ni; ++r)
      std::fill(buf.ds.data() + r * ldds + nk16, buf.ds.data() + r * ldds + nk_in, bf16{0});
  std::fill(buf.ds.data() + ni * ldds, buf.ds.data() + round_up(ni, p.row_pad) * ldds, bf16{0});
  const int64_t pairs_end = round_up(ni, p.inner) * nk16;
  std::fill(buf.pz_pairs.data() + round_up(ni, 2) * nk16, buf.pz_pairs.data() + pairs_end, bf16{0});
  std::fill(buf.ds_pairs.data() + round_up(ni, 2) * nk16, buf.ds_pairs.data() + pairs_end, bf16{0});
}

// Key tile kt of key/value head (b, hk) against the chunk's query rows, after begin_query_head for
// each query head of the group: K and V of the tile packed, then query head by head, query tile by
// query tile, the five products; the tile's dK and dV rows are written by the first chunk and
// added to by the later ones, dQ of the chunk's rows accumulates in buf.dq.
template <class Products>
void backward_key_tile(const Args& args, Buffers& buf, int64_t b, int64_t hk, int64_t kt, Range chunk) {
  const Problem& p = args.p;
  const Tensor &k = args.saved.k, &v = args.saved.v;
  const bf16 *kh = bf16_head_ptr(k, b, hk), *vh = bf16_head_ptr(v, b, hk);
  const HeadRows dk_rows = head_rows(args.grads.dk, b, hk), dv_rows = head_rows(args.grads.dv, b, hk);
  const int64_t j0 = kt * p.block_k;
  const int64_t nk = std::min(p.block_k, p.M - j0), nk16 = round_up(nk, kBlock), nk_in = round_up(nk, p.inner);
  const Range keys{j0, j0 + nk};
  pack_row_blocks_avx512(kh + j0 * k.stride(1), k.stride(1), nk, p.d, nk16, p.d_in, buf.kblocks.data());
  pack_row_blocks_avx512(vh + j0 * v.stride(1), v.stride(1), nk, p.dv, nk16, p.dv_in, buf.vblocks.data());
  pack_row_pairs(kh + j0 * k.stride(1), k.stride(1), nk, p.d, round_up(nk16, p.inner), p.dqp, buf.kpairs.data());
  std::fill(buf.dkt.begin(), buf.dkt.end(), 0.0f);
  std::fill(buf.dvt.begin(), buf.dvt.end(), 0.0f);
  const Range query_range = args.mask.query_range(b, keys);
  for (int64_t u = 0; u < p.group; ++u) {
    const int64_t h = hk * p.group + u;
    const DropoutMatrix dropout(args.options, b, h, p.H, p.M);
    const int64_t first = std::max(query_range.begin / p.block_q * p.block_q, chunk.begin);
    for (int64_t i0 = first; i0 < std::min(query_range.end, chunk.end); i0 += p.block_q) {
      const int64_t ni = std::min(p.block_q, p.N - i0), ni_in = round_up(ni, p.inner);
      const int64_t li = i0 - chunk.begin, t = li / p.block_q;  // the row and the tile in the buffers
      const Range rows{i0, i0 + ni};
      const TileKind kind = args.mask.classify(b, h, rows, keys);
      if (kind == TileKind::kSkip) continue;
      if (kind == TileKind::kPartial) args.mask.fill(b, h, rows, keys, kLog2e, buf.mask.data(), buf.lds, 1);
      if (p.dropout)
        for (int64_t r = 0; r < ni; ++r)
          dropout.fill_row(i0 + r, j0, j0 + nk, p.keep_scale, buf.z.data() + r * buf.lds, 1);
      const bf16* qrows = buf.q.data() + (u * p.rows + li) * p.d_in;
      const bf16* grows = buf.g.data() + (u * p.rows + li) * p.dv_in;
      buf.prefetch.pump();
      Products::scores(qrows, ni, p.d_in, buf.kblocks.data(), nk16, buf.s.data(), buf.lds);
      buf.prefetch.pump();
      Products::scores(grows, ni, p.dv_in, buf.vblocks.data(), nk16, buf.dpp.data(), buf.lds);
      tile_gradients(p, buf, ni, nk, buf.lse2.data() + u * p.chunk + li, buf.delta.data() + u * p.chunk + li,
                     kind == TileKind::kPartial);
      const bf16* gt = buf.gt.data() + (u * p.query_tiles + t) * p.bq_in * p.dvp;
      const bf16* qt = buf.qt.data() + (u * p.query_tiles + t) * p.bq_in * p.dqp;
      buf.prefetch.pump();
      Products::transposed_product(gt, p.bq_in, p.dv, p.dvp, ni_in, buf.pz_pairs.data(), nk16, buf.dvt.data(), p.bk16);
      buf.prefetch.pump();
      Products::transposed_product(qt, p.bq_in, p.d, p.dqp, ni_in, buf.ds_pairs.data(), nk16, buf.dkt.data(), p.bk16);
      buf.prefetch.pump();
      Products::dq_product(buf.ds.data(), buf.ldds, ni, buf.kpairs.data(), nk_in, p.dqp,
                           buf.dq.data() + (u * p.rows + li) * p.dqp);
    }
  }
  const bool first_chunk = chunk.begin == 0;
  for (int64_t j = 0; j < nk; ++j) {
    float *dkrow = dk_rows.row(j0 + j), *dvrow = dv_rows.row(j0 + j);
    for (int64_t e = 0; e < p.d; ++e) {
      const float x = buf.dkt[e * p.bk16 + j] * p.scale;
      dkrow[e] = first_chunk ? x : dkrow[e] + x;
    }
    for (int64_t e = 0; e < p.dv; ++e)
      dvrow[e] = first_chunk ? buf.dvt[e * p.bk16 + j] : dvrow[e] + buf.dvt[e * p.bk16 + j];
  }
}

// dQ of the chunk's rows of the group's query heads from their unscaled sums dq ([group][rows][dqp],
// as buf.dq).
void write_dq(const Args& args, const float* dq, int64_t b, int64_t hk, Range chunk) {
  const Problem& p = args.p;
  for (int64_t u = 0; u < p.group; ++u) {
    const HeadRows dq_rows = head_rows(args.grads.dq, b, hk * p.group + u);
    for (int64_t i = chunk.begin; i < chunk.end; ++i) {
      float* dqrow = dq_rows.row(i);
      const float* sum = dq + (u * p.rows + i - chunk.begin) * p.dqp;
      for (int64_t e = 0; e < p.d; ++e) dqrow[e] = sum[e] * p.scale;
    }
  }
}

template <class Products>
void begin_chunk(const Args& args, Buffers& buf, int64_t b, int64_t hk, Range chunk) {
  for (int64_t u = 0; u < args.p.group; ++u) begin_query_head<Products>(args, buf, b, hk * args.p.group + u, u, chunk);
}

// Whole-head mode: the head's chunks in order, each against every key tile.
template <class Products>
void backward_kv_head(const Args& args, Buffers& buf, int64_t b, int64_t hk) {
  const Problem& p = args.p;
  for (int64_t i0 = 0; i0 < p.N; i0 += p.chunk) {
    const Range chunk{i0, std::min(p.N, i0 + p.chunk)};
    begin_chunk<Products>(args, buf, b, hk, chunk);
    for (int64_t kt = 0; kt < p.key_tiles; ++kt) backward_key_tile<Products>(args, buf, b, hk, kt, chunk);
    write_dq(args, buf.dq.data(), b, hk, chunk);
  }
}

// Split mode (attention/backward_split.h), chunk by chunk: the chunks of whole-head mode in the
// same order, so that dK and dV get the same bits either way. Called by every thread of the
// parallel region (it contains barriers).
template <class Products>
void backward_split_chunks(const Args& args, Buffers& buf, std::vector<int64_t>& prefix,
                           std::vector<SplitPartials>& shared, int t, int T) {
  const Problem& p = args.p;
  const int64_t heads = p.B * p.Hkv, acc_floats = p.group * p.rows * p.dqp;
  buf.split.resize(static_cast<size_t>(split_sum_floats(t, T, acc_floats)));
  for (int64_t i0 = 0; i0 < p.N; i0 += p.chunk) {
    const Range chunk{i0, std::min(p.N, i0 + p.chunk)};
#pragma omp single
    split_costs(args.mask, heads, p.Hkv, p.group, p.M, p.block_k, chunk, prefix);  // (then a barrier)
    split_key_tiles(
        prefix, p.key_tiles, acc_floats, buf.dq.data(), buf.split.data(), shared, t, T,
        [&](int64_t hd) { begin_chunk<Products>(args, buf, hd / p.Hkv, hd % p.Hkv, chunk); },
        [&](int64_t hd, int64_t kt) { backward_key_tile<Products>(args, buf, hd / p.Hkv, hd % p.Hkv, kt, chunk); },
        [&](int64_t hd, const float* dq) { write_dq(args, dq, hd / p.Hkv, hd % p.Hkv, chunk); });
  }
}

template <class Products>
void run(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options, const AttentionGrads& grads,
         const FlashConfig& tiles) {
  Problem p{};
  p.B = saved.q.size(0), p.N = saved.q.size(1), p.H = saved.q.size(2), p.Hkv = saved.k.size(2);
  p.M = saved.k.size(1), p.d = saved.q.size(3), p.dv = saved.v.size(3), p.group = p.H / p.Hkv;
  p.inner = Products::kInner, p.row_pad = Products::kRowPad;
  p.d_in = round_up(std::max<int64_t>(p.d, 1), p.inner), p.dv_in = round_up(std::max<int64_t>(p.dv, 1), p.inner);
  p.dqp = round_up(std::max<int64_t>(p.d, 1), 16), p.dvp = round_up(std::max<int64_t>(p.dv, 1), 16);
  p.block_q = tiles.block_q, p.block_k = tiles.block_k;
  // A row's buffers (begin_query_head): Q, dO, their transposed copies, dQ, lse2 and D.
  const int64_t row_bytes = p.group * (2 * (p.d_in + p.dv_in + p.dqp + p.dvp) + 4 * p.dqp + 8);
  p.chunk = backward_chunk_rows(p.N, p.block_q, row_bytes, tiles);
  p.rows = p.chunk + p.row_pad;
  p.bq_rows = round_up(p.block_q, p.row_pad), p.bq_in = round_up(p.block_q, p.inner);
  p.bk16 = round_up(p.block_k, kBlock), p.bk_in = round_up(p.bk16, p.inner);
  p.query_tiles = (p.chunk + p.block_q - 1) / p.block_q, p.key_tiles = (p.M + p.block_k - 1) / p.block_k;
  p.scale = attention_scale(options, p.d);
  p.qscale = p.scale * kLog2e;
  p.keep_scale = 1.0f / (1.0f - options.dropout);
  p.dropout = options.dropout > 0.0f;
  // No query reaches K and V (the chunks walk query rows). (A Tensor copy is a view of the same storage.)
  if (p.N == 0) {
    Tensor(grads.dk).fill(0.0f);
    Tensor(grads.dv).fill(0.0f);
    return;
  }
  const TileMask mask(options.mask, p.B, p.H, p.N, p.M);
  const Args args{saved, dout, grads, options, mask, p};
  // Whole heads when they balance over the processors, else runs of (head, key tile) items
  // (attention/backward_split.h, as the fp32 backward). Neither depends on the thread count.
  const int64_t heads = p.B * p.Hkv;
  const bool whole_heads = backward_whole_heads(heads);
  std::vector<int64_t> prefix(static_cast<size_t>(whole_heads ? 0 : heads * p.key_tiles + 1), 0);  // of the split
  std::vector<SplitPartials> partials(static_cast<size_t>(omp_get_max_threads()));
  // Whole heads are claimed one ahead (a shared counter, as `omp for schedule(dynamic, 1)` would
  // hand them out), so that a thread asks for its next head's rows while it works on this one
  // (queue_backward_head, when a head is one chunk; the tile loop pumps before each of its five
  // products, over about half the tile pairs with a diagonal mask, for each query head of the group).
  const int64_t pumps = 5 * p.key_tiles * p.query_tiles * p.group / 2;
  std::atomic<int64_t> next_head{0};
#pragma omp parallel
  {
    Buffers& buf = thread_buffers(p);
    Products::begin();  // per thread: the tile configuration
    if (whole_heads) {
      for (int64_t hd = next_head.fetch_add(1); hd < heads;) {
        const int64_t following = next_head.fetch_add(1);
        if (following < heads && p.chunk == p.N)
          queue_backward_head(buf.prefetch, saved, dout, grads, following / p.Hkv, following % p.Hkv, pumps);
        else
          buf.prefetch.clear();
        backward_kv_head<Products>(args, buf, hd / p.Hkv, hd % p.Hkv);
        hd = following;
      }
    } else {
      buf.prefetch.clear();
      backward_split_chunks<Products>(args, buf, prefix, partials, omp_get_thread_num(), omp_get_num_threads());
    }
    Products::end();
  }
}

}  // namespace

void attention_flash_bf16_backward_packed(const AttentionSaved& saved, const Tensor& dout,
                                          const AttentionOptions& options, const AttentionGrads& grads,
                                          const FlashConfig& tiles, Bf16Products products) {
  switch (products) {
    case Bf16Products::kVdpbf16ps:
      return run<Vdpbf16ps>(saved, dout, options, grads, tiles);
    case Bf16Products::kAmxTiles:
      return run<Amx<HardwareTiles>>(saved, dout, options, grads, tiles);
    case Bf16Products::kAmxEmulated:
      return run<Amx<EmulatedTiles>>(saved, dout, options, grads, tiles);
  }
}

#else

void attention_flash_bf16_backward_packed(const AttentionSaved&, const Tensor&, const AttentionOptions&,
                                          const AttentionGrads&, const FlashConfig&, Bf16Products) {
  throw Error("attention_flash_bf16_backward: the avx512_bf16 and amx_bf16 paths exist on x86-64 only");
}

#endif

}  // namespace cabm::detail
