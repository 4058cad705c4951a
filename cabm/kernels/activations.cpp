#include "cabm/kernels/activations.h"

#include "cabm/core/threads.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include "cabm/kernels/x86_intrinsics.h"
#define CABM_GELU_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#include "cabm/kernels/x86_intrinsics.h"
#define CABM_GELU_AVX2 1
#endif

namespace cabm {

namespace {

// ---------------------------------------------------------------------------------------------
// GELU, fast path.
//
// With z = x/√2 and a = |z|:  Φ(x) = 1 − erfc(a)/2 for z ≥ 0, erfc(a)/2 for z < 0, and
//   erfc(a) = exp(−a²) · t · S(t),   t = 1 / (1 + p·a),  p = 0.42,
// where S(t) = erfcx(a)·(1 + p·a) is smooth and bounded on t ∈ (0, 1] (S → p/√π as a → ∞), so a
// degree-9 polynomial fits it within 2.3e-9 relative over a ∈ [0, 10] (weighted least squares
// iterated towards minimax against erfc(a)·exp(a²) in double). This is the substitution of Abramowitz & Stegun 7.1.26
// with a higher-degree fit. Computing erfc, not 1 + erf, keeps Φ's relative accuracy in the negative tail. a² = x²/2 is
// taken from x, not from the rounded z (whose error a² would amplify: 1e-5 relative at x = −12), and split exactly (x²
// = hi + lo with an FMA): exp(−a²) = exp(−hi/2)·(1 − lo/2). φ(x) = exp(−x²/2)/√(2π) reuses exp(−a²).
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kErfcP = 0.42f;
// S as a polynomial in u = 2t − 1 ∈ (−1, 1]: coefficients fall off fast (Σ|c| ≈ 1.01), so Horner's
// rule in float adds about 1e-7 relative.
constexpr float kErfcS[10] = {0.44004935026168823f,    0.32797524333000183f,   0.1746816635131836f,
                              0.05778371915221214f,    0.004876086954027414f,  -0.0046804556623101234f,
                              -0.0012985353823751211f, 0.0005151652148924768f, 0.0001780740567483008f,
                              -8.034690108615905e-05f};
// Past a = 10 erfc(a) < 1e-44 is flushed to 0 anyway; clamping keeps a² finite (x = ±inf).
constexpr float kMaxA = 10.0f;
constexpr float kMaxAbsX = 15.0f;  // the same for x in exp(−x²/2)
// exp(r) on |r| <= ln2/2: degree-6 fit, 1.9e-9 relative. exp(v) = 2^n · exp(r), r = v − n·ln2
// with ln2 split in two (Cody & Waite) so r is exact enough.
constexpr float kExpC[7] = {1.0f,
                            1.0f,
                            0.49999991059303284f,
                            0.16666419804096222f,
                            0.04166822507977486f,
                            0.008374815806746483f,
                            0.0013836836442351341f};
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpMin = -87.0f;  // below: the result is flushed to 0 (exp(−87) is 1.6e-38)

// The scalar form of the same operations (the build without AVX2/FMA; also documents the math).
// v <= 0.
[[maybe_unused]] inline float exp_nonpositive(float v) {
  if (v < kExpMin) return 0.0f;
  v = v >= kExpMin ? v : kExpMin;  // NaN, as _mm256_max_ps does
  const float n = std::nearbyint(v * kLog2e);
  float r = std::fma(-n, kLn2Hi, v);
  r = std::fma(-n, kLn2Lo, r);
  float p = kExpC[6];
  for (int k = 5; k >= 0; --k) p = std::fma(p, r, kExpC[k]);
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// Φ(x) and exp(−x²/2).
[[maybe_unused]] inline void gelu_parts(float x, float& cdf, float& e) {
  const float z = x * kInvSqrt2;
  float a = std::fabs(z);
  a = a <= kMaxA ? a : kMaxA;  // NaN too, as _mm256_min_ps does
  const float t = 1.0f / std::fma(kErfcP, a, 1.0f);
  const float u = std::fma(2.0f, t, -1.0f);
  float s = kErfcS[9];
  for (int k = 8; k >= 0; --k) s = std::fma(s, u, kErfcS[k]);
  float xa = std::fabs(x);
  xa = xa <= kMaxAbsX ? xa : kMaxAbsX;
  const float x2 = xa * xa;
  const float a2 = 0.5f * x2, a2_lo = 0.5f * std::fma(xa, xa, -x2);
  e = exp_nonpositive(-a2);
  e = std::fma(-e, a2_lo, e);
  const float half_q = 0.5f * (t * s * e);
  cdf = z < 0.0f ? half_q : 1.0f - half_q;
}

#if CABM_GELU_AVX512
// The AVX2 code below on 16 lanes, operation for operation (the same bits): masks for its
// comparisons, roundscale for round, abs for andnot(−0).
inline __m512 exp_nonpositive(__m512 v) {
  const __mmask16 flush = _mm512_cmp_ps_mask(v, _mm512_set1_ps(kExpMin), _CMP_LT_OQ);
  v = _mm512_max_ps(v, _mm512_set1_ps(kExpMin));  // NaN becomes kExpMin: x · Φ still gives NaN
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), v);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpC[6]);
  for (int k = 5; k >= 0; --k) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpC[k]));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~flush), p, _mm512_castsi512_ps(bits));
}

