#include "cabm/kernels/attention_flash.h"
#include "cabm/kernels/attention_flash_detail.h"
#include "cabm/kernels/attention_score_variants.h"
#include "cabm/kernels/tile_mask.h"

#include "cabm/kernels/attention_simd.h"
#include "cabm/kernels/attention_tile_product.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

namespace cabm {
namespace {

using simd::kWidth;
using simd::Vec;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int64_t kPackBytes = 16 << 20;  // the forward's packed K and V (attention_flash_forward)
// With the score variants, weights below 2^kNegligible of the row's maximum (forward) or sum
// (backward) are set to 0. ALiBi's biases put many scores there, and their products with dO,
// dP − D and V would be denormal floats, whose microcode assists made the backward 2× slower
// (N = 2048, paper slopes); they change no row sum (M · 2^−64 ≪ 2^−24).
constexpr float kNegligible = -64.0f;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// A 64-byte aligned float buffer, zero-initialised (so padding lanes never hold NaN).
class Floats {
 public:
  Floats() = default;
  explicit Floats(int64_t n) {
    const size_t bytes = static_cast<size_t>(round_up(std::max<int64_t>(n, 1) * 4, 64));
    data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    CABM_CHECK(data_ != nullptr, "out of memory allocating {} bytes", bytes);
    std::fill_n(data_.get(), bytes / 4, 0.0f);
  }
  float* get() const { return data_.get(); }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> data_;
};

// Per-thread buffers that outlive a call: OpenMP's threads are pooled, so a thread reuses its
// buffers from one call to the next instead of paying page faults for fresh memory every time
// (packed K/V and per-head backward buffers are megabytes). A buffer grows to the largest size a
// thread has needed and is freed when the thread ends. Contents are unspecified.
enum Slot { kPackedK, kPackedV, kQt, kS, kO, kMaskTile, kZ, kM, kL, kAlpha, kTileMax,
            kKt, kVt, kKs, kDKt, kDVt, kDP, kLse2, kDelta, kDQ, kHeadQ, kHeadG, kQOff, kKOff, kCapGrad,
            kSlots };
float* scratch(Slot slot, int64_t n) {
  thread_local std::array<std::pair<int64_t, Floats>, kSlots> pool;
  auto& [capacity, buffer] = pool[slot];
  if (capacity < n) {
    buffer = Floats(n);
    capacity = n;
  }
  return buffer.get();
}

// The block products: tile_product and its micro-kernel (attention_tile_product.h).
using tile::Accum;
using tile::ScalarOperand;
using tile::TileRef;
using tile::VectorOperand;
using tile::tile_product;
// A head's rows of a [B, L, H, d] view: row r at data + r · stride.
struct HeadRows {
  float* data;
  int64_t stride;
  const float* row(int64_t r) const { return data + r * stride; }
};
HeadRows head_rows(const Tensor& t, int64_t b, int64_t h) {
  return {t.data<float>() + b * t.stride(0) + h * t.stride(2), t.stride(1)};
}

// The inputs q, k, v have elements of type T: float, or bf16 for the bf16 kernels' SIMD path
// (attention_flash_detail.h). bf16 is widened exactly (a 16-bit shift) whenever a tile is packed,
// so every block product runs on fp32 tiles. With T = bf16 the other operands of the products are
// rounded to bf16 values (kept in fp32) where attention_flash_bf16.h says: P before P·V in the
// forward; dO, P∘z and dS in the backward. Everything else (scores, softmax statistics, D, dP,
// the accumulators) is fp32 either way.
template <typename T>
struct InputRows {
  const T* data;
  int64_t stride;
  const T* row(int64_t r) const { return data + r * stride; }
};
template <typename T>
InputRows<T> input_rows(const Tensor& t, int64_t b, int64_t h) {
  return {t.data<T>() + b * t.stride(0) + h * t.stride(2), t.stride(1)};
}
inline float widen(float x) { return x; }
inline float widen(bf16 x) { return bf16_to_float(x); }
template <typename T>
void widen_row(const T* src, int64_t n, float* dst) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy_n(src, n, dst);
  } else {
    for (int64_t c = 0; c < n; ++c) dst[c] = widen(src[c]);
  }
}
template <typename T>
constexpr bool kRoundsProducts = std::is_same_v<T, bf16>;

