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
constexpr int64_t kBlock = 64;  // keys whose scores are computed before the softmax update

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

// Element access: F32 rows as they are, BF16 rows widened exactly (a 16-bit shift) in registers,
// so that a bf16 cache is read once, at half the bytes, with no staging copy.
inline simd::Vec load_elems(const float* p) {
  return simd::load(p);
}
inline simd::Vec load_elems(const bf16* p) {
  return simd::load_bf16(reinterpret_cast<const uint16_t*>(p));
}
inline float elem(float x) {
  return x;
}
inline float elem(bf16 x) {
  return bf16_to_float(x);
}

// One row of q (F32 or BF16) widened into dst, times `scale`.
void load_row(const Tensor& t, int64_t offset, int64_t n, float scale, float* dst) {
  if (t.dtype() == DType::BF16) {
    const bf16* src = t.data<bf16>() + offset;
    for (int64_t c = 0; c < n; ++c) dst[c] = bf16_to_float(src[c]) * scale;
  } else {
    const float* src = t.data<float>() + offset;
    for (int64_t c = 0; c < n; ++c) dst[c] = src[c] * scale;
  }
}

// The partial softmax state of one work item: per row m, l and acc [dv].
struct Partial {
  float* m;
  float* l;
  float* acc;
};

// s[r · kBlock + j] = q_r · k_j for kRows query rows and kWidth / kRows keys: the kWidth dot
// products accumulate lane-wise in registers, each chunk of a key loaded once for all the rows,
// and one sum_each reduces them together (a horizontal sum per dot product would cost more than
// the products). qs: [kRows, d]; k: rows ks apart.
template <int kRows, typename T>
void score_tile(const float* qs, int64_t d, const T* k, int64_t ks, float* s) {
  constexpr int kKeys = simd::kWidth / kRows;
  simd::Vec acc[simd::kWidth];
  for (simd::Vec& a : acc) a = simd::zero();
  const int64_t wide = d / simd::kWidth * simd::kWidth;
  for (int64_t c = 0; c < wide; c += simd::kWidth) {
    simd::Vec qv[kRows];
    for (int r = 0; r < kRows; ++r) qv[r] = simd::load(qs + r * d + c);
    for (int j = 0; j < kKeys; ++j) {
      const simd::Vec kv = load_elems(k + j * ks + c);
      for (int r = 0; r < kRows; ++r) acc[r * kKeys + j] = simd::fma(qv[r], kv, acc[r * kKeys + j]);
    }
  }
  float dots[simd::kWidth];
  simd::store(dots, simd::sum_each(acc));
  for (int r = 0; r < kRows; ++r)
    for (int j = 0; j < kKeys; ++j) {
      float dot = dots[r * kKeys + j];
      for (int64_t c = wide; c < d; ++c) dot += qs[r * d + c] * elem(k[j * ks + c]);
      s[r * kBlock + j] = dot;
    }
}

// One dot product, for the keys left over at the end of a block.
template <typename T>
float dot_row(const float* q, const T* k, int64_t d) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t c = 0; c < d; ++c) dot += q[c] * elem(k[c]);
  return dot;
}

// Scores of `rows` query rows (a multiple of kRows) against n keys.
template <int kRows, typename T>
void score_rows(const float* qs, int64_t rows, int64_t d, const T* k, int64_t ks, int64_t n, float* s) {
  constexpr int kKeys = simd::kWidth / kRows;
  for (int64_t r = 0; r < rows; r += kRows) {
    int64_t j = 0;
    for (; j + kKeys <= n; j += kKeys) score_tile<kRows>(qs + r * d, d, k + j * ks, ks, s + r * kBlock + j);
    for (; j < n; ++j)
      for (int rr = 0; rr < kRows; ++rr) s[(r + rr) * kBlock + j] = dot_row(qs + (r + rr) * d, k + j * ks, d);
  }
}

// The widest register tile whose row count divides `rows` (GQA groups: usually 4 or 2 rows).
template <typename T>
void scores(const float* qs, int64_t rows, int64_t d, const T* k, int64_t ks, int64_t n, float* s) {
  if (rows % 4 == 0) {
    score_rows<4>(qs, rows, d, k, ks, n, s);
  } else if (rows % 2 == 0) {
    score_rows<2>(qs, rows, d, k, ks, n, s);
  } else {
    score_rows<1>(qs, rows, d, k, ks, n, s);
  }
}

// max_j s[j] and Σ_j s[j], kWidth lanes at a time (the scalar chains would be latency-bound).
float max_of(const float* s, int64_t n) {
  int64_t j = 0;
  float m = -INFINITY;
  if (n >= simd::kWidth) {
    simd::Vec v = simd::load(s);
    for (j = simd::kWidth; j + simd::kWidth <= n; j += simd::kWidth) v = simd::max(v, simd::load(s + j));
    m = simd::reduce_max(v);
  }
  for (; j < n; ++j) m = std::max(m, s[j]);
  return m;
}
float sum_of(const float* p, int64_t n) {
  int64_t j = 0;
  simd::Vec v = simd::zero();
  for (; j + simd::kWidth <= n; j += simd::kWidth) v = simd::add(v, simd::load(p + j));
  float sum = simd::reduce_add(v);
  for (; j < n; ++j) sum += p[j];
  return sum;
}

