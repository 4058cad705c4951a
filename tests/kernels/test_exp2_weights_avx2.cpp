// The bf16 weights' exponential of simd.h's AVX2 set, compiled by target region whatever the
// build's flags (as the run-time dispatched kernels compile it), bit for bit equal to the scalar
// detail::exp2_weight: the AVX2 set takes f = x − floor(x) with ordinary rounding and then rounds
// it down where that went up, as AVX-512's vreduceps does, so that an AVX2 CPU's avx2_fp32 bf16
// path rounds the same P as every other path. test_exp2_weights checks the build's own flavour,
// which is AVX-512 on an AVX-512 machine and portable in a CABM_NATIVE=OFF build.
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/exp2_poly.h"
#include "util/exp2_arguments.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include "cabm/kernels/x86_intrinsics.h"

#include "cabm/kernels/simd_set_avx2_begin.h"
// The AVX2 flavour of simd.h, in this region (its own headers are read above, outside it).
#include "cabm/kernels/simd.h"
namespace cabm::simd_avx2 {
namespace {
void exp2_weights_avx2(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kWidth) store(y + i, exp2_weights(load(x + i)));
}
}  // namespace
}  // namespace cabm::simd_avx2
#include "cabm/kernels/simd_set_end.h"
#endif

namespace cabm {
namespace {

TEST(Exp2WeightsAvx2, EqualsScalarBitForBit) {
#if defined(__x86_64__)
  if (!cpu_supports(SimdIsa::kAvx2)) GTEST_SKIP() << "this CPU (or OS) has no AVX2 + FMA: the AVX2 set is not used";
  const std::vector<float> xs = test::exp2_weight_arguments();
  std::vector<float> got(xs.size());
  simd_avx2::exp2_weights_avx2(xs.data(), got.data(), static_cast<int64_t>(xs.size()));
  int64_t rounded_down = 0;  // arguments where f's rounding decided the bits: the case this test is for
  for (size_t i = 0; i < xs.size(); ++i) {
    const float expected = detail::exp2_weight(xs[i]);
    EXPECT_EQ(std::memcmp(&got[i], &expected, 4), 0) << "x " << xs[i] << ": avx2 " << got[i] << ", scalar " << expected;
    const float n = std::floor(xs[i]);
    if (xs[i] >= detail::kExp2Min && (xs[i] - n) + n > xs[i]) ++rounded_down;
  }
  EXPECT_GT(rounded_down, 1000);
#else
  GTEST_SKIP() << "not an x86-64 build: no AVX2 set";
#endif
}

}  // namespace
}  // namespace cabm