// dst = src rounded to bf16 values, rows × lanes (a multiple of kWidth) of tiles with stride ld.
void round_tile_to_bf16(const float* src, float* dst, int64_t rows, int64_t lanes, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t lv = 0; lv < lanes; lv += kWidth)
      simd::store(dst + r * ld + lv, simd::round_to_bf16(simd::load(src + r * ld + lv)));
}

// The shapes and constants of one call, shared by all threads.
struct Problem {
  int64_t B, N, H, M, d, dv;
  int64_t Hkv, group;  // key/value heads; query heads per key/value head (H / Hkv)
  int64_t block_q, block_k;
  float scale;          // of the scores
  float operand_scale;  // of the products' packed operand: ScoreVariants::operand_scale
  float keep_scale;     // 1 / (1 − dropout)
  bool dropout;
  bool bf16;  // bf16 inputs, products' operands rounded (see InputRows)
  ScoreVariants variants;
};

Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                     const FlashConfig& config, bool backward) {
  CABM_CHECK(options.dropout >= 0.0f && options.dropout < 1.0f, "dropout {} outside [0, 1)", options.dropout);
  check_attention_variants(options, q.size(2), q.size(1), k.size(1));
  const FlashConfig tiles = flash_resolved_config(config, options, q.size(3), q.size(1), backward);
  Problem p{};
  p.B = q.size(0), p.N = q.size(1), p.H = q.size(2), p.M = k.size(1), p.d = q.size(3), p.dv = v.size(3);
  p.Hkv = k.size(2), p.group = p.H / p.Hkv;
  p.block_q = tiles.block_q, p.block_k = tiles.block_k;
  p.scale = attention_scale(options, q.size(3));
  p.variants = score_variants(options, p.N, p.M);
  p.operand_scale = p.variants.operand_scale(p.scale);
  p.keep_scale = 1.0f / (1.0f - options.dropout);
  p.dropout = options.dropout > 0.0f;
  p.bf16 = q.dtype() == DType::BF16;
  return p;
}

// ---------------------------------------------------------------------------------------------
// Forward. One work item is (b, h, query tile). Its buffers hold the tile transposed, lanes over
// the query rows, so the online softmax is purely vertical: the running maximum and sum of row i
// live in lane i, and rescaling the accumulator Oᵀ is one multiply per vector.

