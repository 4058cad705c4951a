// The scalar model of the AMX tile instructions (attention/amx_tiles.h) that the tests run the
// AMX attention kernel on where no AMX exists: loads and stores with any row stride, tilezero, and
// tdpbf16ps against a double-precision sum with the error bound of 32 fp32 additions (Higham 2002,
// §3.1: γ_32·(|c| + Σ|a·b|)), DAZ on subnormal inputs and FTZ on subnormal results. Where the CPU
// has AMX tiles, the hardware instructions against the model on the same random tiles.
#include "cabm/kernels/attention/amx_tiles.h"
#include "cabm/kernels/bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace cabm {
namespace {

#if defined(__x86_64__)

using detail::EmulatedTiles;

constexpr int kRows = 16;

std::vector<bf16> random_bf16(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<bf16> out(n);
  for (bf16& x : out) x = float_to_bf16(dist(rng));
  return out;
}

TEST(AmxTilesModel, LoadStoreAndZeroKeepRowsAndStrides) {
  std::vector<uint8_t> src(kRows * 200), dst(kRows * 96, 0xee);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  EmulatedTiles::load<3>(src.data() + 5, 200);
  EmulatedTiles::store<3>(dst.data() + 1, 96);
  for (int r = 0; r < kRows; ++r) {
    EXPECT_EQ(std::memcmp(dst.data() + 1 + r * 96, src.data() + 5 + r * 200, 64), 0) << "row " << r;
    EXPECT_EQ(dst[r * 96], 0xee) << "before row " << r;
    EXPECT_EQ(dst[r * 96 + 65], 0xee) << "past the 64 bytes of row " << r;
  }
  EmulatedTiles::zero<3>();
  EmulatedTiles::store<3>(dst.data(), 64);
  for (int i = 0; i < kRows * 64; ++i) ASSERT_EQ(dst[i], 0) << i;
}

// C (16 × 16 fp32) += A (16 × 32 bf16) · B (16 pairs × 16 columns × 2 bf16, the VNNI layout).
void dpbf16ps_model(const std::vector<float>& c0, const std::vector<bf16>& a, const std::vector<bf16>& b,
                    std::vector<float>& c) {
  c = c0;
  EmulatedTiles::load<0>(c.data(), 64);
  EmulatedTiles::load<4>(a.data(), 64);
  EmulatedTiles::load<6>(b.data(), 64);
  EmulatedTiles::dpbf16ps<0, 4, 6>();
  EmulatedTiles::store<0>(c.data(), 64);
}

TEST(AmxTilesModel, Dpbf16psIsTheSumOfPairProductsWithinFp32Rounding) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const float scale = trial % 2 ? 1.0f : 1e3f;
    const std::vector<bf16> a = random_bf16(kRows * 32, rng, scale), b = random_bf16(kRows * 32, rng, scale);
    std::vector<float> c0(kRows * 16), c;
    std::normal_distribution<float> dist(0.0f, scale * scale);
    for (float& x : c0) x = dist(rng);
    dpbf16ps_model(c0, a, b, c);
    const double gamma = 32 * 0x1p-24 / (1 - 32 * 0x1p-24);
    for (int m = 0; m < kRows; ++m)
      for (int n = 0; n < 16; ++n) {
        double exact = c0[m * 16 + n], magnitude = std::abs(exact);
        for (int k = 0; k < 32; ++k) {
          const double term =
              static_cast<double>(bf16_to_float(a[m * 32 + k])) * bf16_to_float(b[(k / 2) * 32 + n * 2 + k % 2]);
          exact += term;
          magnitude += std::abs(term);
        }
        ASSERT_NEAR(c[m * 16 + n], exact, gamma * magnitude) << "trial " << trial << " C[" << m << "][" << n << "]";
      }
  }
}

TEST(AmxTilesModel, SubnormalInputsCountAsZeroAndSubnormalResultsFlush) {
  std::vector<bf16> a(kRows * 32, bf16{0}), b(kRows * 32, bf16{0});
  std::vector<float> c0(kRows * 16, 0.0f), c;
  a[0] = bf16{0x0001};  // the smallest subnormal bf16: DAZ makes its product 0
  b[0] = float_to_bf16(1e30f);
  a[1] = float_to_bf16(0x1p-70f);  // a normal product, 2^-140, below fp32's normal range: flushed
  b[1] = float_to_bf16(0x1p-70f);
  a[32] = float_to_bf16(3.0f);  // row 1 times the same B element: an ordinary product is kept
  dpbf16ps_model(c0, a, b, c);
  EXPECT_EQ(c[0], 0.0f);
  EXPECT_FALSE(std::signbit(c[0]));
  EXPECT_FLOAT_EQ(c[16], 3.0f * bf16_to_float(float_to_bf16(1e30f)));
}

// The instructions themselves against the model, where the CPU has them. Intel documents
// tdpbf16ps by pseudo-code only; the model must agree within fp32 rounding, and this test prints
// how often it agrees bit for bit.
__attribute__((target("amx-tile,amx-bf16"))) void dpbf16ps_hardware(const std::vector<float>& c0,
                                                                    const std::vector<bf16>& a,
                                                                    const std::vector<bf16>& b, std::vector<float>& c) {
  c = c0;
  detail::HardwareTiles::configure();
  detail::HardwareTiles::load<0>(c.data(), 64);
  detail::HardwareTiles::load<4>(a.data(), 64);
  detail::HardwareTiles::load<6>(b.data(), 64);
  detail::HardwareTiles::dpbf16ps<0, 4, 6>();
  detail::HardwareTiles::store<0>(c.data(), 64);
  detail::HardwareTiles::release();
}

TEST(AmxTilesModel, MatchesTheHardwareWhereItExists) {
  if (!cpu_has_amx_bf16()) GTEST_SKIP() << "this CPU (or OS) has no AMX-BF16 tiles: the model not compared";
  std::mt19937 rng(5);
  int64_t same = 0, total = 0;
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<bf16> a = random_bf16(kRows * 32, rng, 1.0f), b = random_bf16(kRows * 32, rng, 1.0f);
    std::vector<float> c0(kRows * 16), model, hardware;
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& x : c0) x = dist(rng);
    dpbf16ps_model(c0, a, b, model);
    dpbf16ps_hardware(c0, a, b, hardware);
    for (size_t i = 0; i < model.size(); ++i) {
      double magnitude = std::abs(c0[i]);
      for (int k = 0; k < 32; ++k)
        magnitude += std::abs(static_cast<double>(bf16_to_float(a[(i / 16) * 32 + k])) *
                              bf16_to_float(b[(k / 2) * 32 + (i % 16) * 2 + k % 2]));
      ASSERT_NEAR(model[i], hardware[i], 2 * 32 * 0x1p-24 * magnitude) << "trial " << trial << " element " << i;
      same += model[i] == hardware[i];
      ++total;
    }
  }
  std::printf("tdpbf16ps: the model equals the hardware bit for bit in %lld of %lld elements\n",
              static_cast<long long>(same), static_cast<long long>(total));
}

#endif

}  // namespace
}  // namespace cabm
