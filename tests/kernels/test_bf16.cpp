// bf16 buffer conversions: every path bit for bit equal to the scalar rules of cabm/core/dtype.h, over
// all special classes (zeros, subnormals, NaNs with payloads, infinities, overflow, rounding ties)
// and many random bit patterns, for every tail length; and the run-time dispatch.
#include "cabm/kernels/bf16.h"

#include "cabm/core/error.h"
#include "cabm/kernels/cpu_isa.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace cabm {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Bit patterns of every special class, and of every exponent with the low 16 bits at and around
// the rounding boundary (below, tie, above) and both parities of the bit that is kept last.
std::vector<uint32_t> special_patterns() {
  std::vector<uint32_t> v = {
      0x00000000, 0x80000000,                          // ±0
      0x7f800000, 0xff800000,                          // ±inf
      0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001,  // quiet and signalling NaNs
      0x7fbfffff, 0x7fffffff, 0xffffffff, 0x7f80ffff, 0x7fc12345, 0x7f812345,
      0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x00007fff, 0x0000ffff,  // subnormals
      0x007fffff, 0x807fffff, 0x007f8000, 0x007f7fff, 0x00400000,              // subnormal → normal
      0x00800000, 0x80800000,                                                  // ±FLT_MIN
      0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x7f7f7fff, 0x7f7e8000,              // overflow to inf or not
      0x3f800000, 0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001,              // ties around 1
  };
  const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t exp = 0; exp < 256; ++exp)
      for (uint32_t keep : {0x00u, 0x01u, 0x7eu, 0x7fu})
        for (uint32_t low : lows) v.push_back(sign << 31 | exp << 23 | keep << 16 | low);
  return v;
}

std::vector<uint32_t> random_patterns(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> v(n);
  for (auto& u : v) u = static_cast<uint32_t>(rng());
  return v;
}

using ToBf16 = std::function<void(const float*, bf16*, int64_t)>;
using ToF32 = std::function<void(const bf16*, float*, int64_t)>;

// Converts the patterns in chunks of every length 0..40 (tails and unaligned starts), then all at
// once, and compares with the scalar conversion bit for bit.
void expect_matches_scalar(const ToBf16& convert, const std::vector<uint32_t>& patterns, const std::string& what) {
  std::vector<float> src(patterns.size());
  for (size_t i = 0; i < patterns.size(); ++i) src[i] = from_bits(patterns[i]);
  std::vector<bf16> dst(src.size(), bf16{0xdead});
  size_t pos = 0;
  for (int64_t len = 0; pos < src.size(); len = (len + 1) % 41) {
    const int64_t n = std::min<int64_t>(len, static_cast<int64_t>(src.size() - pos));
    convert(src.data() + pos, dst.data() + pos, n);
    pos += static_cast<size_t>(n);
  }
  int failures = 0;
  for (size_t i = 0; i < src.size() && failures < 10; ++i) {
    const uint16_t expected = float_to_bf16(src[i]).bits;
    if (dst[i].bits != expected) {
      ++failures;
      ADD_FAILURE() << what << ": 0x" << std::hex << patterns[i] << " -> 0x" << dst[i].bits << ", expected 0x"
                    << expected;
    }
  }
  std::fill(dst.begin(), dst.end(), bf16{0xdead});
  convert(src.data(), dst.data(), static_cast<int64_t>(src.size()));
  for (size_t i = 0; i < src.size() && failures < 10; ++i)
    if (dst[i].bits != float_to_bf16(src[i]).bits) ++failures, ADD_FAILURE() << what << " (one call) at " << i;
}

