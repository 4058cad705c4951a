// The backward tile loop of the tiled attention kernel and its driver, compiled once per
// instruction set like the forward (attention/flash_forward_body.h, which the per-set files include
// first). Everything here has internal linkage but the explicit instantiations of backward<T>.
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
using simd::tile::Accum;
using simd::tile::tile_product;
using simd::tile::transpose_scaled;

// ---------------------------------------------------------------------------------------------
// Backward. One work item is (b, key/value head hk, key tile); it owns its rows of dk and dv,
// walks, for each query head of hk's group in head order, the query tiles that can see it, and
// adds its share of dq into a per-thread accumulator for those heads. With GQA the group's
// contributions to dk and dv thus add up in the item's tiles in a fixed order, with one writer.
// Its buffers hold tiles with lanes over the keys: Kᵀ and Vᵀ packed once per item, S, P, dP, dS
// row per query.

struct BackwardBuffers {
  int64_t ld, dp;  // lanes: block_k and d rounded up to the vector width
  float *kt, *vt, *ks, *dkt, *dvt, *s, *dpp, *mask, *z;
  float *koff, *cap;  // ALiBi: the tile's key positions [ld]; soft-cap: 1 − tanh² [block_q][ld]
  // Per chunk of query rows of the group's query heads (see backward_chunk_rows), query head
  // hk·group + u at rows u·(chunk rows) on:
  float *lse2, *delta, *dq;  // [rows], [rows], [rows][dp]
  float *q, *g;              // Q [rows][d] and dO [rows][dv], packed (see the forward's K, V)
  int64_t head = -1;         // b·Hkv + hk the per-chunk buffers hold
  Range chunk{0, 0};         // ... and which query rows of each query head
  RowPrefetch prefetch;      // the rows of the thread's next head (queue_backward_head)
  BackwardBuffers(const Problem& p, int64_t rows)
      : ld(round_up(p.block_k, kWidth)),
        dp(round_up(p.d, kWidth)),
        kt(scratch(kKt, p.d * ld)),
        vt(scratch(kVt, p.dv * ld)),
        ks(scratch(kKs, p.block_k * dp)),
        dkt(scratch(kDKt, p.d * ld)),
        dvt(scratch(kDVt, p.dv * ld)),
        s(scratch(kS, p.block_q * ld)),
        dpp(scratch(kDP, p.block_q * ld)),
        mask(scratch(kMaskTile, p.block_q * ld)),
        z(p.dropout || p.bf16 ? scratch(kZ, p.block_q * ld) : nullptr),
        koff(p.variants.slopes ? scratch(kKOff, ld) : nullptr),
        cap(p.variants.softcap > 0.0f ? scratch(kCapGrad, p.block_q * ld) : nullptr),
        lse2(scratch(kLse2, p.group * rows)),
        delta(scratch(kDelta, p.group * rows)),
        dq(scratch(kDQ, p.group * rows * dp)),
        q(scratch(kHeadQ, p.group * rows * p.d)),
        g(scratch(kHeadG, p.group * rows * p.dv)) {}
};

struct BackwardArgs {
  const AttentionSaved& saved;
  const Tensor& dout;
  const AttentionGrads& grads;
  const AttentionOptions& options;
  const TileMask& mask;
  const Problem& p;
  int64_t chunk_rows;  // backward_chunk_rows
};

// Setup for the query rows `chunk` of the query heads of key/value head hk: Q and dO packed (dO
// as bf16 values in mixed precision: it is used only as an operand of products), lse in base 2
// (+inf for fully masked rows, so that exp2(s − lse) = 0 there), D_i = dO_i · O_i in fp32, and a
// zero dq accumulator.
template <typename T>
void backward_begin_chunk(const BackwardArgs& args, BackwardBuffers& buf, int64_t b, int64_t hk, Range chunk) {
  const Problem& p = args.p;
  const int64_t rows = chunk.end - chunk.begin;
  for (int64_t u = 0; u < p.group; ++u) {
    const int64_t h = hk * p.group + u;
    const float* lse = args.saved.lse.data<float>() + (b * p.H + h) * p.N;
    const HeadRows o = head_rows(args.saved.out, b, h), g = head_rows(args.dout, b, h);
    const InputRows<T> q = input_rows<T>(args.saved.q, b, h);
    for (int64_t i = chunk.begin; i < chunk.end; ++i) {
      const int64_t r = u * rows + i - chunk.begin;
      widen_row(q.row(i), p.d, buf.q + r * p.d);
      if constexpr (kRoundsProducts<T>) {
        for (int64_t c = 0; c < p.dv; ++c) buf.g[r * p.dv + c] = bf16_to_float(float_to_bf16(g.row(i)[c]));
      } else {
        copy_row(g.row(i), p.dv, buf.g + r * p.dv);
      }
      buf.lse2[r] = lse[i] == -INFINITY ? INFINITY : lse[i] * kLog2e;
      float dot = 0.0f;
      for (int64_t c = 0; c < p.dv; ++c) dot += o.row(i)[c] * g.row(i)[c];
      buf.delta[r] = dot;
    }
  }
  std::fill_n(buf.dq, p.group * rows * buf.dp, 0.0f);
  buf.head = b * p.Hkv + hk;
  buf.chunk = chunk;
}