inline void gelu_parts(__m512 x, __m512& cdf, __m512& e) {
  const __m512 z = _mm512_mul_ps(x, _mm512_set1_ps(kInvSqrt2));
  const __m512 a = _mm512_min_ps(_mm512_abs_ps(z), _mm512_set1_ps(kMaxA));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(kErfcP), a, one));
  const __m512 u = _mm512_fmsub_ps(_mm512_set1_ps(2.0f), t, one);
  __m512 s = _mm512_set1_ps(kErfcS[9]);
  for (int k = 8; k >= 0; --k) s = _mm512_fmadd_ps(s, u, _mm512_set1_ps(kErfcS[k]));
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512 xa = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(kMaxAbsX));
  const __m512 x2 = _mm512_mul_ps(xa, xa);
  const __m512 a2 = _mm512_mul_ps(half, x2), a2_lo = _mm512_mul_ps(half, _mm512_fmsub_ps(xa, xa, x2));
  e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), a2));
  e = _mm512_fnmadd_ps(e, a2_lo, e);
  const __m512 half_q = _mm512_mul_ps(half, _mm512_mul_ps(_mm512_mul_ps(t, s), e));
  const __mmask16 negative = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ);
  cdf = _mm512_mask_blend_ps(negative, _mm512_sub_ps(one, half_q), half_q);
}

// Lanes [0, min(count, 16)).
inline __mmask16 lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1u);
}

#elif CABM_GELU_AVX2
inline __m256 exp_nonpositive(__m256 v) {
  const __m256 flush = _mm256_cmp_ps(v, _mm256_set1_ps(kExpMin), _CMP_LT_OQ);
  v = _mm256_max_ps(v, _mm256_set1_ps(kExpMin));  // NaN becomes kExpMin: x · Φ still gives NaN
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), v);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpC[6]);
  for (int k = 5; k >= 0; --k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpC[k]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(flush, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

inline void gelu_parts(__m256 x, __m256& cdf, __m256& e) {
  const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(kInvSqrt2));
  const __m256 a = _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), z), _mm256_set1_ps(kMaxA));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(kErfcP), a, one));
  const __m256 u = _mm256_fmsub_ps(_mm256_set1_ps(2.0f), t, one);
  __m256 s = _mm256_set1_ps(kErfcS[9]);
  for (int k = 8; k >= 0; --k) s = _mm256_fmadd_ps(s, u, _mm256_set1_ps(kErfcS[k]));
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 xa = _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(kMaxAbsX));
  const __m256 x2 = _mm256_mul_ps(xa, xa);
  const __m256 a2 = _mm256_mul_ps(half, x2), a2_lo = _mm256_mul_ps(half, _mm256_fmsub_ps(xa, xa, x2));
  e = exp_nonpositive(_mm256_sub_ps(_mm256_setzero_ps(), a2));
  e = _mm256_fnmadd_ps(e, a2_lo, e);
  const __m256 half_q = _mm256_mul_ps(half, _mm256_mul_ps(_mm256_mul_ps(t, s), e));
  const __m256 negative = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
  cdf = _mm256_blendv_ps(_mm256_sub_ps(one, half_q), half_q, negative);
}