struct ForwardBuffers {
  int64_t ld;  // lanes: block_q rounded up to the vector width
  float *qt, *s, *o, *mask, *z, *m, *l, *alpha, *tile_max;
  float *qoff, *koff;  // ALiBi: positions of the tile's queries and keys (attention_score_variants.h)
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

struct ForwardArgs {
  const Tensor &q, &out;
  const float *k, *v;  // packed key/value heads first_head, first_head + 1, ...: [heads, M, d], [heads, M, dv]
  int64_t first_head;  // b·Hkv + hk of the first packed head (see attention_flash_forward)
  float* lse;  // [B, H, N] or null
  const AttentionOptions& options;
  const TileMask& mask;
  const Problem& p;
};

// kVariants: soft-capping or ALiBi on (attention_score_variants.h); without, the plain tile loop.
template <typename T, bool kVariants>
void forward_query_tile(const ForwardArgs& args, ForwardBuffers& buf, int64_t b, int64_t h, int64_t qt) {
  const Problem& p = args.p;
  const int64_t i0 = qt * p.block_q, ni = std::min(p.block_q, p.N - i0);
  const int64_t lanes = round_up(ni, kWidth), ld = buf.ld;
  const Range rows{i0, i0 + ni};
  const InputRows<T> q = input_rows<T>(args.q, b, h);
  const HeadRows out = head_rows(args.out, b, h);
  const int64_t packed = b * p.Hkv + h / p.group - args.first_head;
  const HeadRows k{const_cast<float*>(args.k) + packed * p.M * p.d, p.d};
  const HeadRows v{const_cast<float*>(args.v) + packed * p.M * p.dv, p.dv};

  // Qᵀ, pre-multiplied by scale·log2(e) so that the scores come out in base 2: exp2 is cheaper
  // (by the operand scale of the variants with them).
  const float qscale = kVariants ? p.operand_scale : p.scale * kLog2e;
  float* qt_buf = buf.qt;
  for (int64_t c = 0; c < p.d; ++c) {
    for (int64_t r = 0; r < ni; ++r) qt_buf[c * ld + r] = widen(q.row(i0 + r)[c]) * qscale;
    for (int64_t r = ni; r < lanes; ++r) qt_buf[c * ld + r] = 0.0f;
  }
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

  const Range key_range = args.mask.key_range(b, rows);
  for (int64_t j0 = key_range.begin / p.block_k * p.block_k; j0 < key_range.end; j0 += p.block_k) {
    const int64_t nk = std::min(p.block_k, p.M - j0);
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

    // Online softmax, one vector of query rows at a time.
    bool grew = false;
    for (int64_t lv = 0; lv < lanes; lv += kWidth) {
      const Vec m_old = simd::load(m + lv);
      const Vec m_new = simd::max(m_old, simd::load(tile_max + lv));
      grew |= simd::any_greater(m_new, m_old);
      const Vec a = simd::exp2_nonpositive(simd::sub(m_old, m_new));
      Vec sum = simd::zero();
      for (int64_t r = 0; r < nk; ++r) {
        const Vec x = simd::sub(simd::load(s + r * ld + lv), m_new);
        Vec e = simd::exp2_nonpositive(x);
        if constexpr (kVariants) e = simd::select_below(x, simd::set1(kNegligible), simd::zero(), e);
        simd::store(s + r * ld + lv, e);
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
        for (int64_t lv = 0; lv < lanes; lv += kWidth)
          simd::store(s + r * ld + lv, simd::mul(simd::load(s + r * ld + lv), simd::load(z + r * ld + lv)));
    }
    // Mixed precision: P (∘ z) enters P·V as bf16; l above summed the fp32 values.
    if constexpr (kRoundsProducts<T>) round_tile_to_bf16(s, s, nk, lanes, ld);
    // Oᵀ = alpha ∘ Oᵀ + Vᵀ Pᵀ; the rescale only when some row's maximum grew.
    const Accum mode = first ? Accum::kOverwrite : grew ? Accum::kScaleAdd : Accum::kAdd;
    tile_product(p.dv, lanes, nk, {v.row(j0), 1, v.stride}, {s, ld}, {o, ld}, mode, alpha);
    first = false;
  }

  // One division per row at the end; fully masked rows (l = 0) give 0 and lse = −inf.
  for (int64_t r = 0; r < ni; ++r) {
    float* orow = out.data + (i0 + r) * out.stride;
    if (first || l[r] == 0.0f) {
      std::fill_n(orow, p.dv, 0.0f);
    } else {
      const float inv = 1.0f / l[r];
      for (int64_t c = 0; c < p.dv; ++c) orow[c] = o[c * ld + r] * inv;
    }
    if (args.lse)
      args.lse[(b * p.H + h) * p.N + i0 + r] = l[r] > 0.0f ? (m[r] + std::log2(l[r])) * kLn2 : -INFINITY;
  }
}

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

// The query rows of each query head a thread holds at once in whole-head mode
// (FlashConfig::backward_rows): all N when the per-row buffers of the group (Q, dO, dq, lse, D)
// fit in kChunkBytes, else a multiple of block_q that does. With long sequences this bounds the
// backward's working memory (N = 65536, d = 64: 48 MiB per thread without chunks); each extra
// chunk costs one more packing of the key tiles (O(M·d) against O(rows·M·d) of products). It
// depends only on the shapes, never on the thread count.
constexpr int64_t kChunkBytes = 4 << 20;
int64_t backward_chunk_rows(const Problem& p, const FlashConfig& config) {
  CABM_CHECK(config.backward_rows >= 0, "backward_rows must be >= 0, got {}", config.backward_rows);
  if (config.backward_rows > 0) return std::min(p.N, round_up(config.backward_rows, p.block_q));
  const int64_t row_bytes = 4 * p.group * (round_up(p.d, kWidth) + p.d + p.dv + 2);
  if (p.N * row_bytes <= kChunkBytes) return p.N;
  return std::max<int64_t>(1, kChunkBytes / row_bytes / p.block_q) * p.block_q;
}

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
        std::copy_n(g.row(i), p.dv, buf.g + r * p.dv);
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
// accumulates in buf.dq. kVariants: soft-capping or ALiBi on (attention_score_variants.h).
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
  for (int64_t c = 0; c < p.d; ++c) {
    for (int64_t r = 0; r < nk; ++r) kt_buf[c * ld + r] = widen(k.row(j0 + r)[c]) * kscale;
    for (int64_t r = nk; r < lanes; ++r) kt_buf[c * ld + r] = 0.0f;
  }
  for (int64_t c = 0; c < p.dv; ++c) {
    for (int64_t r = 0; r < nk; ++r) vt_buf[c * ld + r] = widen(v.row(j0 + r)[c]);
    for (int64_t r = nk; r < lanes; ++r) vt_buf[c * ld + r] = 0.0f;
  }
  for (int64_t r = 0; r < nk; ++r) {
    for (int64_t c = 0; c < p.d; ++c) ks[r * dp + c] = widen(k.row(j0 + r)[c]) * p.scale;
    for (int64_t c = p.d; c < dp; ++c) ks[r * dp + c] = 0.0f;
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
    const HeadScores variants(p.variants, h);

    // Query tiles on the block_q grid of the head (chunks start on it), clipped to the chunk.
    for (int64_t i0 = query_range.begin / p.block_q * p.block_q; i0 < query_range.end; i0 += p.block_q) {
      const int64_t ni = std::min(p.block_q, chunk.end - i0), li = i0 - chunk.begin;  // li: chunk-local
      const Range rows{i0, i0 + ni};
      const TileKind kind = args.mask.classify(b, h, rows, keys);
      if (kind == TileKind::kSkip) continue;
      if (kind == TileKind::kPartial) args.mask.fill(b, h, rows, keys, kLog2e, buf.mask, ld, 1);

      // S = Q Kᵀ (base 2, [soft-cap, ALiBi,] + mask);  P = exp2(S − lse2)
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
          Vec pr = simd::exp2_nonpositive(t);
          if constexpr (kVariants) pr = simd::select_below(t, simd::set1(kNegligible), simd::zero(), pr);
          simd::store(srow + lv, pr);
        }
      }
      // dP = dO Vᵀ
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
            simd::store(z + r * ld + lv, simd::mul(simd::load(s + r * ld + lv), zz));
          }
        }
        p_used = z;
      }
      // Mixed precision: P∘z enters dV as bf16 (into z; P stays fp32 for dS).
      if constexpr (kRoundsProducts<T>) {
        round_tile_to_bf16(p_used, buf.z, ni, lanes, ld);
        p_used = buf.z;
      }
      // dVᵀ += dOᵀ (P∘z)
      tile_product(p.dv, lanes, ni, {g.row(li), 1, g.stride}, {p_used, ld}, {dvt, ld}, Accum::kAdd);
      // dS = P ∘ (dP − D)  [∘ (1 − tanh²) when soft-capped: then it is dT, the gradient of t]
      for (int64_t r = 0; r < ni; ++r) {
        const Vec row_delta = simd::set1(delta[li + r]);
        for (int64_t lv = 0; lv < lanes; lv += kWidth) {
          Vec ds = simd::mul(simd::load(s + r * ld + lv), simd::sub(simd::load(dps + r * ld + lv), row_delta));
          if constexpr (kVariants) {
            if (variants.softcap()) ds = simd::mul(ds, simd::load(buf.cap + r * ld + lv));
          }
          simd::store(dps + r * ld + lv, ds);
        }
      }
      // Mixed precision: dS enters dK and dQ as bf16.
      if constexpr (kRoundsProducts<T>) round_tile_to_bf16(dps, dps, ni, lanes, ld);
      // dKᵀ += Qᵀ dS (scaled at the end);  dQ += dS (scale·K), only over the tile's real keys.
      tile_product(p.d, lanes, ni, {q.row(li), 1, q.stride}, {dps, ld}, {dkt, ld}, Accum::kAdd);
      tile_product(ni, dp, nk, {dps, ld, 1}, {ks, dp}, {dq + li * dp, dp}, Accum::kAdd);
    }
  }

  for (int64_t r = 0; r < nk; ++r) {
    float* dkrow = dk.data + (j0 + r) * dk.stride;
    float* dvrow = dv.data + (j0 + r) * dv.stride;
    if (first_chunk) {
      for (int64_t c = 0; c < p.d; ++c) dkrow[c] = dkt[c * ld + r] * p.scale;
      for (int64_t c = 0; c < p.dv; ++c) dvrow[c] = dvt[c * ld + r];
    } else {
      for (int64_t c = 0; c < p.d; ++c) dkrow[c] += dkt[c * ld + r] * p.scale;
      for (int64_t c = 0; c < p.dv; ++c) dvrow[c] += dvt[c * ld + r];
    }
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
      std::copy_n(acc + (u * n + i - rows.begin) * dp, p.d, dq.data + i * dq.stride);
  }
}

