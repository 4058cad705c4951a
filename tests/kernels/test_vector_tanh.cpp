// The two vector tanhs of logit soft-capping: simd::tanh of the fp32 kernels (simd.h, the flavour
// this file is built for) within 5 u relative of tanh over the whole range, and the bf16 kernels'
// detail::tanh_avx512 (attention/bf16_variants.h) within 2 ulp of std::tanh from 0 through
// subnormals, the switch between its two formulas, saturation, ±inf, and both signs. The bounds
// of test_attention_flash_variants.cpp and test_attention_bf16_variants.cpp count on them.
#include "cabm/kernels/attention/bf16_variants.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/simd.h"
#include "util/attention_cases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace cabm {
namespace {

// Distance in units in the last place between two floats of the same sign.
int64_t ulps(float a, float b) {
  int32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return std::llabs(static_cast<int64_t>(x) - static_cast<int64_t>(y));
}

#if defined(CABM_HAVE_AVX512_VARIANTS)
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void tanh16_avx512(const float* in, float* out) {
  _mm512_storeu_ps(out, detail::tanh_avx512(_mm512_loadu_ps(in)));
}
#endif

TEST(Bf16VariantsTanh, WithinTwoUlpsOfStdTanh) {
#if defined(CABM_HAVE_AVX512_VARIANTS)
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU (or OS) has no AVX-512 BF16: the vector tanh is not used";
  std::vector<float> xs = {0.0f, -0.0f, 1e-45f, 1e-38f, 1e-30f, 1e-7f, 1e-4f, 0.1f, 0.6249999f, 0.625f,  0.6250001f,
                           1.0f, 2.0f,  4.5f,   8.9f,   9.5f,   10.0f, 20.0f, 1e4f, 1e30f,      INFINITY};
  for (float x = 1e-6f; x < 12.0f; x *= 1.0013f) xs.push_back(x);
  const size_t n = xs.size();
  for (size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);
  while (xs.size() % 16) xs.push_back(0.5f);
  std::vector<float> got(xs.size());
  for (size_t i = 0; i < xs.size(); i += 16) tanh16_avx512(&xs[i], &got[i]);
  int64_t worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float expected = std::tanh(xs[i]);
    ASSERT_EQ(std::signbit(got[i]), std::signbit(expected)) << xs[i];
    worst = std::max(worst, ulps(got[i], expected));
    EXPECT_LE(ulps(got[i], expected), 2) << "tanh(" << xs[i] << ") = " << got[i] << ", expected " << expected;
  }
  RecordProperty("worst_ulps", static_cast<int>(worst));
#else
  GTEST_SKIP() << "not an x86-64 build: no vector tanh";
#endif
}

TEST(SimdTanh, MatchesStdTanh) {
  std::vector<float> x;
  for (float t = -60.0f; t <= 60.0f; t += 0.00373f) x.push_back(t);
  for (float t = 1e-38f; t < 20.0f; t *= 1.003f) x.insert(x.end(), {t, -t});
  x.insert(x.end(), {0.0f, -0.0f, 1e-45f, -1e-45f, 0.625f, std::nextafter(0.625f, 0.0f), 9.0f, 44.0f, 1e30f, -1e30f,
                     INFINITY, -INFINITY, FLT_MAX, -FLT_MAX});
  while (x.size() % simd::kWidth) x.push_back(1.0f);
  std::vector<float> y(x.size());
  for (size_t n = 0; n < x.size(); n += simd::kWidth) simd::store(&y[n], simd::tanh(simd::load(&x[n])));
  double worst = 0;
  for (size_t n = 0; n < x.size(); ++n) {
    const double expected = std::tanh(static_cast<double>(x[n]));
    ASSERT_EQ(std::signbit(y[n]), std::signbit(x[n])) << x[n];
    if (expected == 0.0) {
      EXPECT_EQ(y[n], 0.0f) << x[n];
      continue;
    }
    // A few ulps relative over the whole range, small arguments included (no cancellation).
    const double rel = std::fabs(y[n] - expected) / std::fabs(expected);
    worst = std::max(worst, rel / test::kU);
    EXPECT_LE(rel, 5 * test::kU) << "tanh(" << x[n] << ") = " << y[n] << ", expected " << expected;
    EXPECT_LE(std::fabs(y[n]), 1.0f) << x[n];
  }
  RecordProperty("worst_relative_error_in_u", std::to_string(worst));
  float nan[simd::kWidth];
  simd::store(nan, simd::tanh(simd::set1(NAN)));
  EXPECT_TRUE(std::isnan(nan[0])) << "NaN stays NaN";
}

}  // namespace
}  // namespace cabm