// s → c·tanh(s / c), kWidth lanes at a time.
void soft_cap(float* s, int64_t n, float cap) {
  const simd::Vec c = simd::set1(cap);
  int64_t j = 0;
  for (; j + simd::kWidth <= n; j += simd::kWidth)
    simd::store(s + j, simd::mul(c, simd::tanh(simd::div(simd::load(s + j), c))));
  for (; j < n; ++j) s[j] = cap * std::tanh(s[j] / cap);
}

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
template <int kRows, typename T>
void accumulate_pv(const float* p, int64_t p_ld, const T* v, int64_t vs, int64_t n, float* acc, int64_t acc_ld,
                   int64_t c0) {
  constexpr int kCols = 4;
  simd::Vec a[kRows][kCols];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) a[r][c] = simd::load(acc + r * acc_ld + c0 + c * simd::kWidth);
  for (int64_t j = 0; j < n; ++j) {
    const T* vj = v + j * vs + c0;
    simd::Vec vv[kCols];
    for (int c = 0; c < kCols; ++c) vv[c] = load_elems(vj + c * simd::kWidth);
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
  // scores and weights of one block.
  int64_t work_floats() const { return s_.Hkv * s_.rows * s_.d + 2 * s_.rows * kBlock; }

  // Keys [j0, j1) of batch item b for every key/value head hk, into parts[hk].
  void run(int64_t b, int64_t j0, int64_t j1, const Partial* parts, float* work) const {
    if (k_.dtype() == DType::BF16) {
      run_typed<bf16>(b, j0, j1, parts, work);
    } else {
      run_typed<float>(b, j0, j1, parts, work);
    }
  }

 private:
  // The blocks go outer and the heads inner, so that the block's slab of the cache ([kBlock, Hkv,
  // d] rows, contiguous in a KV cache) comes from memory once and serves every head from the cache.
  template <typename T>
  void run_typed(int64_t b, int64_t j0, int64_t j1, const Partial* parts, float* work) const {
    const int64_t R = s_.rows, d = s_.d, dv = s_.dv;
    float* qs = work;                 // [Hkv, R, d] scaled queries
    float* sc = qs + s_.Hkv * R * d;  // [R, kBlock] scores of a block
    float* pb = sc + R * kBlock;      // [R, kBlock] their exponentials
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
    const T* kdata = k_.data<T>() + b * k_.stride(0);
    const T* vdata = v_.data<T>() + b * v_.stride(0);
    for (int64_t jb = j0; jb < j1; jb += kBlock) {
      const int64_t n = std::min(kBlock, j1 - jb);
      for (int64_t hk = 0; hk < s_.Hkv; ++hk) {
        const Partial& part = parts[hk];
        scores(qs + hk * R * d, R, d, kdata + jb * k_.stride(1) + hk * k_.stride(2), k_.stride(1), n, sc);
        bool any = false;
        for (int64_t r = 0; r < R; ++r)
          any |= softmax_row(r, hk, jb, n, range[r], sc + r * kBlock, pb + r * kBlock, part);
        if (any) accumulate(pb, vdata + jb * v_.stride(1) + hk * v_.stride(2), v_.stride(1), n, part.acc);
      }
    }
  }

  // Scores of one row for keys jb..jb+n → variants and mask → online softmax update of m, l and
  // the rescaling of acc; p receives exp(s − m) (0 for blocked keys). False when the whole
  // block is blocked for this row (p all 0).
  bool softmax_row(int64_t r, int64_t hk, int64_t jb, int64_t n, KeyRange range, float* s, float* p,
                   Partial part) const {
    const int64_t h = hk * s_.group + r / s_.N, i = r % s_.N, dv = s_.dv;
    const float slope = o_.alibi_slopes.empty() ? 0.0f : o_.alibi_slopes[h];
    const int64_t qpos = o_.q_positions.empty() ? s_.M - s_.N + i : o_.q_positions[i];
    if (o_.softcap > 0.0f) soft_cap(s, n, o_.softcap);
    if (slope != 0.0f)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t key = jb + j, kpos = o_.k_positions.empty() ? key : o_.k_positions[key];
        s[j] -= slope * static_cast<float>(std::llabs(qpos - kpos));
      }
    for (int64_t j = 0; j < std::min(n, range.begin - jb); ++j) s[j] = -INFINITY;
    for (int64_t j = std::max<int64_t>(0, range.end - jb); j < n; ++j) s[j] = -INFINITY;
    const float block_max = max_of(s, n);
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
    l += sum_of(p, n);
    return true;
  }

  // acc [R, dv] += P [R, n] · V [n, dv]: register blocks of 4 rows × 4 vectors, then the tails.
  template <typename T>
  void accumulate(const float* p, const T* v, int64_t vs, int64_t n, float* acc) const {
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
        const T* vj = v + j * vs;
        for (int64_t c = wide; c < dv; ++c) a[c] += pj * elem(vj[c]);
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
