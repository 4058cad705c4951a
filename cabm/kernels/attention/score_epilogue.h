// The vector part of the score variants (attention/score_variants.h): soft-capping and ALiBi
// applied to a vector of block products. Included by the tile loops once per instruction set, in
// the namespace of that set's simd flavour (CABM_SIMD_NS, simd.h). Internal to kernels/.
#pragma once

#include "cabm/kernels/attention/score_variants.h"
#include "cabm/kernels/simd.h"

#include <cstdint>

namespace cabm::CABM_SIMD_NS {

namespace simd = ::cabm::CABM_SIMD_NS;

// The epilogue for one query head h.
class HeadScores {
 public:
  HeadScores(const ScoreVariants& v, int64_t h)
      : softcap_(v.softcap > 0.0f),
        alibi_(v.slopes != nullptr),
        cap_(simd::set1(v.softcap * 1.4426950408889634f)),
        neg_slope_(simd::set1(v.slopes ? -v.slopes[h] * 1.4426950408889634f : 0.0f)) {}

  bool softcap() const { return softcap_; }

  // x: products (see operand_scale); qpos − kpos of the lanes as float offsets (position_offsets
  // with a common base). Returns the base-2 score before the mask; with cap_grad, stores there
  // 1 − tanh²(u) (computed as the reference does) when soft-capping.
  simd::Vec score(simd::Vec x, simd::Vec qoff, simd::Vec koff, simd::Vec* cap_grad = nullptr) const {
    if (softcap_) {
      const simd::Vec th = simd::tanh(x);
      x = simd::mul(cap_, th);
      if (cap_grad) *cap_grad = simd::sub(simd::set1(1.0f), simd::mul(th, th));
    }
    if (alibi_) x = simd::fma(neg_slope_, simd::abs(simd::sub(qoff, koff)), x);
    return x;
  }

 private:
  bool softcap_, alibi_;
  simd::Vec cap_, neg_slope_;  // c · log2 e;  −slope_h · log2 e
};

}  // namespace cabm::CABM_SIMD_NS
