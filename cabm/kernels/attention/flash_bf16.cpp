#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/attention/bf16_avx512.h"
#include "cabm/kernels/attention/bf16_packing.h"
#include "cabm/kernels/attention/bf16_variants.h"
#include "cabm/kernels/attention/flash_amx.h"
#include "cabm/kernels/attention/flash_bf16_backward.h"
#include "cabm/kernels/attention/flash_detail.h"
#include "cabm/kernels/attention/tile_mask.h"

#include "cabm/kernels/aligned_vector.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/exp2_poly.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

namespace cabm {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kKeyBlock = 16;  // keys per packed K block: one zmm of fp32 score lanes
// The packed paths' default tiles for long sequences (forward_tiles): 768 keys; AMX with 32 query rows.
constexpr int64_t kWideBlockK = 768, kAmxBlockQ = 32;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

// ---------------------------------------------------------------------------------------------
// Packed layouts (all bf16, zero padded), per key/value head (attention/bf16_packing.h; the
// avx512_bf16 products are in attention/bf16_avx512.h):
//   K  [Mp/16][dp/2][16][2]: block of 16 keys, then pairs of head-dim elements, key, element.
//   V  [Mp/2][dvp][2]: pair of keys, column, key.
//   Q  tile [bq][dp], P tile [bq][lds]: rows of pairs, read as 32-bit words and broadcast.
// Mp = M rounded up to 16, dp = d rounded up to 2, dvp = dv rounded up to 16; the AMX products
// pad further (attention/flash_amx.h): dp to 32, Mp by 16 more, S and P rows to 32 keys, query
// rows to 16.

// The paths (see attention/flash_bf16.h); the forward's tile loop below runs the products of
// portable, avx512_bf16 and both AMX paths.
enum class Path { kPortable, kSimdFp32, kAvx512Bf16, kAmxBf16, kAmxBf16Emulated };

bool is_amx(Path path) {
  return path == Path::kAmxBf16 || path == Path::kAmxBf16Emulated;
}

// What computes the products of the packed paths (avx512_bf16 and AMX), forward and backward.
detail::Bf16Products packed_products(Path path) {
  switch (path) {
    case Path::kAmxBf16:
      return detail::Bf16Products::kAmxTiles;
    case Path::kAmxBf16Emulated:
      return detail::Bf16Products::kAmxEmulated;
    default:
      CABM_CHECK(path == Path::kAvx512Bf16, "packed_products of a path without packed products");
      return detail::Bf16Products::kVdpbf16ps;
  }
}

struct Problem {
  int64_t B, N, H, Hkv, M, d, dv;  // query head h reads key/value head h / (H / Hkv)
  int64_t dp, dvp, Mp;
  int64_t block_q, block_k;  // block_k a multiple of 16
  int64_t row_pad, key_pad;  // query rows of the buffers rounded up to row_pad, keys (S, P rows) to key_pad
  float qscale;              // scale · log2(e): scores in base 2
  float keep_scale;
  bool dropout;
  Path path;      // portable, avx512_bf16 or AMX
  bool variants;  // soft-capping or ALiBi: a pass over each score tile (attention/bf16_variants.h)
};

using detail::bf16_head_ptr;
inline int64_t k_index(int64_t j, int64_t c, int64_t dp) {
  return detail::packed_k_index(j, c, dp);
}
inline int64_t v_index(int64_t j, int64_t c, int64_t dvp) {
  return detail::packed_v_index(j, c, dvp);
}

// ---------------------------------------------------------------------------------------------
// Portable products: the same packed operands, fp32 scalar math.

// s[r][c] = Σ_e q[r][e]·k[j0 + c][e] for r < ni, c < nk16 (j0 a multiple of 16).
void scores_portable(const bf16* qp, int64_t ni, const bf16* kp, int64_t j0, int64_t nk16, const Problem& p, float* s,
                     int64_t lds) {
  std::vector<float> kt(static_cast<size_t>(p.dp * nk16));  // [dp][nk16] fp32
  for (int64_t c = 0; c < nk16; ++c)
    for (int64_t e = 0; e < p.dp; ++e) kt[e * nk16 + c] = bf16_to_float(kp[k_index(j0 + c, e, p.dp)]);
  for (int64_t r = 0; r < ni; ++r) {
    float* srow = s + r * lds;
    std::fill_n(srow, nk16, 0.0f);
    for (int64_t e = 0; e < p.dp; ++e) {
      const float a = bf16_to_float(qp[r * p.dp + e]);
      const float* krow = kt.data() + e * nk16;
      for (int64_t c = 0; c < nk16; ++c) srow[c] += a * krow[c];
    }
  }
}

// o[r][c] += Σ_j pt[r][j]·v[j0 + j][c] for r < ni, c < dvp, j < nk2 (j0 even, nk2 even).
void pv_portable(const bf16* pt, int64_t ldp, int64_t ni, const bf16* vp, int64_t j0, int64_t nk2, const Problem& p,
                 float* o, int64_t ldo) {
  for (int64_t r = 0; r < ni; ++r) {
    float* orow = o + r * ldo;
    for (int64_t j = 0; j < nk2; ++j) {
      const float a = bf16_to_float(pt[r * ldp + j]);
      if (a == 0.0f) continue;
      const bf16* vrow = vp + v_index(j0 + j, 0, p.dvp);
      for (int64_t c = 0; c < p.dvp; ++c) orow[c] += a * bf16_to_float(vrow[2 * c]);
    }
  }
}

// Row pass of the online softmax over one tile (see forward_query_tile), P into s. The exponent
// x − m' of each weight (x = s·qscale + mask) is rounded as in the vector paths: one FMA for
// s·qscale − m' without a mask, s·qscale + mask then − m' with one (attention/bf16_avx512.h);
// 2^x by detail::exp2_weight, their polynomial.
void softmax_rows_portable(float* s, int64_t lds, int64_t ni, int64_t nk16, const float* mask, float qscale, float* m,
                           float* l, float* alpha) {
  for (int64_t r = 0; r < ni; ++r) {
    float* x = s + r * lds;
    const float* mrow = mask ? mask + r * lds : nullptr;
    const auto scaled = [&](int64_t c) { return mrow ? std::fma(x[c], qscale, mrow[c]) : x[c] * qscale; };
    float tmax = -INFINITY;
    for (int64_t c = 0; c < nk16; ++c) tmax = std::max(tmax, scaled(c));
    const float m_new = std::max(m[r], tmax);
    float sum = 0.0f;
    for (int64_t c = 0; c < nk16; ++c) {
      x[c] = detail::exp2_weight(mrow ? scaled(c) - m_new : std::fma(x[c], qscale, -m_new));
      sum += x[c];
    }
    alpha[r] = std::exp2(m[r] - m_new);
    l[r] = l[r] * alpha[r] + sum;
    m[r] = m_new;
  }
}

// ---------------------------------------------------------------------------------------------
// Forward. One work item is (b, h, query tile); rows are queries, lanes are keys (scores) or
// output columns (accumulator).

// Per-thread buffers, rows = block_q rounded up to row_pad. Rows past a short tile's end hold
// stale, finite values: the AMX products compute them and nothing reads the results.
struct Buffers {
  int64_t rows = 0, lds = 0, ldo = 0;
  // 64-byte aligned (detail::AlignedVector): the AMX tiles' rows and the zmm loads each stay
  // within one cache line.
  detail::AlignedVector<bf16> q, p;          // [rows][dp], [rows][lds]
  detail::AlignedVector<float> s, mask, z;   // [rows][lds]
  detail::AlignedVector<float> o;            // [rows][ldo]
  detail::AlignedVector<float> m, l, alpha;  // [rows]
  std::vector<int64_t> kpos;                 // [lds]: the tile's key positions (ALiBi)
  // Sized for pr and zeroed, as fresh vectors would be, in the storage the thread already has
  // (thread_buffers): a first-touched page costs more than clearing it again.
  void reset(const Problem& pr) {
    const auto zeroed = [](auto& v, int64_t n) { v.assign(static_cast<size_t>(n), {}); };
    rows = round_up(pr.block_q, pr.row_pad);
    lds = round_up(pr.block_k, pr.key_pad);
    ldo = pr.dvp;
    zeroed(q, rows * pr.dp);
    zeroed(p, rows * lds);
    zeroed(s, rows * lds);
    zeroed(mask, rows * lds);
    zeroed(z, pr.dropout ? rows * lds : 0);
    zeroed(o, rows * ldo);
    zeroed(m, rows);
    zeroed(l, rows);
    zeroed(alpha, rows);
    zeroed(kpos, pr.variants ? lds : 0);
  }
};

// The calling thread's buffers, reset for pr; kept at the largest size the thread has needed and
// freed when the thread ends (as the fp32 kernels' scratch, attention/flash_item.h).
Buffers& thread_buffers(const Problem& pr) {
  thread_local Buffers buffers;
  buffers.reset(pr);
  return buffers;
}

struct Args {
  const Tensor &q, &out;
  const bf16 *kp, *vp;  // packed key/value heads, [B·Hkv][Mp·dp] and [B·Hkv][Mp·dvp]
  float* lse;
  const AttentionOptions& options;
  const TileMask& mask;
  const detail::ScoreVariants& variants;
  const Problem& p;
};

void forward_query_tile(const Args& args, Buffers& buf, int64_t b, int64_t h, int64_t qt) {
  const Problem& p = args.p;
  const int64_t i0 = qt * p.block_q, ni = std::min(p.block_q, p.N - i0);
  const Range rows{i0, i0 + ni};
  const int64_t kv_head = b * p.Hkv + h / (p.H / p.Hkv);
  const bf16* kp = args.kp + kv_head * p.Mp * p.dp;
  const bf16* vp = args.vp + kv_head * p.Mp * p.dvp;
  const float qscale = p.variants ? 1.0f : p.qscale;  // the variant pass scales to base 2 itself

  const bf16* qs = bf16_head_ptr(args.q, b, h);
  const int64_t q_stride = args.q.stride(1);
  for (int64_t r = 0; r < ni; ++r) {
    std::copy_n(qs + (i0 + r) * q_stride, p.d, buf.q.data() + r * p.dp);
    std::fill(buf.q.data() + r * p.dp + p.d, buf.q.data() + (r + 1) * p.dp, bf16{0});
  }
  // −FLT_MAX, not −inf: exp2(s − m) stays free of inf − inf while a row has seen only masked keys.
  std::fill_n(buf.m.data(), ni, -FLT_MAX);
  std::fill_n(buf.l.data(), ni, 0.0f);
  std::fill_n(buf.o.data(), round_up(ni, p.row_pad) * buf.ldo, 0.0f);
  const DropoutMatrix dropout(args.options, b, h, p.H, p.M);
  float *s = buf.s.data(), *o = buf.o.data();

  // The diagonal's tile cut at a packed block: before it, no mask and the raw row maximum (Zen 4,
  // N 4096, causal, one thread, three rounds: d 64 0.4–1.5% faster, d 128 0.5%).
  static_assert(kBf16DiagonalCut % kKeyBlock == 0);
  const KeyTiles tiles = args.mask.key_tiles(b, rows, p.block_k, kBf16DiagonalCut);
  for (int64_t j0 = tiles.first(); j0 < tiles.end(); j0 += tiles.width(j0)) {
    const int64_t nk = tiles.width(j0), nk16 = round_up(nk, kKeyBlock);
    const Range keys{j0, j0 + nk};
    const TileKind kind = args.mask.classify(b, h, rows, keys);
    if (kind == TileKind::kSkip) continue;
    // Blocked and padding keys get −inf; the additive bias is scaled to base 2 like the scores.
    const float* mask = padded_key_mask(args.mask, kind, b, h, rows, keys, nk16, kLog2e, buf.mask.data(), buf.lds);

    // S = Q Kᵀ (fp32 accumulation), the variants (soft-cap, ALiBi), then per row: base-2 scaling
    // and mask, running maximum, P = exp2(S − m) in fp32, l = alpha·l + Σ P in fp32. Dropout
    // scales the weights that meet V, not l (the reference drops after normalising); P is rounded
    // to bf16 (the only rounding of the pass besides the inputs') and O = alpha ∘ O + P·V.
    float *m = buf.m.data(), *l = buf.l.data(), *alpha = buf.alpha.data();
    if (p.variants) args.variants.key_positions(j0, nk16, buf.kpos.data());
    float* z = nullptr;
    if (p.dropout) {
      z = buf.z.data();
      for (int64_t r = 0; r < ni; ++r) dropout.fill_row(i0 + r, j0, j0 + nk, p.keep_scale, z + r * buf.lds, 1);
    }
    if (is_amx(p.path)) {
      const detail::ScoreVariants* variants = p.variants ? &args.variants : nullptr;
      detail::amx_forward_tile({buf.q.data(),
                                p.dp,
                                ni,
                                kp + j0 * p.dp,
                                vp + j0 * p.dvp,
                                nk,
                                p.dvp,
                                mask,
                                z,
                                s,
                                buf.p.data(),
                                buf.lds,
                                o,
                                m,
                                l,
                                alpha,
                                qscale,
                                variants,
                                h,
                                i0,
                                buf.kpos.data()},
                               packed_products(p.path));
      continue;
    }
    const int64_t nk2 = round_up(nk, 2);
#if defined(CABM_HAVE_AVX512_BF16_CODE)
    if (p.path == Path::kAvx512Bf16) {
      if (!p.variants && nk16 <= detail::kFusedKeyBlocks * kKeyBlock) {
        detail::scores_softmax_avx512(buf.q.data(), ni, kp, j0, nk16, p.dp, mask, z, buf.lds, qscale, buf.p.data(),
                                      buf.lds, m, l, alpha);
      } else {
        detail::scores_avx512(buf.q.data(), ni, kp, j0, nk16, p.dp, s, buf.lds);
        if (p.variants) detail::variant_scores_avx512(args.variants, h, i0, ni, buf.kpos.data(), nk16, s, buf.lds);
        detail::softmax_rows_avx512(s, buf.lds, ni, nk16, mask, z, qscale, buf.p.data(), buf.lds, m, l, alpha);
      }
      detail::pv_avx512(buf.p.data(), buf.lds, ni, vp, j0, nk2, p.dvp, alpha, o, buf.ldo);
      continue;
    }
#endif
    scores_portable(buf.q.data(), ni, kp, j0, nk16, p, s, buf.lds);
    if (p.variants) detail::variant_scores_portable(args.variants, h, i0, ni, buf.kpos.data(), nk16, s, buf.lds);
    softmax_rows_portable(s, buf.lds, ni, nk16, mask, qscale, m, l, alpha);
    for (int64_t r = 0; r < ni; ++r) {
      if (z)
        for (int64_t c = 0; c < nk; ++c) s[r * buf.lds + c] *= z[r * buf.lds + c];
      float_to_bf16(s + r * buf.lds, buf.p.data() + r * buf.lds, nk2);
      if (alpha[r] != 1.0f)
        for (int64_t c = 0; c < buf.ldo; ++c) o[r * buf.ldo + c] *= alpha[r];
    }
    pv_portable(buf.p.data(), buf.lds, ni, vp, j0, nk2, p, o, buf.ldo);
  }

  // One division per row; fully masked rows (l = 0) give 0 and lse = −inf.
  detail::write_tile_output(args.out, b, h, i0, ni, p.dv, {o, buf.ldo, buf.l.data(), buf.m.data()},
                            args.lse ? args.lse + (b * p.H + h) * p.N + i0 : nullptr);
}

// ---------------------------------------------------------------------------------------------
// Path selection (see attention/flash_bf16.h).

bool have_simd_fp32() {
  return simd_isa() != SimdIsa::kPortable;
}

Path forward_path() {
  const bool vdpbf16ps = bf16_vdpbf16ps_active();
  if (bf16_active_isa() == Bf16Isa::kAvx512Bf16) {
    if (detail::amx_emulation()) return Path::kAmxBf16Emulated;  // a test hook (attention/flash_amx.h)
    if (bf16_amx_active()) return Path::kAmxBf16;
    if (vdpbf16ps) return Path::kAvx512Bf16;
    // vdpbf16ps does not outrun fp32 FMAs here (bf16.h): the widened tiles, on the SIMD set's FMAs.
    return have_simd_fp32() ? Path::kSimdFp32 : Path::kPortable;
  }
  if (!bf16_portable_forced() && have_simd_fp32()) return Path::kSimdFp32;
  return Path::kPortable;
}

// The backward takes the forward's path (attention/flash_bf16_backward.cpp for the bf16 ones).
Path backward_path() {
  return forward_path();
}

const char* path_name(Path path) {
  switch (path) {
    case Path::kAmxBf16:
      return "amx_bf16";
    case Path::kAmxBf16Emulated:
      return "amx_bf16_emulated";
    case Path::kAvx512Bf16:
      return "avx512_bf16";
    case Path::kSimdFp32:
      return simd_isa() == SimdIsa::kAvx512 ? "avx512_fp32" : "avx2_fp32";
    case Path::kPortable:
      break;
  }
  return "portable";
}

// The forward's tiles. P is rounded relative to the running maximum of the tiles seen so far, so a
// path's bits depend on its tiles. Portable and the fp32 SIMD tiles take flash_resolved_config's
// (the SIMD tiles its fp32 rules: they run the fp32 bodies, 64 × 64 on cores with two 512-bit
// FMA pipes);
// the packed paths (avx512_bf16, AMX) take 768-key tiles for long sequences, AMX with 32 query
// rows: what is not a product there is mostly per tile and per row (the row reductions, the O
// rescale, on AMX the S and O tile stores and loads), which 768 keys amortise eight times better
// than 96. Measured at N 4096, d 64 and 128, with and without a causal mask, 2 threads: on an Intel
// Xeon (Emerald Rapids, AMX), old/new time 1.16-1.56 (docs/amx_attention.md); on an AMD Zen 4
// (avx512_bf16, where this gives up the fused 96-key micro-kernel), 1.04-1.09, medians of three
// interleaved rounds (docs/attention_performance.md, session 22). Sliding windows and block-sparse
// layouts keep the narrow tiles, which follow their band or blocks, as do sequences of up to 256
// queries: at N 128 on the Zen 4 (session 43, bench/bench_attention_tiles, sizes interleaved call
// by call) they were the best or within 5% of it, but for the causal forward at d 32, where 32 × 96
// ran 1.10× as fast (0.3 ms of a training step's layer; not taken). Explicit tile sizes are kept.
FlashConfig forward_tiles(Path path, const FlashConfig& config, const AttentionOptions& options, int64_t d, int64_t n) {
  FlashConfig tiles =
      flash_resolved_config(config, options, d, n, false, path == Path::kSimdFp32 ? DType::F32 : DType::BF16);
  const Mask& mask = options.mask;
  const bool narrow = n <= 256 || mask.has_window() || !mask.block_layouts().empty();
  if ((is_amx(path) || path == Path::kAvx512Bf16) && !narrow) {
    if (config.block_q == 0 && is_amx(path)) tiles.block_q = kAmxBlockQ;
    if (config.block_k == 0) tiles.block_k = kWideBlockK;
  }
  tiles.block_k = round_up(tiles.block_k, kKeyBlock);
  return tiles;
}

}  // namespace