// Lanes [0, count) of a partial vector.
inline __m256i tail_mask(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

// y[i] = gelu(x[i] + (bias ? bias[i] : 0)); the biased input is written to x_out if non-null.
// Every element goes through the same vector code (partial vectors masked), so the result does
// not depend on where a buffer is split.
void gelu_forward_span(const float* x, const float* bias, float* x_out, float* y, int64_t n) {
#if CABM_GELU_AVX512
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = lanes(n - i);
    __m512 v = _mm512_maskz_loadu_ps(mask, x + i);
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias + i));
    __m512 cdf, e;
    gelu_parts(v, cdf, e);
    if (x_out) _mm512_mask_storeu_ps(x_out + i, mask, v);
    _mm512_mask_storeu_ps(y + i, mask, _mm512_mul_ps(v, cdf));
  }
#elif CABM_GELU_AVX2
  for (int64_t i = 0; i < n; i += 8) {
    const bool full = i + 8 <= n;
    const __m256i mask = tail_mask(n - i);
    __m256 v = full ? _mm256_loadu_ps(x + i) : _mm256_maskload_ps(x + i, mask);
    if (bias) v = _mm256_add_ps(v, full ? _mm256_loadu_ps(bias + i) : _mm256_maskload_ps(bias + i, mask));
    __m256 cdf, e;
    gelu_parts(v, cdf, e);
    const __m256 out = _mm256_mul_ps(v, cdf);
    if (full) {
      if (x_out) _mm256_storeu_ps(x_out + i, v);
      _mm256_storeu_ps(y + i, out);
    } else {
      if (x_out) _mm256_maskstore_ps(x_out + i, mask, v);
      _mm256_maskstore_ps(y + i, mask, out);
    }
  }
#else
  for (int64_t i = 0; i < n; ++i) {
    const float v = bias ? x[i] + bias[i] : x[i];
    float cdf, e;
    gelu_parts(v, cdf, e);
    if (x_out) x_out[i] = v;
    y[i] = v * cdf;
  }
#endif
}

// dx[i] = dy[i] · gelu'(x[i]); dx may alias dy.
void gelu_backward_span(const float* x, const float* dy, float* dx, int64_t n) {
#if CABM_GELU_AVX512
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = lanes(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(mask, x + i);
    const __m512 g = _mm512_maskz_loadu_ps(mask, dy + i);
    __m512 cdf, e;
    gelu_parts(v, cdf, e);
    const __m512 pdf = _mm512_mul_ps(e, _mm512_set1_ps(kInvSqrt2Pi));
    _mm512_mask_storeu_ps(dx + i, mask, _mm512_mul_ps(g, _mm512_fmadd_ps(v, pdf, cdf)));
  }
#elif CABM_GELU_AVX2
  for (int64_t i = 0; i < n; i += 8) {
    const bool full = i + 8 <= n;
    const __m256i mask = tail_mask(n - i);
    const __m256 v = full ? _mm256_loadu_ps(x + i) : _mm256_maskload_ps(x + i, mask);
    const __m256 g = full ? _mm256_loadu_ps(dy + i) : _mm256_maskload_ps(dy + i, mask);
    __m256 cdf, e;
    gelu_parts(v, cdf, e);
    const __m256 pdf = _mm256_mul_ps(e, _mm256_set1_ps(kInvSqrt2Pi));
    const __m256 out = _mm256_mul_ps(g, _mm256_fmadd_ps(v, pdf, cdf));
    if (full)
      _mm256_storeu_ps(dx + i, out);
    else
      _mm256_maskstore_ps(dx + i, mask, out);
  }
#else
  for (int64_t i = 0; i < n; ++i) {
    float cdf, e;
    gelu_parts(x[i], cdf, e);
    dx[i] = dy[i] * std::fma(x[i], e * kInvSqrt2Pi, cdf);
  }
#endif
}

void relu_forward_span(const float* x, const float* bias, float* x_out, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = bias ? x[i] + bias[i] : x[i];
    if (x_out) x_out[i] = v;
    y[i] = v < 0.0f ? 0.0f : v;  // NaN passes through, as in PyTorch
  }
}

