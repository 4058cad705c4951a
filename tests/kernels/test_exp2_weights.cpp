// The exponential of the bf16 attention kernels' softmax weights (exp2_poly.h's degree-4
// polynomial): the scalar detail::exp2_weight within kExp2PRelError of 2^x over the range P takes,
// exact at integers, 0 below 2^kExp2Min and at −inf; the vector exp2_weights of
// attention/bf16_avx512.h and simd.h's (the flavour this file is built for: AVX-512 or AVX2 with
// -march=native, which the fp32 SIMD tiles' bf16 forward uses; the AVX2 set whatever the build:
// test_exp2_weights_avx2) bit for bit equal to it, so that every path rounds the same P to bf16.
// The bounds of test_attention_flash_bf16(_backward) count
// on kExp2PRelError.
#include "cabm/kernels/attention/bf16_avx512.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/exp2_poly.h"
#include "cabm/kernels/simd.h"
#include "util/exp2_arguments.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace cabm {
namespace {

TEST(Exp2Weights, ScalarWithinItsBoundOfExp2) {
  double worst = 0;
  for (float x : test::exp2_weight_arguments()) {
    const float y = detail::exp2_weight(x);
    if (!(x >= detail::kExp2Min)) {
      EXPECT_EQ(y, 0.0f) << "exp2_weight(" << x << ")";
      continue;
    }
    const double exact = std::exp2(static_cast<double>(x));
    if (exact < 0x1p-126) continue;  // a subnormal result: absolute error below 2^-149 instead
    const double rel = std::fabs(y / exact - 1.0);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, detail::kExp2PRelError) << "exp2_weight(" << x << ") = " << y << ", exact " << exact;
  }
  // A bound far above the polynomial's error would let a wrong constant through.
  EXPECT_GT(worst, 0.5 * detail::kExp2PRelError);
  for (int n = -126; n <= 0; ++n) EXPECT_EQ(detail::exp2_weight(static_cast<float>(n)), std::ldexp(1.0f, n)) << n;
}

#if defined(CABM_HAVE_AVX512_BF16_CODE)
CABM_AVX512_BF16 void exp2_weights16_avx512(const float* in, float* out) {
  _mm512_storeu_ps(out, detail::exp2_weights(_mm512_loadu_ps(in)));
}
#endif

TEST(Exp2Weights, VectorEqualsScalarBitForBit) {
#if defined(CABM_HAVE_AVX512_BF16_CODE)
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU (or OS) has no AVX-512 BF16: the vector weights are not used";
  const std::vector<float> xs = test::exp2_weight_arguments();
  std::vector<float> got(xs.size());
  for (size_t i = 0; i < xs.size(); i += 16) exp2_weights16_avx512(&xs[i], &got[i]);
  for (size_t i = 0; i < xs.size(); ++i) {
    const float expected = detail::exp2_weight(xs[i]);
    EXPECT_EQ(std::memcmp(&got[i], &expected, 4), 0)
        << "x " << xs[i] << ": vector " << got[i] << ", scalar " << expected;
  }
#else
  GTEST_SKIP() << "not an x86-64 build: no vector weights";
#endif
}

TEST(Exp2Weights, SimdFlavourEqualsScalarBitForBit) {
#if CABM_SIMD_LEVEL > 0
  const std::vector<float> xs = test::exp2_weight_arguments();
  std::vector<float> got(xs.size());
  for (size_t i = 0; i < xs.size(); i += simd::kWidth) simd::store(&got[i], simd::exp2_weights(simd::load(&xs[i])));
  for (size_t i = 0; i < xs.size(); ++i) {
    const float expected = detail::exp2_weight(xs[i]);
    EXPECT_EQ(std::memcmp(&got[i], &expected, 4), 0) << "x " << xs[i] << ": simd " << got[i] << ", scalar " << expected;
  }
#else
  GTEST_SKIP() << "built without AVX2 or AVX-512 flags: simd.h's portable flavour, which no bf16 path uses";
#endif
}

}  // namespace
}  // namespace cabm