bool flash_bf16_supports_variants(int64_t H, int64_t Hkv, const AttentionOptions& options, bool backward) {
  if (Hkv < 1 || H % Hkv != 0) return false;
  // The backward's paths are the fp32 SIMD tiles (attention/flash.cpp), the vdpbf16ps one (GQA but
  // no score variants: those go to the SIMD tiles) and the portable one here, which runs every
  // variant; a process may take any of them (the override), so the SIMD tiles' limits apply.
  if (backward) return flash_supports_variants(H, Hkv, options);
  // The forward's own paths (amx_bf16, avx512_bf16, portable) run every variant.
  return forward_path() != Path::kSimdFp32 || flash_supports_variants(H, Hkv, options);
}

const char* attention_flash_bf16_path() {
  return path_name(forward_path());
}
FlashConfig attention_flash_bf16_forward_tiles(const Tensor& q, const AttentionOptions& options,
                                               const FlashConfig& config) {
  CABM_CHECK(q.dim() == 4, "q must be [B, N, H, d], got {}", shape_str(q.shape()));
  return forward_tiles(forward_path(), config, options, q.size(3), q.size(1));
}
const char* attention_flash_bf16_backward_path() {
  return path_name(backward_path());
}

void attention_flash_bf16_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                                   const AttentionGrads& grads, const FlashConfig& config) {
  check_attention_backward_shapes(saved, dout, grads, DType::BF16, /*need_lse=*/true);
  CABM_CHECK(options.dropout >= 0.0f && options.dropout < 1.0f, "dropout {} outside [0, 1)", options.dropout);
  check_attention_variants(options, saved.q.size(2), saved.q.size(1), saved.k.size(1));
  Path path = backward_path();
  // The vdpbf16ps and AMX backwards run GQA but not the score variants: those take the fp32 SIMD tiles.
  const auto is_packed = [](Path x) { return x == Path::kAvx512Bf16 || is_amx(x); };
  if (is_packed(path) && detail::ScoreVariants(options, saved.q.size(1), saved.k.size(1), saved.q.size(3)).active())
    path = have_simd_fp32() ? Path::kSimdFp32 : Path::kPortable;
  const bool packed = is_packed(path);
  const bool simd = path == Path::kSimdFp32;
  CABM_CHECK(!simd || flash_supports_variants(saved.q.size(2), saved.k.size(2), options),
             "attention_flash_bf16_backward on path {}: these variants (GQA, soft-cap, ALiBi) take the reference "
             "kernel (attention_backward)",
             path_name(path));
  if (saved.q.size(0) * saved.q.size(2) == 0) return;
  if (packed) {
    detail::attention_flash_bf16_backward_packed(
        saved, dout, options, grads,
        flash_resolved_config(config, options, saved.q.size(3), saved.q.size(1), true, DType::BF16),
        packed_products(path));
  } else if (simd) {
    detail::attention_flash_bf16_backward_simd(saved, dout, options, grads, config);
  } else {
    detail::attention_flash_bf16_backward_portable(saved, dout, options, grads, config);
  }
}

