// The split-key decode kernel's work item (attention/decode.cpp) compiled once per instruction
// set: attention/decode_{avx512,avx2,portable}.cpp include this file inside a `#pragma GCC
// target` region after defining
//   CABM_SIMD_LEVEL       2, 1 or 0: the simd.h flavour (GCC does not define
//                         __AVX512F__ inside such a region, so it is chosen explicitly)
//   CABM_SIMD_NS          that flavour's namespace (simd_avx512, ...): one per set, so that the
//                         inline vector functions of different sets never merge at link time
//   CABM_DECODE_VARIANT   the namespace of this set's run_item (decode_avx512, ...)
// and after including attention/decode_item.h, so that every header this code needs is read
// outside the region (its inline functions and templates compiled for the build's own flags; only
// the code below is compiled for the set). Everything here has internal linkage but run_item.
#include "cabm/kernels/simd.h"
#include "cabm/kernels/unroll.h"

namespace cabm::CABM_DECODE_VARIANT {
namespace {

namespace simd = ::cabm::CABM_SIMD_NS;

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

// s[r · kDecodeBlock + j] = q_r · k_j for kRows query rows and kWidth / kRows keys: the kWidth dot
// products accumulate lane-wise in registers, each chunk of a key loaded once for all the rows,
// and one sum_each reduces them together (a horizontal sum per dot product would cost more than
// the products). qs: [kRows, d]; k: rows ks apart.
template <int kRows, typename T>
void score_tile(const float* qs, int64_t d, const T* k, int64_t ks, float* s) {
  constexpr int kKeys = simd::kWidth / kRows;
  simd::Vec acc[simd::kWidth];
  CABM_UNROLL
  for (int i = 0; i < simd::kWidth; ++i) acc[i] = simd::zero();
  const int64_t wide = d / simd::kWidth * simd::kWidth;
  for (int64_t c = 0; c < wide; c += simd::kWidth) {
    simd::Vec qv[kRows];
    CABM_UNROLL
    for (int r = 0; r < kRows; ++r) qv[r] = simd::load(qs + r * d + c);
    CABM_UNROLL
    for (int j = 0; j < kKeys; ++j) {
      const simd::Vec kv = load_elems(k + j * ks + c);
      CABM_UNROLL
      for (int r = 0; r < kRows; ++r) acc[r * kKeys + j] = simd::fma(qv[r], kv, acc[r * kKeys + j]);
    }
  }
  // sum_each takes an array by reference: a copy keeps acc's address untaken, so that it can
  // become registers (see kernels/unroll.h).
  simd::Vec sums[simd::kWidth];
  CABM_UNROLL
  for (int i = 0; i < simd::kWidth; ++i) sums[i] = acc[i];
  float dots[simd::kWidth];
  simd::store(dots, simd::sum_each(sums));
  CABM_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CABM_UNROLL
    for (int j = 0; j < kKeys; ++j) {
      float dot = dots[r * kKeys + j];
      for (int64_t c = wide; c < d; ++c) dot += qs[r * d + c] * elem(k[j * ks + c]);
      s[r * kDecodeBlock + j] = dot;
    }
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
    for (; j + kKeys <= n; j += kKeys) score_tile<kRows>(qs + r * d, d, k + j * ks, ks, s + r * kDecodeBlock + j);
    for (; j < n; ++j)
      for (int rr = 0; rr < kRows; ++rr) s[(r + rr) * kDecodeBlock + j] = dot_row(qs + (r + rr) * d, k + j * ks, d);
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
  CABM_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CABM_UNROLL
    for (int c = 0; c < kCols; ++c) a[r][c] = simd::load(acc + r * acc_ld + c0 + c * simd::kWidth);
  }
  for (int64_t j = 0; j < n; ++j) {
    const T* vj = v + j * vs + c0;
    simd::Vec vv[kCols];
    CABM_UNROLL
    for (int c = 0; c < kCols; ++c) vv[c] = load_elems(vj + c * simd::kWidth);
    CABM_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const simd::Vec pr = simd::broadcast(p + r * p_ld + j);
      CABM_UNROLL
      for (int c = 0; c < kCols; ++c) a[r][c] = simd::fma(pr, vv[c], a[r][c]);
    }
  }
  CABM_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CABM_UNROLL
    for (int c = 0; c < kCols; ++c) simd::store(acc + r * acc_ld + c0 + c * simd::kWidth, a[r][c]);
  }
}

class DecodeItem {
 public:
  explicit DecodeItem(const DecodeWork& w)
      : q_(w.q), k_(w.k), v_(w.v), o_(w.options), s_(w.s), scale_(w.scale), prefetch_(w.prefetch) {}

  // Keys [j0, j1) of batch item b for every key/value head hk, into parts[hk].
  void run(int64_t b, int64_t j0, int64_t j1, const DecodePartial* parts, float* work) const {
    if (k_.dtype() == DType::BF16) {
      run_typed<bf16>(b, j0, j1, parts, work);
    } else {
      run_typed<float>(b, j0, j1, parts, work);
    }
  }