// PyTorch's threshold_backward: gradient where x > 0, else 0.
void relu_backward_span(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

void forward_span(Activation act, const float* x, const float* bias, float* x_out, float* y, int64_t n) {
  if (act == Activation::kRelu)
    relu_forward_span(x, bias, x_out, y, n);
  else
    gelu_forward_span(x, bias, x_out, y, n);
}

void backward_span(Activation act, const float* x, const float* dy, float* dx, int64_t n) {
  if (act == Activation::kRelu)
    relu_backward_span(x, dy, dx, n);
  else
    gelu_backward_span(x, dy, dx, n);
}

// Element-wise work is split into blocks of this many elements, a multiple of the vector width.
constexpr int64_t kBlock = 16384;

// fn(r0, r1) over blocks of whole rows, about kBlock elements each, so a bias lines up with the columns.
template <typename Fn>
void for_row_blocks(int64_t rows, int64_t F, Fn&& fn) {
  parallel_for_blocks(rows, std::max<int64_t>(1, kBlock / std::max<int64_t>(F, 1)), fn);
}

}  // namespace

void activation_forward(Activation act, const float* x, float* y, int64_t n) {
  parallel_for_blocks(n, kBlock, [&](int64_t begin, int64_t end) {
    forward_span(act, x + begin, nullptr, nullptr, y + begin, end - begin);
  });
}

void activation_backward(Activation act, const float* x, const float* dy, float* dx, int64_t n) {
  parallel_for_blocks(n, kBlock, [&](int64_t begin, int64_t end) {
    backward_span(act, x + begin, dy + begin, dx + begin, end - begin);
  });
}

void activation_forward_reference(Activation act, const float* x, float* y, int64_t n) {
  if (act == Activation::kRelu) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
}

void activation_backward_reference(Activation act, const float* x, const float* dy, float* dx, int64_t n) {
  if (act == Activation::kRelu) {
    for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    return;
  }
  // d/dx [x Φ(x)] = Φ(x) + x φ(x).
  for (int64_t i = 0; i < n; ++i) {
    const float cdf = 0.5f * (1.0f + std::erf(x[i] * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}

void bias_activation_forward(Activation act, const float* bias, float* pre, float* hidden, int64_t rows, int64_t F) {
  if (!bias) return activation_forward(act, pre, hidden, rows * F);
  for_row_blocks(rows, F, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) forward_span(act, pre + r * F, bias, pre + r * F, hidden + r * F, F);
  });
}

void bias_activation_inplace(Activation act, const float* bias, float* x, int64_t rows, int64_t F) {
  if (!bias) return activation_forward(act, x, x, rows * F);
  for_row_blocks(rows, F, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) forward_span(act, x + r * F, bias, nullptr, x + r * F, F);
  });
}

void bias_gelu_tanh_inplace(const float* bias, float* x, int64_t rows, int64_t F) {
  constexpr float kAlpha = 0.7978845608028654f;  // √(2/π)
  for_row_blocks(rows, F, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = x + r * F;
      for (int64_t c = 0; c < F; ++c) {
        const float v = bias ? row[c] + bias[c] : row[c];
        row[c] = 0.5f * v * (1.0f + std::tanh(kAlpha * (v + 0.044715f * v * v * v)));
      }
    }
  });
}

void bias_activation_backward(Activation act, const float* pre, const float* dh, float* dpre, float* dbias,
                              int64_t rows, int64_t F) {
  if (!dbias) return activation_backward(act, pre, dh, dpre, rows * F);
  if (rows <= 0 || F <= 0) return;
  constexpr int64_t kChunks = 32;  // fixed: the sum order does not depend on the thread count
  const int64_t chunks = std::min<int64_t>(rows, kChunks);
  thread_local std::vector<float> partial;
  partial.assign(static_cast<size_t>(chunks * F), 0.0f);
  float* partial_data = partial.data();
#pragma omp parallel for schedule(static) if (rows * F >= 2 * kBlock)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    float* acc = partial_data + chunk * F;
    for (int64_t r = rows * chunk / chunks; r < rows * (chunk + 1) / chunks; ++r) {
      float* out = dpre + r * F;
      backward_span(act, pre + r * F, dh + r * F, out, F);
      for (int64_t c = 0; c < F; ++c) acc[c] += out[c];
    }
  }
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    for (int64_t c = 0; c < F; ++c) dbias[c] += partial_data[chunk * F + c];
}

}  // namespace cabm