// The backward's work split when there are few key/value heads (see attention_flash_backward):
// for each chunk of query rows in turn, contiguous runs of key tiles. Called by every thread of the
// parallel region (it contains barriers).
struct Partial {  // dq of a key/value head's query heads this thread shares with a neighbour
  int64_t head = -1;
  Floats acc;
};
template <typename Elem>
void backward_split_key_tiles(const BackwardArgs& args, KeyTileFn key_tile, std::vector<int64_t>& prefix,
                              std::vector<std::array<Partial, 2>>& partials, int t, int T) {
  const Problem& p = args.p;
  const int64_t n_kt = ceil_div(p.M, p.block_k), n_items = p.B * p.Hkv * n_kt, dp = round_up(p.d, kWidth);
  BackwardBuffers buf(p, args.chunk_rows);
  // The chunks of whole-head mode, in the same order: each key tile's dk and dv rows are written by
  // the first chunk and added to by the later ones exactly as there, so they are the same bits
  // whichever mode ran (any thread count), and the buffers stay as small.
  for (int64_t i0 = 0; i0 < p.N; i0 += args.chunk_rows) {
    const Range chunk{i0, std::min(p.N, i0 + args.chunk_rows)};
    const int64_t acc_floats = p.group * (chunk.end - chunk.begin) * dp;
#pragma omp single
    {
      // prefix[n] = estimated cost of items [0, n): the chunk's query rows in range (of each query
      // head of the group), + 1 so that empty items count.
      for (int64_t n = 0; n < n_items; ++n) {
        const int64_t b = n / n_kt / p.Hkv, kt = n % n_kt;
        const Range rows = args.mask.query_range(b, {kt * p.block_k, std::min(p.M, (kt + 1) * p.block_k)});
        const int64_t seen = std::max<int64_t>(0, std::min(rows.end, chunk.end) - std::max(rows.begin, chunk.begin));
        prefix[n + 1] = prefix[n] + seen * p.group + 1;
      }
      for (auto& slots : partials)
        for (Partial& slot : slots) slot.head = -1;
    }  // (a barrier)
    const int64_t total = prefix.back();
    const auto cut = [&](int u) {
      return static_cast<int64_t>(std::lower_bound(prefix.begin(), prefix.end(), total * u / T) - prefix.begin());
    };
    const Range run{cut(t), cut(t + 1)};
    if (run.begin < run.end) {
      buf.head = -1;
      const auto finish_head = [&]() {
        const int64_t hd = buf.head;
        if (hd * n_kt >= run.begin && (hd + 1) * n_kt <= run.end) {
          write_dq_rows(args, buf.dq, buf.dp, hd / p.Hkv, hd % p.Hkv, chunk);
        } else {
          Partial& slot = partials[t][hd * n_kt < run.begin ? 0 : 1];
          slot.head = hd;
          slot.acc = Floats(acc_floats);
          std::copy_n(buf.dq, acc_floats, slot.acc.get());
        }
      };
      for (int64_t n = run.begin; n < run.end; ++n) {
        const int64_t hd = n / n_kt;
        if (hd != buf.head) {
          if (buf.head >= 0) finish_head();
          backward_begin_chunk<Elem>(args, buf, hd / p.Hkv, hd % p.Hkv, chunk);
        }
        key_tile(args, buf, hd / p.Hkv, hd % p.Hkv, n % n_kt);
      }
      finish_head();
    }
#pragma omp barrier
    // Heads cut between runs: the thread where the head starts (its slot 1) sums all parts in
    // thread order; later threads hold the rest in their slot 0.
    if (Partial& mine = partials[t][1]; mine.head >= 0) {
      const int64_t hd = mine.head;
      float* acc = mine.acc.get();
      for (int u = t + 1; u < T; ++u) {
        const Partial& other = partials[u][0];
        if (other.head != hd) continue;
        for (int64_t e = 0; e < acc_floats; ++e) acc[e] += other.acc.get()[e];
      }
      write_dq_rows(args, acc, dp, hd / p.Hkv, hd % p.Hkv, chunk);
    }
#pragma omp barrier  // before the next chunk's prefix and partials
  }
}

}  // namespace

