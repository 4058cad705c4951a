#include "cabm/kernels/attention_decode.h"

#include "cabm/core/dtype.h"
#include "cabm/kernels/attention_simd.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace cabm {
namespace {

constexpr int64_t kDefaultChunk = 512;
constexpr int64_t kBlock = 32;  // keys whose scores are computed before the softmax update

struct Shape7 {
  int64_t B, N, H, d, M, Hkv, dv, group, rows;  // rows = group · N: the query rows of one work item
};

// The keys query row i may see, from the structural parts of the mask: [begin, end).
struct KeyRange {
  int64_t begin, end;
};
KeyRange allowed_keys(const Mask& mask, int64_t b, int64_t i, int64_t N, int64_t M) {
  int64_t begin = 0, end = M;
  const int64_t p = i + M - N;  // bottom-right position of query i
  if (mask.causal_align() == CausalAlign::kBottomRight) end = std::min(end, p + 1);
  if (mask.causal_align() == CausalAlign::kTopLeft) end = std::min(end, i + 1);
  if (mask.window_left() != Mask::kUnbounded) begin = std::max(begin, p - mask.window_left());
  if (mask.window_right() != Mask::kUnbounded) end = std::min(end, p + mask.window_right() + 1);
  if (!mask.key_lengths().empty()) end = std::min(end, mask.key_lengths()[b]);
  return {std::max<int64_t>(begin, 0), std::max(end, begin)};
}

// bf16 → fp32 is a 16-bit shift: written inline so that it vectorises inside the loops that use
// it (a call per cache row of 64–128 elements costs more than the conversion).
inline void widen(const bf16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) out[c] = static_cast<uint32_t>(bits[c]) << 16;
}

// One row of q (F32 or BF16) widened into dst, times `scale`.
void load_row(const Tensor& t, int64_t offset, int64_t n, float scale, float* dst) {
  if (t.dtype() == DType::BF16) {
    widen(t.data<bf16>() + offset, dst, n);
    for (int64_t c = 0; c < n; ++c) dst[c] *= scale;
  } else {
    const float* src = t.data<float>() + offset;
    for (int64_t c = 0; c < n; ++c) dst[c] = src[c] * scale;
  }
}

// Keys/values rows j0..j0+n of (b, hk) as contiguous F32 rows: the cache itself when F32 and
// contiguous in the head dim (returns a pointer into it with its row stride), else widened.
const float* rows_of(const Tensor& t, int64_t b, int64_t hk, int64_t j0, int64_t n, int64_t width, float* scratch,
                     int64_t& stride) {
  const int64_t offset = b * t.stride(0) + j0 * t.stride(1) + hk * t.stride(2);
  if (t.dtype() == DType::F32) {
    stride = t.stride(1);
    return t.data<float>() + offset;
  }
  const bf16* src = t.data<bf16>() + offset;
  for (int64_t j = 0; j < n; ++j) widen(src + j * t.stride(1), scratch + j * width, width);
  stride = width;
  return scratch;
}

// The partial softmax state of one work item: per row m, l and acc [dv].
struct Partial {
  float* m;
  float* l;
  float* acc;
};

// p[j] = exp(s[j] − m) for a block of scores (−inf gives 0), kWidth lanes at a time.
void exp_block(const float* s, float m, int64_t n, float* p) {
  const simd::Vec shift = simd::set1(m), log2e = simd::set1(1.4426950408889634f);
  int64_t j = 0;
  for (; j + simd::kWidth <= n; j += simd::kWidth)
    simd::store(p + j, simd::exp2_nonpositive(simd::mul(simd::sub(simd::load(s + j), shift), log2e)));
  for (; j < n; ++j) p[j] = s[j] == -INFINITY ? 0.0f : std::exp(s[j] - m);
}

