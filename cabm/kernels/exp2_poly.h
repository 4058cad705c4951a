// The constants of cabm's one vector exp2 (simd.h, in each instruction-set flavour, and the
// AVX-512 BF16 attention kernels' copy of its AVX-512 flavour, attention/bf16_avx512.h, which is
// compiled by function attribute and cannot include simd.h's): kept here once, so that every vector
// path evaluates the same polynomial. (The scalar bf16 paths, written to be read, call std::exp2.)
//
// exp2(x) = 2^n · 2^f with n = round(x), f = x − n ∈ [−½, ½]; 2^f by the degree-6 polynomial of
// Cephes' exp2f (relative error < 2e-7 on [−½, ½]), Horner from kExp2Poly[0], then · f + 1.
// Everything below 2^kExp2Min (−inf included) gives exactly 0.
#pragma once

namespace cabm::detail {

inline constexpr int kExp2Degree = 6;
inline constexpr float kExp2Poly[kExp2Degree] = {1.535336188319500e-4f, 1.339887440266574e-3f, 9.618437357674640e-3f,
                                                 5.550332471162809e-2f, 2.402264791363012e-1f, 6.931472028550421e-1f};
inline constexpr float kExp2Min = -126.0f;

}  // namespace cabm::detail
