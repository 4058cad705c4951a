// The GELU spans (activations.cpp) compiled once per instruction set: activations_{avx512,avx2,
// portable}.cpp include this file inside a `#pragma GCC target` region after defining
//   CABM_SIMD_LEVEL     2, 1 or 0: the simd.h flavour (GCC does not define __AVX512F__
//                       inside such a region, so it is chosen explicitly)
//   CABM_SIMD_NS        that flavour's namespace (simd_avx512, ...): one per set, so that the
//                       inline vector functions of different sets never merge at link time
//   CABM_GELU_VARIANT   the namespace of this set's spans (gelu_avx512, ...)
// and after including activations_item.h, so that every header this code needs is read outside
// the region. Everything here has internal linkage but the spans declared in activations_item.h.
// The math (and its accuracy) is described there and in activations.h; the code is the former
// per-set intrinsic copies written once on simd::Vec, operation for operation, so the bits did
// not change.
#include "cabm/kernels/simd.h"

namespace cabm::CABM_GELU_VARIANT {
namespace {

namespace simd = ::cabm::CABM_SIMD_NS;
using namespace ::cabm::gelu;
using simd::load_n;
using simd::store_n;
using simd::Vec;

// exp(v) for v <= 0 (not NaN); 0 below kExpMin.
inline Vec exp_nonpositive(Vec v) {
  const Vec vc = simd::max(v, simd::set1(kExpMin));
  const Vec n = simd::round_nearest(simd::mul(vc, simd::set1(kLog2e)));
  Vec r = simd::fma_exact(n, simd::set1(-kLn2Hi), vc);
  r = simd::fma_exact(n, simd::set1(-kLn2Lo), r);
  Vec p = simd::set1(kExpC[6]);
  for (int k = 5; k >= 0; --k) p = simd::fma_exact(p, r, simd::set1(kExpC[k]));
  return simd::select_below(v, simd::set1(kExpMin), simd::zero(), simd::mul(p, simd::pow2_int(n)));
}

// Φ(x) and exp(−x²/2). NaN x gives a finite cdf (the clamps take the bound), x · Φ is NaN.
inline void gelu_parts(Vec x, Vec& cdf, Vec& e) {
  const Vec one = simd::set1(1.0f), half = simd::set1(0.5f);
  const Vec z = simd::mul(x, simd::set1(kInvSqrt2));
  const Vec a = simd::min(simd::abs(z), simd::set1(kMaxA));
  const Vec t = simd::div(one, simd::fma_exact(simd::set1(kErfcP), a, one));
  const Vec u = simd::fma_exact(simd::set1(2.0f), t, simd::set1(-1.0f));
  Vec s = simd::set1(kErfcS[9]);
  for (int k = 8; k >= 0; --k) s = simd::fma_exact(s, u, simd::set1(kErfcS[k]));
  const Vec xa = simd::min(simd::abs(x), simd::set1(kMaxAbsX));
  const Vec x2 = simd::mul(xa, xa);
  const Vec a2 = simd::mul(half, x2);
  const Vec neg_a2_lo = simd::mul(simd::set1(-0.5f), simd::fma_exact(xa, xa, simd::sub(simd::zero(), x2)));
  e = exp_nonpositive(simd::sub(simd::zero(), a2));
  e = simd::fma_exact(e, neg_a2_lo, e);
  const Vec half_q = simd::mul(half, simd::mul(simd::mul(t, s), e));
  cdf = simd::select_below(z, simd::zero(), half_q, simd::sub(one, half_q));
}

// gelu_tanh(v) = 0.5·v·(1 + tanh(u)), u = √(2/π)·(v + 0.044715·v³), as v · sigmoid(2u):
//   0.5·(1 + tanh u) = 1 / (1 + exp(−2u)) = e / (1 + e) for u < 0, with e = exp(−2|u|) <= 1.
// Unlike 1 + tanh(u), nothing cancels for negative v (there simd::tanh's few ulps of 1 would be
// most of the result), so the error is exp's plus the rounding of u (conditioned by 2|u|).
inline Vec gelu_tanh(Vec v) {
  const Vec one = simd::set1(1.0f);
  const Vec v3 = simd::mul(simd::mul(v, v), v);
  const Vec u = simd::mul(simd::set1(kTanhAlpha), simd::fma_exact(simd::set1(kTanhCubic), v3, v));
  const Vec e = exp_nonpositive(simd::mul(simd::set1(-2.0f), simd::abs(u)));  // u = ±inf, NaN: 0
  const Vec inv = simd::div(one, simd::add(one, e));
  return simd::mul(v, simd::select_below(u, simd::zero(), simd::mul(e, inv), inv));
}

}  // namespace

void forward_span(const float* x, const float* bias, float* x_out, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += simd::kWidth) {
    const int64_t count = std::min<int64_t>(simd::kWidth, n - i);
    Vec v = load_n(x + i, count);
    if (bias) v = simd::add(v, load_n(bias + i, count));
    Vec cdf, e;
    gelu_parts(v, cdf, e);
    if (x_out) store_n(x_out + i, v, count);
    store_n(y + i, simd::mul(v, cdf), count);
  }
}

void backward_span(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; i += simd::kWidth) {
    const int64_t count = std::min<int64_t>(simd::kWidth, n - i);
    const Vec v = load_n(x + i, count), g = load_n(dy + i, count);
    Vec cdf, e;
    gelu_parts(v, cdf, e);
    const Vec pdf = simd::mul(e, simd::set1(kInvSqrt2Pi));
    store_n(dx + i, simd::mul(g, simd::fma_exact(v, pdf, cdf)), count);
  }
}

void tanh_forward_span(const float* bias, float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += simd::kWidth) {
    const int64_t count = std::min<int64_t>(simd::kWidth, n - i);
    Vec v = load_n(x + i, count);
    if (bias) v = simd::add(v, load_n(bias + i, count));
    store_n(x + i, gelu_tanh(v), count);
  }
}

}  // namespace cabm::CABM_GELU_VARIANT