void expect_widening_exact(const ToF32& convert, const std::string& what) {
  std::vector<bf16> src(65536 + 7);
  for (size_t i = 0; i < src.size(); ++i) src[i].bits = static_cast<uint16_t>(i);
  std::vector<float> dst(src.size());
  for (int64_t len : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{17}, static_cast<int64_t>(src.size())}) {
    std::fill(dst.begin(), dst.end(), 0.0f);
    convert(src.data(), dst.data(), len);
    for (int64_t i = 0; i < len; ++i)
      ASSERT_EQ(to_bits(dst[i]), static_cast<uint32_t>(src[i].bits) << 16) << what << " at " << i;
    for (size_t i = static_cast<size_t>(len); i < dst.size(); ++i) ASSERT_EQ(to_bits(dst[i]), 0u) << what;
  }
}

TEST(Bf16Scalar, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808000)).bits, 0x3f80);  // tie, kept bit even: down
  EXPECT_EQ(float_to_bf16(from_bits(0x3f818000)).bits, 0x3f82);  // tie, kept bit odd: up
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808001)).bits, 0x3f81);
  EXPECT_EQ(float_to_bf16(from_bits(0x7f7f8000)).bits, 0x7f80);  // rounds to +inf
  EXPECT_EQ(float_to_bf16(from_bits(0x7f800001)).bits, 0x7fc0);  // signalling NaN → quiet NaN
  EXPECT_EQ(float_to_bf16(from_bits(0xff800000)).bits, 0xff80);
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000)).bits, 0x0000);  // subnormal tie, even: down
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000)).bits, 0x0002);
}

TEST(Bf16Convert, PortableMatchesScalar) {
  expect_matches_scalar(detail::float_to_bf16_portable, special_patterns(), "portable specials");
  expect_matches_scalar(detail::float_to_bf16_portable, random_patterns(1 << 20, 1), "portable random");
  expect_widening_exact(detail::bf16_to_float_portable, "portable widening");
}

TEST(Bf16Convert, Avx512MatchesScalar) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "CPU has no avx512_bf16: fast path not testable here";
  expect_matches_scalar(detail::float_to_bf16_avx512, special_patterns(), "avx512 specials");
  expect_matches_scalar(detail::float_to_bf16_avx512, random_patterns(1 << 22, 2), "avx512 random");
  expect_widening_exact(detail::bf16_to_float_avx512, "avx512 widening");
}

TEST(Bf16Convert, Avx2MatchesScalar) {
  if (!cpu_supports(SimdIsa::kAvx2)) GTEST_SKIP() << "CPU has no AVX2: the avx2 conversions are not testable here";
  expect_matches_scalar(detail::float_to_bf16_avx2, special_patterns(), "avx2 specials");
  expect_matches_scalar(detail::float_to_bf16_avx2, random_patterns(1 << 22, 3), "avx2 random");
  expect_widening_exact(detail::bf16_to_float_avx2, "avx2 widening");
}

// Every conversion path this CPU has, through the dispatching functions: the bf16 override picks
// avx512_bf16 or forces portable; under kAuto without avx512_bf16 the SIMD set picks avx2 or
// portable.
TEST(Bf16Convert, DispatchedMatchesScalarOnEveryPath) {
  const auto patterns = special_patterns();
  std::vector<std::string> seen;
  for (Bf16Isa isa : {Bf16Isa::kPortable, Bf16Isa::kAvx512Bf16, Bf16Isa::kAuto}) {
    if (isa == Bf16Isa::kAvx512Bf16 && !cpu_has_avx512_bf16()) {
      std::printf("skipped: bf16 override avx512_bf16 (CPU has no avx512_bf16)\n");
      continue;
    }
    for (SimdIsa simd : {SimdIsa::kPortable, SimdIsa::kAvx2, SimdIsa::kAvx512}) {
      if (!cpu_supports(simd)) {
        std::printf("skipped: SIMD set %s (CPU lacks it)\n", simd_isa_name(simd));
        continue;
      }
      set_bf16_isa_override(isa);
      set_simd_isa_override(simd);
      const std::string name = bf16_conversion_path_name();
      seen.push_back(name);
      // Forced portable (the override, or CABM_FORCE_PORTABLE under kAuto) always means portable.
      const char* expected = bf16_portable_forced()                                 ? "portable"
                             : isa == Bf16Isa::kAvx512Bf16 || cpu_has_avx512_bf16() ? "avx512_bf16"
                             : simd == SimdIsa::kPortable                           ? "portable"
                                                                                    : "avx2";
      EXPECT_EQ(name, expected);
      expect_matches_scalar([](const float* s, bf16* d, int64_t n) { float_to_bf16(s, d, n); }, patterns, name);
      expect_widening_exact([](const bf16* s, float* d, int64_t n) { bf16_to_float(s, d, n); }, name);
    }
  }
  set_bf16_isa_override(Bf16Isa::kAuto);
  set_simd_isa_override(std::nullopt);
  if (cpu_supports(SimdIsa::kAvx2) && !cpu_has_avx512_bf16() && !bf16_portable_forced()) {
    EXPECT_NE(std::find(seen.begin(), seen.end(), "avx2"), seen.end()) << "the avx2 path was never taken";
  }
}