// One key tile of key/value head hk against the query rows of buf.chunk of each query head of its
// group: dK and dV rows of the tile are written (the first chunk) or added to (later chunks); dq
// accumulates in buf.dq. kVariants: soft-capping or ALiBi on (attention/score_variants.h).
template <typename T, bool kVariants>
void backward_key_tile(const BackwardArgs& args, BackwardBuffers& buf, int64_t b, int64_t hk, int64_t kt) {
  const Problem& p = args.p;
  const int64_t j0 = kt * p.block_k, nk = std::min(p.block_k, p.M - j0);
  const int64_t lanes = round_up(nk, kWidth), ld = buf.ld, dp = buf.dp;
  const Range keys{j0, j0 + nk};
  const HeadRows dk = head_rows(args.grads.dk, b, hk), dv = head_rows(args.grads.dv, b, hk);
  const Range chunk = buf.chunk, all_rows = args.mask.query_range(b, keys);
  const Range query_range{std::max(all_rows.begin, chunk.begin), std::min(all_rows.end, chunk.end)};
  const bool first_chunk = chunk.begin == 0;
  if (query_range.begin >= query_range.end) {  // no query of this chunk sees the tile
    for (int64_t r = 0; r < nk && first_chunk; ++r) {
      std::fill_n(dk.data + (j0 + r) * dk.stride, p.d, 0.0f);
      std::fill_n(dv.data + (j0 + r) * dv.stride, p.dv, 0.0f);
    }
    return;
  }
  const InputRows<T> k = input_rows<T>(args.saved.k, b, hk), v = input_rows<T>(args.saved.v, b, hk);

  // Kᵀ scaled into base-2 scores (as the forward's Qᵀ), Vᵀ, and K·scale row-major for dQ = dS (scale·K).
  const float kscale = kVariants ? p.operand_scale : p.scale * kLog2e;
  float *kt_buf = buf.kt, *vt_buf = buf.vt, *ks = buf.ks;
  // Kᵀ and Vᵀ with zero padding lanes (tile_transpose.h); ks row by row.
  transpose_scaled<true>(k.row(j0), k.stride, nk, p.d, kscale, kt_buf, ld);
  transpose_scaled<true>(v.row(j0), v.stride, nk, p.dv, 1.0f, vt_buf, ld);
  for (int64_t r = 0; r < nk; ++r) {
    const T* krow = k.row(j0 + r);
    for (int64_t c = 0; c < p.d; ++c) ks[r * dp + c] = widen(krow[c]) * p.scale;
    std::fill(ks + r * dp + p.d, ks + (r + 1) * dp, 0.0f);
  }
  // ALiBi offsets relative to the tile's first key position.
  const int64_t pos_base = p.variants.k_position(j0);
  if (kVariants && p.variants.slopes) position_offsets(p.variants, false, j0, nk, lanes, pos_base, buf.koff);
  float *dkt = buf.dkt, *dvt = buf.dvt, *s = buf.s, *dps = buf.dpp;
  std::fill_n(dkt, p.d * ld, 0.0f);
  std::fill_n(dvt, p.dv * ld, 0.0f);
  const int64_t chunk_rows = chunk.end - chunk.begin;

  for (int64_t u = 0; u < p.group; ++u) {
    const int64_t h = hk * p.group + u;
    // Packed by backward_begin_chunk: row i of query head h is row i − chunk.begin here.
    const HeadRows q{buf.q + u * chunk_rows * p.d, p.d}, g{buf.g + u * chunk_rows * p.dv, p.dv};
    const float *lse2 = buf.lse2 + u * chunk_rows, *delta = buf.delta + u * chunk_rows;
    float* dq = buf.dq + u * chunk_rows * dp;
    const DropoutMatrix dropout(args.options, b, h, p.H, p.M);
    const bool round_p = kRoundsProducts<T> && !p.dropout;  // P rounded where it is computed (else with z)
    const HeadScores variants(p.variants, h);

    // Query tiles on the block_q grid of the head (chunks start on it), clipped to the chunk.
    for (int64_t i0 = query_range.begin / p.block_q * p.block_q; i0 < query_range.end; i0 += p.block_q) {
      const int64_t ni = std::min(p.block_q, chunk.end - i0), li = i0 - chunk.begin;  // li: chunk-local
      const Range rows{i0, i0 + ni};
      const TileKind kind = args.mask.classify(b, h, rows, keys);
      if (kind == TileKind::kSkip) continue;
      if (kind == TileKind::kPartial) args.mask.fill(b, h, rows, keys, kLog2e, buf.mask, ld, 1);

      // S = Q Kᵀ (base 2, [soft-cap, ALiBi,] + mask);  P = exp2(S − lse2)
      buf.prefetch.pump();
      tile_product(ni, lanes, p.d, {q.row(li), q.stride, 1}, {kt_buf, ld}, {s, ld}, Accum::kOverwrite);
      for (int64_t r = 0; r < ni; ++r) {
        const Vec row_lse = simd::set1(lse2[li + r]);
        float* srow = s + r * ld;
        const float* mrow = buf.mask + r * ld;
        Vec qoff = simd::zero();
        if (kVariants && p.variants.slopes)
          qoff = simd::set1(static_cast<float>(p.variants.q_position(i0 + r) - pos_base));
        for (int64_t lv = 0; lv < lanes; lv += kWidth) {
          Vec x = simd::load(srow + lv);
          if constexpr (kVariants) {
            Vec cap_grad = simd::zero();  // written only with soft-capping; GCC cannot see that
            x = variants.score(x, qoff, p.variants.slopes ? simd::load(buf.koff + lv) : simd::zero(), &cap_grad);
            if (variants.softcap()) simd::store(buf.cap + r * ld + lv, cap_grad);
          }
          if (kind == TileKind::kPartial) x = simd::add(x, simd::load(mrow + lv));
          // Recomputed scores may exceed lse by rounding: clamp, P <= 1.
          const Vec t = simd::min(simd::sub(x, row_lse), simd::zero());
          Vec pr = kRoundsProducts<T> ? simd::exp2_weights(t) : simd::exp2_nonpositive(t);  // as the forward's P
          if constexpr (kVariants) pr = simd::select_below(t, simd::set1(kNegligible), simd::zero(), pr);
          simd::store(srow + lv, pr);
          // Mixed precision without dropout: P enters dV as bf16, kept beside it in z (P stays fp32 for dS).
          if (round_p) simd::store(buf.z + r * ld + lv, simd::round_to_bf16(pr));
        }
      }
      // dP = dO Vᵀ
      buf.prefetch.pump();
      tile_product(ni, lanes, p.dv, {g.row(li), g.stride, 1}, {vt_buf, ld}, {dps, ld}, Accum::kOverwrite);
      // Dropout: the weights that met V are P∘z, and dP (w.r.t. the undropped P) is dP∘z.
      const float* p_used = s;
      if (p.dropout) {
        float* z = buf.z;
        for (int64_t r = 0; r < ni; ++r) {
          dropout.fill_row(i0 + r, j0, j0 + nk, p.keep_scale, z + r * ld, 1);
          for (int64_t lv = 0; lv < lanes; lv += kWidth) {
            const Vec zz = simd::load(z + r * ld + lv);
            simd::store(dps + r * ld + lv, simd::mul(simd::load(dps + r * ld + lv), zz));
            // Mixed precision: P∘z enters dV as bf16.
            const Vec dropped = simd::mul(simd::load(s + r * ld + lv), zz);
            simd::store(z + r * ld + lv, kRoundsProducts<T> ? simd::round_to_bf16(dropped) : dropped);
          }
        }
      }
      if (p.dropout || round_p) p_used = buf.z;
      // dVᵀ += dOᵀ (P∘z)
      buf.prefetch.pump();
      tile_product(p.dv, lanes, ni, {g.row(li), 1, g.stride}, {p_used, ld}, {dvt, ld}, Accum::kAdd);
      // dS = P ∘ (dP − D)  [∘ (1 − tanh²) when soft-capped: then it is dT, the gradient of t]
      for (int64_t r = 0; r < ni; ++r) {
        const Vec row_delta = simd::set1(delta[li + r]);
        for (int64_t lv = 0; lv < lanes; lv += kWidth) {
          Vec ds = simd::mul(simd::load(s + r * ld + lv), simd::sub(simd::load(dps + r * ld + lv), row_delta));
          if constexpr (kVariants) {
            if (variants.softcap()) ds = simd::mul(ds, simd::load(buf.cap + r * ld + lv));
          }
          // Mixed precision: dS enters dK and dQ as bf16.
          simd::store(dps + r * ld + lv, kRoundsProducts<T> ? simd::round_to_bf16(ds) : ds);
        }
      }
      // dKᵀ += Qᵀ dS (scaled at the end);  dQ += dS (scale·K), only over the tile's real keys.
      buf.prefetch.pump();
      tile_product(p.d, lanes, ni, {q.row(li), 1, q.stride}, {dps, ld}, {dkt, ld}, Accum::kAdd);
      buf.prefetch.pump();
      tile_product(ni, dp, nk, {dps, ld, 1}, {ks, dp}, {dq + li * dp, dp}, Accum::kAdd);
    }
  }

  float* const dk_rows = dk.data + j0 * dk.stride;
  float* const dv_rows = dv.data + j0 * dv.stride;
  if (first_chunk) {
    transpose_scaled<false>(dkt, ld, p.d, nk, p.scale, dk_rows, dk.stride);
    transpose_scaled<false>(dvt, ld, p.dv, nk, 1.0f, dv_rows, dv.stride);
  } else {
    transpose_scaled<false, true>(dkt, ld, p.d, nk, p.scale, dk_rows, dk.stride);
    transpose_scaled<false, true>(dvt, ld, p.dv, nk, 1.0f, dv_rows, dv.stride);
  }
}

