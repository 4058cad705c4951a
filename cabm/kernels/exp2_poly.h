// The constants of cabm's vector exp2 (simd.h, in each instruction-set flavour, and the AVX-512
// BF16 attention kernels' copy of its AVX-512 exp2_weights, attention/bf16_avx512.h, which is
// compiled by function attribute and cannot include simd.h's): kept here once, so that every path
// evaluates the same polynomial; and the scalar exp2_weight, which the portable bf16 paths call.
//
// exp2(x) = 2^n · 2^f with n = round(x), f = x − n ∈ [−½, ½]; 2^f by the degree-6 polynomial of
// Cephes' exp2f (relative error < 2e-7 on [−½, ½]), Horner from kExp2Poly[0], then · f + 1.
// Everything below 2^kExp2Min (−inf included) gives exactly 0.
//
// The bf16 attention kernels' softmax weights P are rounded to bf16 (8 significant bits, a
// relative error up to 2^-9) right after their exponential, so they take a degree-4 polynomial
// instead (kExp2PPoly, same form): relative error 2.9e-6 on [−½, ½] evaluated in fp32, against
// 7.9e-8 for the degree-6 one, two FMAs fewer per 16 weights. Fitted for this use (minimax
// relative error, the constant term held at 1; degree 5 would give 2.2e-7, no better for bf16).
#pragma once

#include <cmath>

namespace cabm::detail {

inline constexpr int kExp2Degree = 6;
inline constexpr float kExp2Poly[kExp2Degree] = {1.535336188319500e-4f, 1.339887440266574e-3f, 9.618437357674640e-3f,
                                                 5.550332471162809e-2f, 2.402264791363012e-1f, 6.931472028550421e-1f};
inline constexpr float kExp2Min = -126.0f;

inline constexpr int kExp2PDegree = 4;
inline constexpr float kExp2PPoly[kExp2PDegree] = {9.582576647e-3f, 5.590682995e-2f, 2.402410728e-1f, 6.931241184e-1f};
inline constexpr double kExp2PRelError = 2.9e-6;  // max |poly/2^f − 1| on [−½, ½], fp32 Horner

// One softmax weight 2^x by kExp2PPoly: the vector paths' operations (n = x rounded to nearest
// even, Horner by FMA, times 2^n, 0 below 2^kExp2Min) written plainly, so that the portable bf16
// path rounds the same P to bf16 as the vector ones.
inline float exp2_weight(float x) {
  if (!(x >= kExp2Min)) return 0.0f;
  const float n = std::nearbyint(x), f = x - n;
  float y = kExp2PPoly[0];
  for (int c = 1; c < kExp2PDegree; ++c) y = std::fma(y, f, kExp2PPoly[c]);
  return std::ldexp(std::fma(y, f, 1.0f), static_cast<int>(n));
}

}  // namespace cabm::detail