// acc[r][c] += Σ_j p[r][j] · v_j[c] for rows r0..r0+rows (rows <= 4), columns c0..c0+4·kWidth:
// the 16 accumulators stay in registers over the block's keys.
template <int kRows>
void accumulate_pv(const float* p, int64_t p_ld, const float* v, int64_t vs, int64_t n, float* acc, int64_t acc_ld,
                   int64_t c0) {
  constexpr int kCols = 4;
  simd::Vec a[kRows][kCols];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) a[r][c] = simd::load(acc + r * acc_ld + c0 + c * simd::kWidth);
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = v + j * vs + c0;
    simd::Vec vv[kCols];
    for (int c = 0; c < kCols; ++c) vv[c] = simd::load(vj + c * simd::kWidth);
    for (int r = 0; r < kRows; ++r) {
      const simd::Vec pr = simd::broadcast(p + r * p_ld + j);
      for (int c = 0; c < kCols; ++c) a[r][c] = simd::fma(pr, vv[c], a[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) simd::store(acc + r * acc_ld + c0 + c * simd::kWidth, a[r][c]);
}

class DecodeItem {
 public:
  DecodeItem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options, const Shape7& s)
      : q_(q), k_(k), v_(v), o_(options), s_(s), scale_(attention_scale(options, s.d)) {}

  // Floats of the per-thread workspace: the scaled queries of every key/value head, then the
  // scores, weights and widened rows of one block.
  int64_t work_floats() const {
    return s_.Hkv * s_.rows * s_.d + 2 * s_.rows * kBlock + kBlock * std::max(s_.d, s_.dv);
  }

  // Keys [j0, j1) of batch item b for every key/value head hk, into parts[hk]. The blocks go
  // outer and the heads inner, so that the block's slab of the cache ([kBlock, Hkv, d] rows,
  // contiguous in a KV cache) comes from memory once and serves every head from the cache.
  void run(int64_t b, int64_t j0, int64_t j1, const Partial* parts, float* work) const {
    const int64_t R = s_.rows, d = s_.d, dv = s_.dv;
    float* qs = work;                      // [Hkv, R, d] scaled queries
    float* sc = qs + s_.Hkv * R * d;       // [R, kBlock] scores of a block
    float* pb = sc + R * kBlock;           // [R, kBlock] their exponentials
    float* kbuf = pb + R * kBlock;         // widened keys / values of a block
    std::vector<KeyRange> range(static_cast<size_t>(R));
    for (int64_t i = 0; i < s_.N; ++i) {
      const KeyRange r = allowed_keys(o_.mask, b, i, s_.N, s_.M);
      for (int64_t g = 0; g < s_.group; ++g) range[g * s_.N + i] = r;
    }
    for (int64_t hk = 0; hk < s_.Hkv; ++hk) {
      const Partial& part = parts[hk];
      for (int64_t r = 0; r < R; ++r) {
        const int64_t h = hk * s_.group + r / s_.N, i = r % s_.N;
        load_row(q_, b * q_.stride(0) + i * q_.stride(1) + h * q_.stride(2), d, scale_, qs + (hk * R + r) * d);
        part.m[r] = -INFINITY;
        part.l[r] = 0.0f;
        std::fill_n(part.acc + r * dv, dv, 0.0f);
      }
    }
    for (int64_t jb = j0; jb < j1; jb += kBlock) {
      const int64_t n = std::min(kBlock, j1 - jb);
      for (int64_t hk = 0; hk < s_.Hkv; ++hk) {
        const Partial& part = parts[hk];
        int64_t ks = 0;
        const float* kr = rows_of(k_, b, hk, jb, n, d, kbuf, ks);
        for (int64_t j = 0; j < n; ++j) {
          const float* kj = kr + j * ks;
          for (int64_t r = 0; r < R; ++r) {
            const float* qr = qs + (hk * R + r) * d;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t c = 0; c < d; ++c) dot += qr[c] * kj[c];
            sc[r * kBlock + j] = dot;
          }
        }
        bool any = false;
        for (int64_t r = 0; r < R; ++r)
          any |= softmax_row(r, hk, jb, n, range[r], sc + r * kBlock, pb + r * kBlock, part);
        if (!any) continue;
        int64_t vs = 0;
        const float* vr = rows_of(v_, b, hk, jb, n, dv, kbuf, vs);
        accumulate(pb, vr, vs, n, part.acc);
      }
    }
  }

 private:
  // Scores of one row for keys jb..jb+n → variants and mask → online softmax update of m, l and
  // the rescaling of acc; p receives exp(s − m) (0 for blocked keys). False when the whole
  // block is blocked for this row (p all 0).
  bool softmax_row(int64_t r, int64_t hk, int64_t jb, int64_t n, KeyRange range, float* s, float* p,
                   Partial part) const {
    const int64_t h = hk * s_.group + r / s_.N, i = r % s_.N, dv = s_.dv;
    const float cap = o_.softcap;
    const float slope = o_.alibi_slopes.empty() ? 0.0f : o_.alibi_slopes[h];
    const int64_t qpos = o_.q_positions.empty() ? s_.M - s_.N + i : o_.q_positions[i];
    if (cap > 0.0f)
      for (int64_t j = 0; j < n; ++j) s[j] = cap * std::tanh(s[j] / cap);
    if (slope != 0.0f)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t key = jb + j, kpos = o_.k_positions.empty() ? key : o_.k_positions[key];
        s[j] -= slope * static_cast<float>(std::llabs(qpos - kpos));
      }
    for (int64_t j = 0; j < std::min(n, range.begin - jb); ++j) s[j] = -INFINITY;
    for (int64_t j = std::max<int64_t>(0, range.end - jb); j < n; ++j) s[j] = -INFINITY;
    float block_max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) block_max = std::max(block_max, s[j]);
    if (block_max == -INFINITY) {
      std::fill_n(p, n, 0.0f);
      return false;
    }
    float& m = part.m[r];
    float& l = part.l[r];
    if (block_max > m) {
      const float alpha = m == -INFINITY ? 0.0f : std::exp(m - block_max);
      l *= alpha;
      float* acc = part.acc + r * dv;
      for (int64_t c = 0; c < dv; ++c) acc[c] *= alpha;
      m = block_max;
    }
    exp_block(s, m, n, p);
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) sum += p[j];
    l += sum;
    return true;
  }

  // acc [R, dv] += P [R, n] · V [n, dv]: register blocks of 4 rows × 4 vectors, then the tails.
  void accumulate(const float* p, const float* v, int64_t vs, int64_t n, float* acc) const {
    const int64_t R = s_.rows, dv = s_.dv, wide = dv / (4 * simd::kWidth) * (4 * simd::kWidth);
    int64_t r = 0;
    for (; r + 4 <= R; r += 4)
      for (int64_t c0 = 0; c0 < wide; c0 += 4 * simd::kWidth)
        accumulate_pv<4>(p + r * kBlock, kBlock, v, vs, n, acc + r * dv, dv, c0);
    for (; r < R; ++r)
      for (int64_t c0 = 0; c0 < wide; c0 += 4 * simd::kWidth)
        accumulate_pv<1>(p + r * kBlock, kBlock, v, vs, n, acc + r * dv, dv, c0);
    if (wide == dv) return;
    for (int64_t rr = 0; rr < R; ++rr) {
      float* a = acc + rr * dv;
      for (int64_t j = 0; j < n; ++j) {
        const float pj = p[rr * kBlock + j];
        const float* vj = v + j * vs;
        for (int64_t c = wide; c < dv; ++c) a[c] += pj * vj[c];
      }
    }
  }

  const Tensor &q_, &k_, &v_;
  const AttentionOptions& o_;
  Shape7 s_;
  float scale_;
};

}  // namespace