 private:
  // The blocks go outer and the heads inner, so that the block's slab of the cache ([kDecodeBlock, Hkv,
  // d] rows, contiguous in a KV cache) comes from memory once and serves every head from the cache.
  template <typename T>
  void run_typed(int64_t b, int64_t j0, int64_t j1, const DecodePartial* parts, float* work) const {
    const int64_t R = s_.rows, d = s_.d, dv = s_.dv;
    float* qs = work;                   // [Hkv, R, d] scaled queries
    float* sc = qs + s_.Hkv * R * d;    // [R, kDecodeBlock] scores of a block
    float* pb = sc + R * kDecodeBlock;  // [R, kDecodeBlock] their exponentials
    std::vector<KeyRange> range(static_cast<size_t>(R));
    for (int64_t i = 0; i < s_.N; ++i) {
      const KeyRange r = decode_allowed_keys(o_.mask, b, i, s_.N, s_.M);
      for (int64_t g = 0; g < s_.group; ++g) range[g * s_.N + i] = r;
    }
    for (int64_t hk = 0; hk < s_.Hkv; ++hk) {
      const DecodePartial& part = parts[hk];
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
    for (int64_t jb = j0; jb < j1; jb += kDecodeBlock) {
      const int64_t n = std::min(kDecodeBlock, j1 - jb);
      const int64_t next = std::clamp<int64_t>(j1 - jb - kDecodeBlock, 0, kDecodeBlock);  // keys of the next block
      for (int64_t hk = 0; hk < s_.Hkv; ++hk) {
        if (prefetch_ && next > 0) {
          prefetch_rows(kdata + (jb + kDecodeBlock) * k_.stride(1) + hk * k_.stride(2), next, k_.stride(1), d);
          prefetch_rows(vdata + (jb + kDecodeBlock) * v_.stride(1) + hk * v_.stride(2), next, v_.stride(1), dv);
        }
        const DecodePartial& part = parts[hk];
        scores(qs + hk * R * d, R, d, kdata + jb * k_.stride(1) + hk * k_.stride(2), k_.stride(1), n, sc);
        bool any = false;
        for (int64_t r = 0; r < R; ++r)
          any |= softmax_row(r, hk, jb, n, range[r], sc + r * kDecodeBlock, pb + r * kDecodeBlock, part);
        if (any) accumulate(pb, vdata + jb * v_.stride(1) + hk * v_.stride(2), v_.stride(1), n, part.acc);
      }
    }
  }

  // Asks for n rows (ks apart, width elements each) of the next block, into L2, while this one
  // computes (DecodeWork::prefetch: for caches too big for the near caches; measured in
  // attention/decode.cpp). A head's rows are short (128 bytes for bf16 at d 64) and interleave
  // with the other heads' rows, which the hardware prefetchers follow poorly.
  template <typename T>
  static void prefetch_rows(const T* base, int64_t n, int64_t ks, int64_t width) {
    const int64_t bytes = width * static_cast<int64_t>(sizeof(T));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t off = 0; off < bytes; off += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(base + j * ks) + off, 0, 2);
  }

  // Scores of one row for keys jb..jb+n → variants and mask → online softmax update of m, l and
  // the rescaling of acc; p receives exp(s − m) (0 for blocked keys). False when the whole
  // block is blocked for this row (p all 0).
  bool softmax_row(int64_t r, int64_t hk, int64_t jb, int64_t n, KeyRange range, float* s, float* p,
                   DecodePartial part) const {
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
        accumulate_pv<4>(p + r * kDecodeBlock, kDecodeBlock, v, vs, n, acc + r * dv, dv, c0);
    for (; r < R; ++r)
      for (int64_t c0 = 0; c0 < wide; c0 += 4 * simd::kWidth)
        accumulate_pv<1>(p + r * kDecodeBlock, kDecodeBlock, v, vs, n, acc + r * dv, dv, c0);
    if (wide == dv) return;
    for (int64_t rr = 0; rr < R; ++rr) {
      float* a = acc + rr * dv;
      for (int64_t j = 0; j < n; ++j) {
        const float pj = p[rr * kDecodeBlock + j];
        const T* vj = v + j * vs;
        for (int64_t c = wide; c < dv; ++c) a[c] += pj * elem(vj[c]);
      }
    }
  }

  const Tensor &q_, &k_, &v_;
  const AttentionOptions& o_;
  DecodeShape s_;
  float scale_;
  bool prefetch_;
};

}  // namespace

void run_item(const DecodeWork& work, int64_t b, int64_t j0, int64_t j1, const DecodePartial* parts, float* scratch) {
  DecodeItem(work).run(b, j0, j1, parts, scratch);
}

}  // namespace cabm::CABM_DECODE_VARIANT
