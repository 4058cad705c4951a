// What activations.cpp (checks, threads, the choice of set) shares with the GELU spans it runs once
// per instruction set (activations_body.h, compiled in activations_{avx512,avx2,portable}.cpp and
// chosen at run time by cpu_isa.h): the constants of the fast GELU and the spans' declarations.
// Internal to kernels/. Also every header the body needs: the per-set files include this before
// their `#pragma GCC target` region, so that nothing outside the kernel's own code is compiled for
// a set.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include "cabm/kernels/x86_intrinsics.h"
#endif

namespace cabm::gelu {

// With z = x/√2 and a = |z|:  Φ(x) = 1 − erfc(a)/2 for z ≥ 0, erfc(a)/2 for z < 0, and
//   erfc(a) = exp(−a²) · t · S(t),   t = 1 / (1 + p·a),  p = 0.42,
// where S(t) = erfcx(a)·(1 + p·a) is smooth and bounded on t ∈ (0, 1] (S → p/√π as a → ∞), so a
// degree-9 polynomial fits it within 2.3e-9 relative over a ∈ [0, 10] (weighted least squares
// iterated towards minimax against erfc(a)·exp(a²) in double). This is the substitution of Abramowitz & Stegun 7.1.26
// with a higher-degree fit. Computing erfc, not 1 + erf, keeps Φ's relative accuracy in the negative tail. a² = x²/2 is
// taken from x, not from the rounded z (whose error a² would amplify: 1e-5 relative at x = −12), and split exactly (x²
// = hi + lo with an FMA): exp(−a²) = exp(−hi/2)·(1 − lo/2). φ(x) = exp(−x²/2)/√(2π) reuses exp(−a²).
inline constexpr float kInvSqrt2 = 0.70710678118654752f;
inline constexpr float kInvSqrt2Pi = 0.39894228040143268f;
inline constexpr float kErfcP = 0.42f;
// S as a polynomial in u = 2t − 1 ∈ (−1, 1]: coefficients fall off fast (Σ|c| ≈ 1.01), so Horner's
// rule in float adds about 1e-7 relative.
inline constexpr float kErfcS[10] = {0.44004935026168823f,    0.32797524333000183f,   0.1746816635131836f,
                                     0.05778371915221214f,    0.004876086954027414f,  -0.0046804556623101234f,
                                     -0.0012985353823751211f, 0.0005151652148924768f, 0.0001780740567483008f,
                                     -8.034690108615905e-05f};
// Past a = 10 erfc(a) < 1e-44 is flushed to 0 anyway; clamping keeps a² finite (x = ±inf).
inline constexpr float kMaxA = 10.0f;
inline constexpr float kMaxAbsX = 15.0f;  // the same for x in exp(−x²/2)
// exp(r) on |r| <= ln2/2: degree-6 fit, 1.9e-9 relative. exp(v) = 2^n · exp(r), r = v − n·ln2
// with ln2 split in two (Cody & Waite) so r is exact enough.
inline constexpr float kExpC[7] = {1.0f,
                                   1.0f,
                                   0.49999991059303284f,
                                   0.16666419804096222f,
                                   0.04166822507977486f,
                                   0.008374815806746483f,
                                   0.0013836836442351341f};
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpMin = -87.0f;                  // below: the result is flushed to 0 (exp(−87) is 1.6e-38)
inline constexpr float kTanhAlpha = 0.7978845608028654f;  // √(2/π), GELU's tanh form
inline constexpr float kTanhCubic = 0.044715f;

}  // namespace cabm::gelu

// The spans, the same code in each set's namespace. Every element goes through the same vector
// code (a partial vector at the end through a zero-padded copy), so results do not depend on where
// a buffer is split, and the three sets give the same bits (the same operations, each rounded
// once: simd::fma_exact).
//   forward_span:       y[i] = gelu(v), v = x[i] + (bias ? bias[i] : 0); v also to x_out if non-null
//   backward_span:      dx[i] = dy[i] · gelu'(x[i]); dx may alias dy
//   tanh_forward_span:  x[i] = gelu_tanh(x[i] + (bias ? bias[i] : 0)) in place
namespace cabm::gelu_avx512 {
void forward_span(const float* x, const float* bias, float* x_out, float* y, int64_t n);
void backward_span(const float* x, const float* dy, float* dx, int64_t n);
void tanh_forward_span(const float* bias, float* x, int64_t n);
}  // namespace cabm::gelu_avx512
namespace cabm::gelu_avx2 {
void forward_span(const float* x, const float* bias, float* x_out, float* y, int64_t n);
void backward_span(const float* x, const float* dy, float* dx, int64_t n);
void tanh_forward_span(const float* bias, float* x, int64_t n);
}  // namespace cabm::gelu_avx2
namespace cabm::gelu_portable {
void forward_span(const float* x, const float* bias, float* x_out, float* y, int64_t n);
void backward_span(const float* x, const float* dy, float* dx, int64_t n);
void tanh_forward_span(const float* bias, float* x, int64_t n);
}  // namespace cabm::gelu_portable