bool attention_decode_supports(const Tensor& q, const Tensor& k, const AttentionOptions& options) {
  if (q.dim() != 4 || k.dim() != 4 || q.size(1) > kDecodeMaxQueryRows) return false;
  // Malformed shapes go to the other kernels, whose checks name the problem.
  if (k.size(2) < 1 || q.size(2) % k.size(2) != 0 || q.size(0) != k.size(0) || q.size(3) != k.size(3)) return false;
  if (options.dropout > 0.0f) return false;
  const Mask& mask = options.mask;
  return mask.block_layouts().empty() && mask.allowed().empty() && mask.biases().empty();
}

void attention_decode_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                              const Tensor& out, const Tensor* lse, int64_t chunk) {
  CABM_CHECK(attention_decode_supports(q, k, options), "attention_decode_forward: unsupported operands or options");
  CABM_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && (q.dtype() == DType::F32 || q.dtype() == DType::BF16),
             "attention_decode_forward: q, k, v must all be F32 or all BF16");
  for (const Tensor* t : {&q, &k, &v}) CABM_CHECK(t->stride(3) == 1, "attention_decode_forward: unit last stride");
  CABM_CHECK(out.dtype() == DType::F32 && out.dim() == 4 && out.stride(3) == 1, "attention_decode_forward: out F32");
  Shape7 s{q.size(0), q.size(1), q.size(2), q.size(3), k.size(1), k.size(2), v.size(3), 0, 0};
  CABM_CHECK(s.Hkv >= 1 && s.H % s.Hkv == 0 && k.size(0) == s.B && k.size(3) == s.d && v.size(0) == s.B &&
                 v.size(1) == s.M && v.size(2) == s.Hkv && out.shape() == (Shape{s.B, s.N, s.H, s.dv}),
             "attention_decode_forward: q {}, k {}, v {}, out {} do not match", shape_str(q.shape()),
             shape_str(k.shape()), shape_str(v.shape()), shape_str(out.shape()));
  if (lse) CABM_CHECK(lse->shape() == (Shape{s.B, s.H, s.N}) && lse->is_contiguous(), "lse must be [B, H, N]");
  check_attention_variants(options, s.H, s.N, s.M);
  options.mask.validate(s.B, s.H, s.N, s.M);
  s.group = s.H / s.Hkv;
  s.rows = s.group * s.N;
  if (chunk <= 0) chunk = kDefaultChunk;
  const int64_t chunks = std::max<int64_t>(1, (s.M + chunk - 1) / chunk), R = s.rows;
  const int64_t items = s.B * chunks;  // each: one batch item's key chunk, every key/value head
  // Partial states of every work item; one allocation per call (small: items · R · (dv + 2)).
  const size_t states = static_cast<size_t>(s.B * s.Hkv * chunks * R);
  std::vector<float> m(states), l(states), acc(states * static_cast<size_t>(s.dv));
  const DecodeItem item(q, k, v, options, s);
  const int64_t work_floats = item.work_floats();