const char* flash_isa() { return simd::kIsa; }

bool flash_supports_variants(int64_t H, int64_t Hkv, const AttentionOptions& options) {
  (void)H, (void)Hkv, (void)options;
  return true;  // GQA/MQA, soft-capping and ALiBi, with every mask kind and dropout
}

FlashConfig flash_resolved_config(const FlashConfig& config, const AttentionOptions& options, int64_t d, int64_t n,
                                  bool backward) {
  FlashConfig c = config;
  CABM_CHECK(c.block_q >= 0 && c.block_k >= 0, "flash tile sizes must be >= 0, got {}x{}", c.block_q, c.block_k);
  // Chosen on Zen 3 with AVX2 (32 KiB L1d, 512 KiB L2); differences between neighbouring choices
  // were within the measurement noise of a shared machine (±10%), so the rules are structural:
  //  - the broadcast dimension of the big products (keys in the forward's S = K·Qᵀ, queries in the
  //    backward's S and dP) is a multiple of the micro-kernel's 6 rows: no tail blocks;
  //  - the lane dimension is a multiple of 16 (two AVX2 vectors, a quarter of an AVX-512 chunk);
  //  - for d > 64 the forward takes 32 query rows so that Qᵀ and Oᵀ stay at 16 KiB each.
  //  - short sequences (N <= 256) with a diagonal (causal, sliding window) take 32 × 32 tiles:
  //    there nearly every tile of the default size straddles the diagonal and pays for a mask.
  //    Measured (B·N = 4096, H 8, 2 threads, causal; tile sizes interleaved in one process):
  //    N = 128, d 32: forward +24–31%, backward +12–24%; N = 256: +17% and +9–11%; at N = 512
  //    the gain is down to ≈ 5% and the defaults stay.
  // Not tuned for AVX-512 (no such machine was available).
  //    (Not for one query row, KV-cache decoding: its row sees whole tiles, no diagonal.)
  const bool short_diagonal =
      n > 1 && n <= 256 && (options.mask.causal_align() != CausalAlign::kNone || options.mask.has_window());
  const int64_t default_q = short_diagonal ? 32 : backward ? 96 : (d > 64 ? 32 : 64);
  const int64_t default_k = short_diagonal ? 32 : 96;
  // With a block-sparse layout, tiles that coincide with its blocks let whole blocks be skipped.
  const auto& layouts = options.mask.block_layouts();
  if (c.block_q == 0) {
    c.block_q = default_q;
    if (!layouts.empty() && layouts[0].block_q >= 8 && layouts[0].block_q <= 256) c.block_q = layouts[0].block_q;
  }
  if (c.block_k == 0) {
    c.block_k = default_k;
    if (!layouts.empty() && layouts[0].block_k >= 8 && layouts[0].block_k <= 256) c.block_k = layouts[0].block_k;
  }
  return c;
}