// round_to_bf16_values is float_to_bf16 then bf16_to_float, bit for bit (NaN payloads, ±inf,
// subnormals, ties), over lengths around the vector widths, out of place and in place: each
// path's kernel the CPU can run, and the dispatched function.
TEST(Bf16Convert, RoundedValuesAreTheTwoConversions) {
  std::vector<uint32_t> patterns = special_patterns();
  const std::vector<uint32_t> random = random_patterns(1 << 14, 3);
  patterns.insert(patterns.end(), random.begin(), random.end());
  using Kernel = void (*)(const float*, float*, int64_t);
  std::vector<std::pair<std::string, Kernel>> kernels{{"portable", detail::round_to_bf16_values_portable},
                                                      {"dispatched", round_to_bf16_values}};
  if (cpu_supports(SimdIsa::kAvx2))
    kernels.emplace_back("avx2", detail::round_to_bf16_values_avx2);
  else
    std::printf("skipped: round_to_bf16_values_avx2 (CPU lacks AVX2)\n");
  if (cpu_has_avx512_bf16())
    kernels.emplace_back("avx512", detail::round_to_bf16_values_avx512);
  else
    std::printf("skipped: round_to_bf16_values_avx512 (CPU has no avx512_bf16)\n");
  for (const auto& [name, kernel] : kernels)
    for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{15}, int64_t{16}, int64_t{17},
                            int64_t{513}, static_cast<int64_t>(patterns.size())}) {
      SCOPED_TRACE(testing::Message() << name << " n " << n);
      // At least one element each, so that no null pointer reaches memcpy or memcmp at n = 0.
      const size_t size = static_cast<size_t>(n), bytes = size * sizeof(float);
      std::vector<float> src(std::max<size_t>(size, 1)), got(src.size()), want(src.size());
      std::memcpy(src.data(), patterns.data(), bytes);
      for (size_t i = 0; i < size; ++i) want[i] = bf16_to_float(float_to_bf16(src[i]));
      kernel(src.data(), got.data(), n);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), bytes), 0);
      kernel(src.data(), src.data(), n);  // in place
      ASSERT_EQ(std::memcmp(src.data(), want.data(), bytes), 0);
    }
}

TEST(Bf16Dispatch, OverrideSelectsPath) {
  set_bf16_isa_override(Bf16Isa::kPortable);
  EXPECT_EQ(bf16_active_isa(), Bf16Isa::kPortable);
  EXPECT_STREQ(bf16_path_name(), "portable");
  set_bf16_isa_override(Bf16Isa::kAuto);
  if (cpu_has_avx512_bf16()) {
    set_bf16_isa_override(Bf16Isa::kAvx512Bf16);
    EXPECT_STREQ(bf16_path_name(), "avx512_bf16");
    set_bf16_isa_override(Bf16Isa::kAuto);
  } else {
    EXPECT_THROW(set_bf16_isa_override(Bf16Isa::kAvx512Bf16), Error);
    EXPECT_STREQ(bf16_path_name(), "portable");
  }
}

