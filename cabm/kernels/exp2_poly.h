// The constants of cabm's vector exp2 (simd.h, in each instruction-set flavour, and the AVX-512
// BF16 attention kernels' copy of its AVX-512 exp2_weights, attention/bf16_avx512.h, which is
// compiled by function attribute and cannot include simd.h's): kept here once, so that every path
// evaluates the same polynomial; and the scalar exp2_weight, which the portable bf16 paths call.
//
// exp2(x) = 2^n · 2^f with n = floor(x), f = x − n ∈ [0, 1); 2^f by a degree-6 polynomial,
// Horner from kExp2Poly[0], then · f + 1 (relative error 6.6e-8 over every float f in [0, 1),
// evaluated in fp32 with FMAs; 8.4e-8 over every float x in [−3, 0) as AVX-512 computes it, f
// rounded down where x − n is inexact). Everything below 2^kExp2Min (−inf included) gives exactly 0.
// Floor rather than round-to-nearest (f ∈ [−½, ½], Cephes' exp2f, until session 32): AVX-512's
// vscalefps multiplies by 2^floor(x) itself, so its path takes f from one vreduceps and never
// forms n, one vector operation fewer per exponential (simd.h); every path follows, so that they
// evaluate the same polynomial on the same f.
//
// The bf16 attention kernels' softmax weights P are rounded to bf16 (8 significant bits, a
// relative error up to 2^-9) right after their exponential, so they take a degree-4 polynomial
// instead (kExp2PPoly, same form): relative error 2.96e-6 over every float f in [0, 1) evaluated
// in fp32, two FMAs fewer per 16 weights. Both are minimax fits of the relative error with the
// constant term held at 1 (Remez exchange; the error on [0, 1) is that of the same degree on
// [−½, ½], 2.9e-6 and 7.9e-8 for the polynomials used before).
#pragma once

#include <cmath>

namespace cabm::detail {

inline constexpr int kExp2Degree = 6;
inline constexpr float kExp2Poly[kExp2Degree] = {2.1612852e-4f, 1.2467863e-3f, 9.6754497e-3f,
                                                 5.5485282e-2f, 2.4022931e-1f, 6.9314706e-1f};
inline constexpr float kExp2Min = -126.0f;

inline constexpr int kExp2PDegree = 4;
inline constexpr float kExp2PPoly[kExp2PDegree] = {1.342668427e-2f, 5.224247422e-2f, 2.412802048e-1f, 6.930448449e-1f};
// max |exp2_weight(x)/2^x − 1|: 2.955e-6 from the polynomial over every float f in [0, 1) (fp32
// Horner), 2.974e-6 over every float x in [−3, 0) with f rounded down where inexact.
inline constexpr double kExp2PRelError = 3.0e-6;

// One softmax weight 2^x by kExp2PPoly: the vector paths' operations (n = floor(x), f = x − n
// rounded down where inexact as AVX-512's vreduceps rounds it, Horner by FMA, times 2^n, 0 below
// 2^kExp2Min) written plainly, so that the portable bf16 path rounds the same P to bf16 as the
// vector ones. f + n is exact but where f was rounded, and above x where it was rounded up.
inline float exp2_weight(float x) {
  if (!(x >= kExp2Min)) return 0.0f;
  const float n = std::floor(x);
  float f = x - n;
  if (f + n > x) f = std::nextafter(f, 0.0f);
  float y = kExp2PPoly[0];
  for (int c = 1; c < kExp2PDegree; ++c) y = std::fma(y, f, kExp2PPoly[c]);
  return std::ldexp(std::fma(y, f, 1.0f), static_cast<int>(n));
}

}  // namespace cabm::detail