#pragma omp parallel
  {
    std::vector<float> work(static_cast<size_t>(work_floats));
    std::vector<Partial> parts(static_cast<size_t>(s.Hkv));
#pragma omp for schedule(dynamic, 1)
    for (int64_t n = 0; n < items; ++n) {
      const int64_t b = n / chunks, c = n % chunks;
      for (int64_t hk = 0; hk < s.Hkv; ++hk) {
        const int64_t state = (b * s.Hkv + hk) * chunks + c;  // the merge's layout
        parts[hk] = {m.data() + state * R, l.data() + state * R, acc.data() + state * R * s.dv};
      }
      item.run(b, c * chunk, std::min(s.M, (c + 1) * chunk), parts.data(), work.data());
    }
  }
  // Merge the chunks of each row in chunk order (deterministic for any thread count).
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t hk = 0; hk < s.Hkv; ++hk) {
      const int64_t first = (b * s.Hkv + hk) * chunks;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t h = hk * s.group + r / s.N, i = r % s.N;
        float mm = -INFINITY;
        for (int64_t c = 0; c < chunks; ++c) mm = std::max(mm, m[(first + c) * R + r]);
        float* o = out.data<float>() + b * out.stride(0) + i * out.stride(1) + h * out.stride(2);
        std::fill_n(o, s.dv, 0.0f);
        float total = 0.0f;
        if (mm != -INFINITY) {
          for (int64_t c = 0; c < chunks; ++c) {
            const float mc = m[(first + c) * R + r];
            if (mc == -INFINITY) continue;
            const float w = std::exp(mc - mm);
            total += l[(first + c) * R + r] * w;
            const float* a = acc.data() + ((first + c) * R + r) * s.dv;
            for (int64_t e = 0; e < s.dv; ++e) o[e] += a[e] * w;
          }
          const float inv = 1.0f / total;
          for (int64_t e = 0; e < s.dv; ++e) o[e] *= inv;
        }
        if (lse) lse->data<float>()[(b * s.H + h) * s.N + i] = mm == -INFINITY ? -INFINITY : mm + std::log(total);
      }
    }
  }
}

}  // namespace cabm