void attention_flash_bf16_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                  const Tensor& out, const Tensor* lse, const FlashConfig& config) {
  check_attention_shapes(q, k, v, out, DType::BF16);
  CABM_CHECK(options.dropout >= 0.0f && options.dropout < 1.0f, "dropout {} outside [0, 1)", options.dropout);
  check_attention_variants(options, q.size(2), q.size(1), k.size(1));
  CABM_CHECK(flash_bf16_supports_variants(q.size(2), k.size(2), options, false),
             "attention_flash_bf16_forward on path {}: these variants (GQA, soft-cap, ALiBi) take the reference "
             "kernel (attention_forward)",
             attention_flash_bf16_path());
  const Path path = forward_path();
  const FlashConfig tiles = forward_tiles(path, config, options, q.size(3), q.size(1));
  if (path == Path::kSimdFp32) {
    detail::attention_flash_bf16_forward_simd(q, k, v, options, out, lse, tiles);
    return;
  }
  Problem p{};
  p.B = q.size(0), p.N = q.size(1), p.H = q.size(2), p.Hkv = k.size(2), p.M = k.size(1);
  p.d = q.size(3), p.dv = v.size(3);
  p.path = path;
  const bool amx = is_amx(path);
  p.dp = amx ? round_up(std::max<int64_t>(p.d, 1), 32) : round_up(p.d, 2);
  p.dvp = round_up(std::max<int64_t>(p.dv, 1), 16);
  p.Mp = round_up(p.M, kKeyBlock) + (amx ? kKeyBlock : 0);
  // A key tile wider than the keys is one tile of all of them (the same bits): buffers for M keys.
  p.block_q = tiles.block_q, p.block_k = std::min(tiles.block_k, round_up(std::max<int64_t>(p.M, 1), kKeyBlock));
  p.row_pad = amx ? 16 : 1, p.key_pad = amx ? 32 : kKeyBlock;
  p.qscale = attention_scale(options, p.d) * kLog2e;
  p.keep_scale = 1.0f / (1.0f - options.dropout);
  p.dropout = options.dropout > 0.0f;
  const detail::ScoreVariants variants(options, p.N, p.M, p.d);
  p.variants = variants.active();
  if (lse)
    CABM_CHECK(lse->dtype() == DType::F32 && lse->shape() == (Shape{p.B, p.H, p.N}) && lse->is_contiguous(),
               "lse must be a contiguous F32 [B, H, N] tensor, got {}", shape_str(lse->shape()));
  if (p.B * p.H * p.N == 0) return;
  const TileMask mask(options.mask, p.B, p.H, p.N, p.M);

  // Once per key/value head: the query heads of a group read the same packed K and V.
  const detail::PackedKV packed = detail::packed_kv_storage(p.B * p.Hkv * p.Mp * p.dp, p.B * p.Hkv * p.Mp * p.dvp);
  bf16 *const kp = packed.k, *const vp = packed.v;
  detail::RowBlockPacker pack_k = detail::pack_row_blocks;
#if defined(CABM_HAVE_AVX512_BF16_CODE)
  if (path != Path::kPortable) pack_k = detail::pack_row_blocks_avx512;  // every other path runs AVX512_BF16
#endif
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hkv; ++h)
      detail::pack_kv_head(k, v, b, h, p.Mp, p.dp, p.dvp, kp + (b * p.Hkv + h) * p.Mp * p.dp,
                           vp + (b * p.Hkv + h) * p.Mp * p.dvp, pack_k);
  const Args args{q, out, kp, vp, lse ? lse->data<float>() : nullptr, options, mask, variants, p};

  // Head by head, heaviest first within a head (see forward_work_items).
  const std::vector<QueryTileItem> items = forward_work_items(mask, p.H, p.N, p.block_q, 0, p.B * p.H);

#pragma omp parallel
  {
    Buffers& buf = thread_buffers(p);
    if (amx) detail::amx_tiles_begin(packed_products(path));  // the tile configuration is per thread
#pragma omp for schedule(dynamic, 1)
    for (size_t n = 0; n < items.size(); ++n) forward_query_tile(args, buf, items[n].b, items[n].h, items[n].qt);
    if (amx) detail::amx_tiles_end(packed_products(path));
  }
}

}  // namespace cabm
