// The forward tile loop of the tiled attention kernel and its driver, compiled once per
// instruction set: attention/flash_{avx512,avx2,portable}.cpp include this file inside a `#pragma
// GCC target` region after attention/flash_item.h (every header outside the region), having
// defined CABM_SIMD_LEVEL and CABM_SIMD_NS (simd.h) and CABM_FLASH_SET (the namespace of
// this set's drivers: avx512, avx2 or portable), the scheme of attention_decode_body.h.
// Everything here has internal linkage but the explicit instantiations of forward<T>.
#include "cabm/kernels/attention/score_epilogue.h"
#include "cabm/kernels/simd.h"
#include "cabm/kernels/attention/tile_product.h"
#include "cabm/kernels/attention/tile_transpose.h"

namespace cabm::flash::CABM_FLASH_SET {
namespace {

namespace simd = ::cabm::CABM_SIMD_NS;
using simd::kWidth;
using simd::Vec;
using HeadScores = simd::HeadScores;
// The block products: tile_product and its micro-kernel (attention/tile_product.h).
using simd::tile::Accum;
using simd::tile::tile_product;
using simd::tile::transpose_scaled;

// ---------------------------------------------------------------------------------------------
// Forward. One work item is (b, h, query tile). Its buffers hold the tile transposed, lanes over
// the query rows, so the online softmax is purely vertical: the running maximum and sum of row i
// live in lane i, and rescaling the accumulator Oᵀ is one multiply per vector.

struct ForwardBuffers {
  int64_t ld;  // lanes: block_q rounded up to the vector width
  float *qt, *s, *o, *mask, *z, *m, *l, *alpha, *tile_max;
  float *qoff, *koff;  // ALiBi: positions of the tile's queries and keys (attention/score_variants.h)
  explicit ForwardBuffers(const Problem& p)
      : ld(round_up(p.block_q, kWidth)),
        qt(scratch(kQt, p.d * ld)),
        s(scratch(kS, p.block_k * ld)),
        o(scratch(kO, p.dv * ld)),
        mask(scratch(kMaskTile, p.block_k * ld)),
        z(p.dropout ? scratch(kZ, p.block_k * ld) : nullptr),
        m(scratch(kM, ld)),
        l(scratch(kL, ld)),
        alpha(scratch(kAlpha, ld)),
        tile_max(scratch(kTileMax, ld)),
        qoff(p.variants.slopes ? scratch(kQOff, ld) : nullptr),
        koff(p.variants.slopes ? scratch(kKOff, p.block_k) : nullptr) {}
};

// V's packed head (M·dv floats): its keys in panels on the block_k grid, each panel transposed
// (dv rows of its keys; the panel starting at key j0 holds panel_keys(p, j0) of them, block_k but
// for the last), so that the rows O += P·V broadcasts from (one value dimension over the tile's
// keys) are contiguous. Packed as rows, each of the micro-kernel's k steps read from a new
// 4·dv-byte row: one Xeon core (session 30, 64 queries against 4,096 keys, K and V streaming from
// L3) ran P·V at 32–33 FMAs per TSC cycle at d 64 and 29–30 at d 128, with panels at 34–35 at both.
inline int64_t panel_keys(const Problem& p, int64_t j0) {
  return std::min(p.block_k, p.M - j0);
}

struct ForwardArgs {
  const Tensor &q, &out;
  const float *k, *v;  // packed key/value heads first_head, first_head + 1, ...: [heads, M, d]; V in panels
  int64_t first_head;  // b·Hkv + hk of the first packed head (see attention_flash_forward)
  float* lse;          // [B, H, N] or null
  const AttentionOptions& options;
  const TileMask& mask;
  const Problem& p;
};

// kVariants: soft-capping or ALiBi on (attention/score_variants.h); without, the plain tile loop.
template <typename T, bool kVariants>
void forward_query_tile(const ForwardArgs& args, ForwardBuffers& buf, int64_t b, int64_t h, int64_t qt) {
  const Problem& p = args.p;
  const int64_t i0 = qt * p.block_q, ni = std::min(p.block_q, p.N - i0);
  const int64_t lanes = round_up(ni, kWidth), ld = buf.ld;
  const Range rows{i0, i0 + ni};
  const InputRows<T> q = input_rows<T>(args.q, b, h);
  const HeadRows out = head_rows(args.out, b, h);
  prefetch_rows_for_write(out.data + i0 * out.stride, out.stride, ni, p.dv);
  const int64_t packed = b * p.Hkv + h / p.group - args.first_head;
  const HeadRows k{const_cast<float*>(args.k) + packed * p.M * p.d, p.d};
  const float* const vt = args.v + packed * p.M * p.dv;

  // Qᵀ, pre-multiplied by scale·log2(e) so that the scores come out in base 2: exp2 is cheaper
  // (by the operand scale of the variants with them); lanes [ni, lanes) zero.
  const float qscale = kVariants ? p.operand_scale : p.scale * kLog2e;
  float* qt_buf = buf.qt;
  transpose_scaled<true>(q.row(i0), q.stride, ni, p.d, qscale, qt_buf, ld);
  // Running maximum (base-2 scores) and sum. −FLT_MAX rather than −inf keeps exp2(s − m) free of
  // inf − inf for rows that have seen only masked scores so far.
  float *m = buf.m, *l = buf.l, *alpha = buf.alpha, *s = buf.s, *o = buf.o;
  std::fill_n(m, lanes, -FLT_MAX);
  std::fill_n(l, lanes, 0.0f);
  bool first = true;
  const DropoutMatrix dropout(args.options, b, h, p.H, p.M);
  const HeadScores variants(p.variants, h);
  // ALiBi offsets relative to the tile's first query position.
  const int64_t pos_base = p.variants.q_position(i0);
  if (kVariants && p.variants.slopes) position_offsets(p.variants, true, i0, ni, lanes, pos_base, buf.qoff);

  // fp32: no cut at the diagonal (align 0); cut at 6 keys it measured no faster (Zen 4, N 4096,
  // causal, one thread, three rounds, avx2 and avx512 sets: within ±1%, d 128 on avx2 up to 3%
  // slower). bf16 (these tiles are its avx2_fp32 and avx512_fp32 paths): the cut of every bf16 path.
  const KeyTiles tiles = args.mask.key_tiles(b, rows, p.block_k, kRoundsProducts<T> ? kBf16DiagonalCut : 0);
  for (int64_t j0 = tiles.first(); j0 < tiles.end(); j0 += tiles.width(j0)) {
    const int64_t nk = tiles.width(j0);
    const Range keys{j0, j0 + nk};
    const TileKind kind = args.mask.classify(b, h, rows, keys);
    if (kind == TileKind::kSkip) continue;
    if (kind == TileKind::kPartial) {
      args.mask.fill(b, h, rows, keys, kLog2e, buf.mask, 1, ld);
      if (args.mask.per_element()) {  // skip a tile the tensors block entirely
        bool any = false;
        for (int64_t r = 0; r < nk && !any; ++r)
          for (int64_t c = 0; c < ni && !any; ++c) any = buf.mask[r * ld + c] != -INFINITY;
        if (!any) continue;
      }
    }
    // Sᵀ[j][i] = log2(e)·scale·k_j·q_i (+ mask). Without a mask the kernel also leaves each lane's
    // maximum over the tile in tile_max.
    float* tile_max = buf.tile_max;
    std::fill_n(tile_max, lanes, -INFINITY);
    if constexpr (kVariants) {
      // The epilogue (soft-cap, ALiBi), then the mask where the tile has one.
      tile_product(nk, lanes, p.d, {k.row(j0), k.stride, 1}, {qt_buf, ld}, {s, ld}, Accum::kOverwrite);
      if (p.variants.slopes) position_offsets(p.variants, false, j0, nk, nk, pos_base, buf.koff);
      const bool masked = kind == TileKind::kPartial;
      const float* mk = buf.mask;
      for (int64_t lv = 0; lv < lanes; lv += kWidth) {
        const Vec qoff = p.variants.slopes ? simd::load(buf.qoff + lv) : simd::zero();
        Vec x_max = simd::set1(-INFINITY);
        for (int64_t r = 0; r < nk; ++r) {
          const Vec koff = p.variants.slopes ? simd::set1(buf.koff[r]) : simd::zero();
          Vec x = variants.score(simd::load(s + r * ld + lv), qoff, koff);
          if (masked) x = simd::add(x, simd::load(mk + r * ld + lv));
          simd::store(s + r * ld + lv, x);
          x_max = simd::max(x_max, x);
        }
        simd::store(tile_max + lv, x_max);
      }
    } else if (kind == TileKind::kFull) {
      tile_product(nk, lanes, p.d, {k.row(j0), k.stride, 1}, {qt_buf, ld}, {s, ld}, Accum::kOverwriteMax, tile_max);
    } else {
      tile_product(nk, lanes, p.d, {k.row(j0), k.stride, 1}, {qt_buf, ld}, {s, ld}, Accum::kOverwrite);
      const float* mk = buf.mask;
      for (int64_t lv = 0; lv < lanes; lv += kWidth) {
        Vec x_max = simd::set1(-INFINITY);
        for (int64_t r = 0; r < nk; ++r) {
          const Vec x = simd::add(simd::load(s + r * ld + lv), simd::load(mk + r * ld + lv));
          simd::store(s + r * ld + lv, x);
          x_max = simd::max(x_max, x);
        }
        simd::store(tile_max + lv, x_max);
      }
    }

    // Online softmax, one vector of query rows at a time. Mixed precision: P (∘ z) enters P·V as
    // bf16 while l sums the fp32 values; the rounding is done where P (or P ∘ z) is stored.
    const bool round_p = kRoundsProducts<T> && !p.dropout;
    bool grew = false;
    for (int64_t lv = 0; lv < lanes; lv += kWidth) {
      const Vec m_old = simd::load(m + lv);
      const Vec m_new = simd::max(m_old, simd::load(tile_max + lv));
      grew |= simd::any_greater(m_new, m_old);
      const Vec a = simd::exp2_nonpositive(simd::sub(m_old, m_new));
      Vec sum = simd::zero();
      for (int64_t r = 0; r < nk; ++r) {
        const Vec x = simd::sub(simd::load(s + r * ld + lv), m_new);
        // The bf16 kernels' weights take their own polynomial (simd::exp2_weights), as every bf16 path.
        Vec e = kRoundsProducts<T> ? simd::exp2_weights(x) : simd::exp2_nonpositive(x);
        if constexpr (kVariants) e = simd::select_below(x, simd::set1(kNegligible), simd::zero(), e);
        simd::store(s + r * ld + lv, round_p ? simd::round_to_bf16(e) : e);
        sum = simd::add(sum, e);
      }
      simd::store(alpha + lv, a);
      simd::store(m + lv, m_new);
      simd::store(l + lv, simd::fma(simd::load(l + lv), a, sum));
    }
    // Dropout multiplies the weights that meet V, not the normaliser l (the reference drops after
    // normalising, which is the same thing).
    if (p.dropout) {
      float* z = buf.z;
      for (int64_t r = 0; r < ni; ++r) dropout.fill_row(i0 + r, j0, j0 + nk, p.keep_scale, z + r, ld);
      for (int64_t r = 0; r < nk; ++r)
        for (int64_t lv = 0; lv < lanes; lv += kWidth) {
          const Vec dropped = simd::mul(simd::load(s + r * ld + lv), simd::load(z + r * ld + lv));
          simd::store(s + r * ld + lv, kRoundsProducts<T> ? simd::round_to_bf16(dropped) : dropped);
        }
    }
    // Oᵀ = alpha ∘ Oᵀ + Vᵀ Pᵀ; the rescale only when some row's maximum grew.
    const Accum mode = first ? Accum::kOverwrite : grew ? Accum::kScaleAdd : Accum::kAdd;
    const int64_t panel = j0 / p.block_k * p.block_k;  // a tile never crosses panels (KeyTiles)
    tile_product(p.dv, lanes, nk, {vt + panel * p.dv + (j0 - panel), panel_keys(p, panel), 1}, {s, ld}, {o, ld}, mode,
                 alpha);
    first = false;
  }

  // One division per row at the end; fully masked rows (l = 0) give 0 and lse = −inf. Oᵀ's lanes
  // are scaled in place, then the tile is transposed into out's rows.
  if (first) {
    for (int64_t r = 0; r < ni; ++r) std::fill_n(out.data + (i0 + r) * out.stride, p.dv, 0.0f);
  } else {
    for (int64_t lv = 0; lv < lanes; lv += kWidth) {
      // l is 0 (every key masked so far) or at least 1 (the maximum's weight): O/l where −l < −½,
      // which NaN fails too (a NaN l stays NaN), else 0.
      const Vec sum = simd::load(l + lv), neg_sum = simd::sub(simd::zero(), sum);
      const Vec inv = simd::div(simd::set1(1.0f), sum), half = simd::set1(-0.5f);
      for (int64_t c = 0; c < p.dv; ++c) {
        const Vec scaled = simd::mul(simd::load(o + c * ld + lv), inv);
        simd::store(o + c * ld + lv, simd::select_below(neg_sum, half, scaled, simd::zero()));
      }
    }
    transpose_scaled<false>(o, ld, p.dv, ni, 1.0f, out.data + i0 * out.stride, out.stride);
  }
  if (args.lse)
    for (int64_t r = 0; r < ni; ++r)
      args.lse[(b * p.H + h) * p.N + i0 + r] = l[r] > 0.0f ? (m[r] + std::log2(l[r])) * kLn2 : -INFINITY;
}

}  // namespace

template <typename T>
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options, const Tensor& out,
             const Tensor* lse, const FlashConfig& config) {
  const Problem p = make_problem(q, k, v, options, config, false);
  if (lse)
    CABM_CHECK(lse->dtype() == DType::F32 && lse->shape() == (Shape{p.B, p.H, p.N}) && lse->is_contiguous(),
               "lse must be a contiguous F32 [B, H, N] tensor, got {}", shape_str(lse->shape()));
  const TileMask mask(options.mask, p.B, p.H, p.N, p.M);
  // K and V are packed head by head: K into contiguous rows, V into panels (panel_keys).
  // Heads are strided views (row stride H·d, or 3·H·d in a fused projection): the rows of one
  // tile, a power-of-two multiple of 512 bytes apart, would fall into a few L1 sets and evict each
  // other. Packing costs one pass over K and V.
  // Heads go in waves whose packed K and V fit in kPackBytes (all heads at once for training
  // shapes; one head at a time for long sequences), so the copy never grows with B·H·M. With GQA
  // a key/value head is packed once and read by the `group` query heads that share it.
  const int64_t heads = p.B * p.Hkv, head_floats = p.M * (p.d + p.dv);
  const int64_t wave = std::clamp<int64_t>(kPackBytes / 4 / std::max<int64_t>(head_floats, 1), 1, heads);
  float* const k_packed = scratch(kPackedK, wave * p.M * p.d);
  float* const v_packed = scratch(kPackedV, wave * p.M * p.dv);
  for (int64_t first = 0; first < heads; first += wave) {
    const int64_t count = std::min(wave, heads - first);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < count; ++n) {
      const int64_t b = (first + n) / p.Hkv, hk = (first + n) % p.Hkv;
      const InputRows<T> ks = input_rows<T>(k, b, hk), vs = input_rows<T>(v, b, hk);
      float* kd = k_packed + n * p.M * p.d;
      float* vd = v_packed + n * p.M * p.dv;
      for (int64_t j = 0; j < p.M; ++j) widen_row(ks.row(j), p.d, kd + j * p.d);
      for (int64_t j0 = 0; j0 < p.M; j0 += p.block_k) {
        const int64_t nj = panel_keys(p, j0);
        transpose_scaled<false>(vs.row(j0), vs.stride, nj, p.dv, 1.0f, vd + j0 * p.dv, nj);
      }
    }
    const ForwardArgs args{q, out, k_packed, v_packed, first, lse ? lse->data<float>() : nullptr, options, mask, p};
    // Query heads b·H + h of key/value heads [first, first + count): [first·group, (first + count)·group).
    const std::vector<QueryTileItem> items =
        forward_work_items(mask, p.H, p.N, p.block_q, first * p.group, (first + count) * p.group);
    const auto tile = p.variants.any() ? &forward_query_tile<T, true> : &forward_query_tile<T, false>;
#pragma omp parallel
    {
      ForwardBuffers buf(p);
#pragma omp for schedule(dynamic, 1)
      for (size_t n = 0; n < items.size(); ++n) tile(args, buf, items[n].b, items[n].h, items[n].qt);
    }
  }
}

template void forward<float>(const Tensor&, const Tensor&, const Tensor&, const AttentionOptions&, const Tensor&,
                             const Tensor*, const FlashConfig&);
template void forward<bf16>(const Tensor&, const Tensor&, const Tensor&, const AttentionOptions&, const Tensor&,
                            const Tensor*, const FlashConfig&);

}  // namespace cabm::flash::CABM_FLASH_SET