using KeyTileFn = void (*)(const BackwardArgs&, BackwardBuffers&, int64_t, int64_t, int64_t);

// dq rows `rows` of the query heads of key/value head hk from an accumulator holding them from
// row 0 (head hk·group + u from row u · (rows.end − rows.begin) on).
void write_dq_rows(const BackwardArgs& args, const float* acc, int64_t dp, int64_t b, int64_t hk, Range rows) {
  const Problem& p = args.p;
  const int64_t n = rows.end - rows.begin;
  for (int64_t u = 0; u < p.group; ++u) {
    const HeadRows dq = head_rows(args.grads.dq, b, hk * p.group + u);
    for (int64_t i = rows.begin; i < rows.end; ++i)
      copy_row(acc + (u * n + i - rows.begin) * dp, p.d, dq.data + i * dq.stride);
  }
}

// The backward's work split when there are few key/value heads (attention/backward_split.h), chunk
// by chunk of query rows: the chunks of whole-head mode, in the same order, so that each key
// tile's dk and dv rows are written by the first chunk and added to by the later ones exactly as
// there (the same bits whichever mode ran, any thread count) and the buffers stay as small.
// Called by every thread of the parallel region (it contains barriers).
template <typename Elem>
void backward_split_chunks(const BackwardArgs& args, KeyTileFn key_tile, std::vector<int64_t>& prefix,
                           std::vector<SplitPartials>& shared, int t, int T) {
  const Problem& p = args.p;
  const int64_t n_kt = ceil_div(p.M, p.block_k), dp = round_up(p.d, kWidth);
  BackwardBuffers buf(p, args.chunk_rows);
  for (int64_t i0 = 0; i0 < p.N; i0 += args.chunk_rows) {
    const Range chunk{i0, std::min(p.N, i0 + args.chunk_rows)};
    const int64_t acc_floats = p.group * (chunk.end - chunk.begin) * dp;
#pragma omp single
    split_costs(args.mask, p.B * p.Hkv, p.Hkv, p.group, p.M, p.block_k, chunk, prefix);  // (then a barrier)
    float* const sum = scratch(kSplitDq, split_sum_floats(t, T, acc_floats));
    split_key_tiles(
        prefix, n_kt, acc_floats, buf.dq, sum, shared, t, T,
        [&](int64_t hd) { backward_begin_chunk<Elem>(args, buf, hd / p.Hkv, hd % p.Hkv, chunk); },
        [&](int64_t hd, int64_t kt) { key_tile(args, buf, hd / p.Hkv, hd % p.Hkv, kt); },
        [&](int64_t hd, const float* dq) { write_dq_rows(args, dq, dp, hd / p.Hkv, hd % p.Hkv, chunk); });
  }
}

}  // namespace

