// The vector tanh of logit soft-capping (detail::tanh_avx512, attention/bf16_variants.h): within 2
// ulp of std::tanh from 0 through subnormals, the switch between its two formulas, saturation,
// ±inf, and both signs. The bounds of test_attention_bf16_variants.cpp count on those 2 ulp.
#include "cabm/kernels/attention/bf16_variants.h"
#include "cabm/kernels/bf16.h"

#include <gtest/gtest.h>

#include <algorithm>
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
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void tanh16(const float* in, float* out) {
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
  for (size_t i = 0; i < xs.size(); i += 16) tanh16(&xs[i], &got[i]);
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

}  // namespace
}  // namespace cabm