namespace {

// The forward and backward drivers, for inputs of element type T (see InputRows); shapes checked
// by the caller.
template <typename T>
void flash_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                   const Tensor& out, const Tensor* lse, const FlashConfig& config) {
  const Problem p = make_problem(q, k, v, options, config, false);
  if (lse)
    CABM_CHECK(lse->dtype() == DType::F32 && lse->shape() == (Shape{p.B, p.H, p.N}) && lse->is_contiguous(),
               "lse must be a contiguous F32 [B, H, N] tensor, got {}", shape_str(lse->shape()));
  const TileMask mask(options.mask, p.B, p.H, p.N, p.M);
  // K and V are packed head by head into contiguous rows. Heads are strided views (row stride H·d,
  // or 3·H·d in a fused projection): the rows of one tile, a power-of-two multiple of 512 bytes
  // apart, would fall into a few L1 sets and evict each other. Packing costs one pass over K and V.
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
      for (int64_t j = 0; j < p.M; ++j) {
        widen_row(ks.row(j), p.d, kd + j * p.d);
        widen_row(vs.row(j), p.dv, vd + j * p.dv);
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

// Work split of the backward. dk and dv are split by key tile, so each has one writer. dq of a
// query row gets a contribution from every key tile; a separate dq pass would redo two of the five
// block products (S and dP), 40% more work, and atomics would serialise. Instead each thread
// accumulates dq for the head in hand in a private [rows, d] buffer. A "head" here is a key/value
// head with the query heads of its group (GQA; one query head without): the group's sums into dk
// and dv stay inside one work item, in head order.
//  - with enough heads (B·Hkv a multiple of the thread count, or at least 4 per thread), whole heads
//    are handed out dynamically (robust when a thread is slowed down); dq has one writer per head.
//    A long head is walked in chunks of query rows (backward_chunk_rows), each against every key
//    tile, so the buffers stay within a few MiB per thread whatever N;
//  - otherwise, chunk by chunk of query rows (the same chunks), the work items (b, hk, key tile),
//    in order, are cut into one contiguous run per thread with equal estimated cost; a head within
//    one run is written directly, and the few heads cut between runs (at most one per boundary)
//    are summed from the threads' partial buffers in thread order after a barrier.
// Either way dq is deterministic for a given thread count and costs no extra arithmetic, and dk,
// dv (one writer per key tile, chunks in order) are the same bits for any thread count. Memory:
// O(threads · group · chunk rows · d).
template <typename Elem>
void flash_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                    const AttentionGrads& grads, const FlashConfig& config) {
  CABM_CHECK(saved.lse.defined(), "attention_flash_backward needs the forward's log-sum-exp (saved.lse)");
  const Problem p = make_problem(saved.q, saved.k, saved.v, options, config, true);
  const TileMask mask(options.mask, p.B, p.H, p.N, p.M);
  const BackwardArgs args{saved, dout, grads, options, mask, p, backward_chunk_rows(p, config)};
  const KeyTileFn key_tile = p.variants.any() ? &backward_key_tile<Elem, true> : &backward_key_tile<Elem, false>;

  // Heads here are key/value heads: each work item covers the query heads of its group.
  const int64_t n_kt = ceil_div(p.M, p.block_k), heads = p.B * p.Hkv;
  std::vector<int64_t> prefix(static_cast<size_t>(heads * n_kt + 1), 0);  // of the split
  std::vector<std::array<Partial, 2>> partials(static_cast<size_t>(omp_get_max_threads()));

#pragma omp parallel
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    if (heads % T == 0 || heads >= 4 * T) {
      // Enough heads to balance: whole heads, handed out dynamically. Each head has one owner, so
      // dq needs no partial sums and does not depend on the thread count at all.
      const int64_t chunk_rows = args.chunk_rows;
      BackwardBuffers buf(p, chunk_rows);
#pragma omp for schedule(dynamic, 1)
      for (int64_t hd = 0; hd < heads; ++hd) {
        const int64_t b = hd / p.Hkv, hk = hd % p.Hkv;
        for (int64_t i0 = 0; i0 < p.N; i0 += chunk_rows) {
          const Range chunk{i0, std::min(p.N, i0 + chunk_rows)};
          backward_begin_chunk<Elem>(args, buf, b, hk, chunk);
          for (int64_t kt = 0; kt < n_kt; ++kt) key_tile(args, buf, b, hk, kt);
          write_dq_rows(args, buf.dq, buf.dp, b, hk, chunk);
        }
      }
    } else {
      backward_split_key_tiles<Elem>(args, key_tile, prefix, partials, t, T);
    }
  }
}

}  // namespace

void attention_flash_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                             const Tensor& out, const Tensor* lse, const FlashConfig& config) {
  check_attention_shapes(q, k, v, out);
  flash_forward<float>(q, k, v, options, out, lse, config);
}

void attention_flash_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                              const AttentionGrads& grads, const FlashConfig& config) {
  check_attention_backward_shapes(saved, dout, grads);
  flash_backward<float>(saved, dout, options, grads, config);
}

namespace detail {

void attention_flash_bf16_forward_simd(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const AttentionOptions& options, const Tensor& out, const Tensor* lse,
                                       const FlashConfig& config) {
  flash_forward<bf16>(q, k, v, options, out, lse, config);
}

void attention_flash_bf16_backward_simd(const AttentionSaved& saved, const Tensor& dout,
                                        const AttentionOptions& options, const AttentionGrads& grads,
                                        const FlashConfig& config) {
  flash_backward<bf16>(saved, dout, options, grads, config);
}

}  // namespace detail

}  // namespace cabm