// Work split of the backward. dk and dv are split by key tile, so each has one writer. dq of a
// query row gets a contribution from every key tile; a separate dq pass would redo two of the five
// block products (S and dP), 40% more work, and atomics would serialise. Instead each thread
// accumulates dq for the head in hand in a private [rows, d] buffer. A "head" here is a key/value
// head with the query heads of its group (GQA; one query head without): the group's sums into dk
// and dv stay inside one work item, in head order.
//  - with enough heads (B·Hkv a multiple of R = backward_split_runs(), the processors this process
//    may use up to 16, or at least 4R), whole heads are handed out dynamically (robust when a
//    thread is slowed down); dq has one writer per head.
//    A long head is walked in chunks of query rows (backward_chunk_rows), each against every key
//    tile, so the buffers stay within a few MiB per thread whatever N;
//  - otherwise, chunk by chunk of query rows (the same chunks), the work items (b, hk, key tile),
//    in order, are cut into R contiguous runs with equal estimated cost, shared out among the
//    threads; a head within one run is written directly, and the few heads cut between runs (at
//    most one per boundary) sum the runs' partials in run order (backward_split_chunks,
//    attention/backward_split.h).
// Neither the mode nor the runs depend on the thread count, so dq is the same bits for any thread
// count (on a given machine: R follows its processors), as dk and dv (one writer per key tile,
// chunks in order) are everywhere. Memory: O(R · group · chunk rows · d) at most.
template <typename Elem>
void backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
              const AttentionGrads& grads, const FlashConfig& config) {
  const Problem p = make_problem(saved.q, saved.k, saved.v, options, config, true);
  // No query reaches K and V (the loops below walk query rows). (A Tensor copy is a view of the
  // same storage.)
  if (p.N == 0) {
    Tensor(grads.dk).fill(0.0f);
    Tensor(grads.dv).fill(0.0f);
    return;
  }
  const TileMask mask(options.mask, p.B, p.H, p.N, p.M);
  const BackwardArgs args{saved, dout, grads, options, mask, p, backward_chunk_rows(p, config)};
  const KeyTileFn key_tile = p.variants.any() ? &backward_key_tile<Elem, true> : &backward_key_tile<Elem, false>;

  // Heads here are key/value heads: each work item covers the query heads of its group.
  const int64_t n_kt = ceil_div(p.M, p.block_k), heads = p.B * p.Hkv;
  std::vector<int64_t> prefix(static_cast<size_t>(heads * n_kt + 1), 0);  // of the split
  std::vector<SplitPartials> partials(static_cast<size_t>(omp_get_max_threads()));
  const bool whole_heads = backward_whole_heads(heads);
  std::atomic<int64_t> next_head{0};  // of whole-head mode

#pragma omp parallel
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    if (whole_heads) {
      // Enough heads to balance: whole heads, handed out dynamically. Each head has one owner, so
      // dq needs no partial sums and does not depend on the thread count at all.
      // Heads are claimed one ahead (a shared counter, as `omp for schedule(dynamic, 1)` would hand
      // them out), so that a thread knows its next head and asks for that head's rows while it
      // works on this one (queue_backward_head).
      const int64_t chunk_rows = args.chunk_rows;
      BackwardBuffers buf(p, chunk_rows);
      // The tile loop pumps before each of its five products, over about half the tile pairs with
      // a diagonal mask, for each query head of the group.
      const int64_t pumps = 5 * n_kt * ceil_div(p.N, p.block_q) * p.group / 2;
      for (int64_t hd = next_head.fetch_add(1); hd < heads;) {
        const int64_t following = next_head.fetch_add(1);
        if (following < heads && chunk_rows == p.N)  // one chunk per head: its rows are few
          queue_backward_head(buf.prefetch, saved, dout, grads, following / p.Hkv, following % p.Hkv, pumps);
        else
          buf.prefetch.clear();
        const int64_t b = hd / p.Hkv, hk = hd % p.Hkv;
        for (int64_t i0 = 0; i0 < p.N; i0 += chunk_rows) {
          const Range chunk{i0, std::min(p.N, i0 + chunk_rows)};
          backward_begin_chunk<Elem>(args, buf, b, hk, chunk);
          for (int64_t kt = 0; kt < n_kt; ++kt) key_tile(args, buf, b, hk, kt);
          write_dq_rows(args, buf.dq, buf.dp, b, hk, chunk);
        }
        hd = following;
      }
    } else {
      backward_split_chunks<Elem>(args, key_tile, prefix, partials, t, T);
    }
  }
}

template void backward<float>(const AttentionSaved&, const Tensor&, const AttentionOptions&, const AttentionGrads&,
                              const FlashConfig&);
template void backward<bf16>(const AttentionSaved&, const Tensor&, const AttentionOptions&, const AttentionGrads&,
                             const FlashConfig&);

}  // namespace cabm::flash::CABM_FLASH_SET