// The choice between vdpbf16ps and widened fp32 products (bf16.h): a measured rate where the CPU
// has AVX512_BF16 (0 elsewhere), the override's request, and the environment's pin.
TEST(Bf16Products, ChoiceFollowsRateOverrideAndPin) {
  const double rate = vdpbf16ps_to_fma_rate();
  std::cout << "bf16 products: " << bf16_products_summary() << "\n";
  if (!cpu_has_avx512_bf16()) {
    EXPECT_EQ(rate, 0.0);
    EXPECT_FALSE(bf16_vdpbf16ps_active());
    return;
  }
  // Twice the FMA's multiply-adds per instruction at between a quarter and twice its rate (in
  // every build: the loops are assembly, unit_loops.cpp).
  EXPECT_GT(rate, 0.2);
  EXPECT_LT(rate, 5.0);
  EXPECT_EQ(vdpbf16ps_to_fma_rate(), rate);  // measured once
  set_bf16_isa_override(Bf16Isa::kPortable);
  EXPECT_FALSE(bf16_vdpbf16ps_active());
  set_bf16_isa_override(Bf16Isa::kAvx512Bf16);
  EXPECT_TRUE(bf16_vdpbf16ps_active());
  EXPECT_NE(bf16_products_summary().find("requested"), std::string::npos) << bf16_products_summary();
  set_bf16_isa_override(Bf16Isa::kAuto);
  const char* pin = std::getenv("CABM_BF16_PRODUCTS");
  const std::string p = pin ? pin : "";
  bool expected = rate >= kVdpbf16psMinRate;
  if (p == "vdpbf16ps") expected = true;
  if (p == "fp32") expected = false;
  if (bf16_amx_active() || bf16_active_isa() != Bf16Isa::kAvx512Bf16) expected = false;
  EXPECT_EQ(bf16_vdpbf16ps_active(), expected) << bf16_products_summary();
  // The summary names the unit chosen and the rule that chose it.
  const std::string summary = bf16_products_summary();
  if (bf16_amx_active()) {
    EXPECT_EQ(summary.rfind("AMX tiles (", 0), 0u) << summary;
  } else if (bf16_active_isa() == Bf16Isa::kAvx512Bf16) {
    EXPECT_EQ(summary.rfind(expected ? "vdpbf16ps (" : "fp32 FMAs on widened bf16 (", 0), 0u) << summary;
    EXPECT_NE(summary.find(p == "vdpbf16ps" || p == "fp32" ? "CABM_BF16_PRODUCTS" : "FMA multiply-adds on one core"),
              std::string::npos)
        << summary;
  }
  set_bf16_isa_override(Bf16Isa::kPortable);
  EXPECT_EQ(bf16_products_summary(), "portable (the portable path is forced)");
  set_bf16_isa_override(Bf16Isa::kAuto);
}

TEST(Bf16Convert, StridedForms) {
  const int64_t rows = 5, cols = 19, sld = 23, dld = 21;
  std::vector<float> src(static_cast<size_t>(rows * sld));
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0.37f * static_cast<float>(i) - 11.0f;
  std::vector<bf16> mid(static_cast<size_t>(rows * dld), bf16{0x7fc1});
  float_to_bf16_2d(src.data(), sld, mid.data(), dld, rows, cols);
  std::vector<float> back(static_cast<size_t>(rows * sld), -1.0f);
  bf16_to_float_2d(mid.data(), dld, back.data(), sld, rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < dld; ++c) {
      if (c < cols) {
        EXPECT_EQ(mid[r * dld + c].bits, float_to_bf16(src[r * sld + c]).bits);
        EXPECT_EQ(back[r * sld + c], bf16_to_float(float_to_bf16(src[r * sld + c])));
      } else {
        EXPECT_EQ(mid[r * dld + c].bits, 0x7fc1);  // padding untouched
      }
    }
  }
}

}  // namespace
}  // namespace cabm
