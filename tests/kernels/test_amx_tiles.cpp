// The scalar model of the AMX tile instructions (attention/amx_tiles.h) that the tests run the
// AMX attention kernels on where no AMX exists: loads and stores with any row stride, tilezero, and
// tdpbf16ps against a double-precision sum with the error bound of 32 fp32 additions (Higham 2002,
// §3.1: γ_32·(|c| + Σ|a·b|)), DAZ on subnormal inputs and FTZ on subnormal results. Where the CPU
// has AMX tiles, the hardware instructions against the model on the same random tiles. Then the
// block product of both AMX kernels (attention/amx_tile_gemm.h) on the model (and the hardware)
// against a double-precision product, over sizes, strides and both B layouts.
#include "cabm/kernels/attention/amx_tile_gemm.h"
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

// --- tile_gemm ---------------------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
  bool blocks;      // B as 16-column blocks one after another (packed K); else row-major pairs
  bool accumulate;  // C += A·B; else C = A·B
};

// Runs tile_gemm<Tiles> on random operands with padded strides and checks every C element against
// a double-precision sum within γ_(k+1)·(|c| + Σ|a·b|), and that C's padding is left alone.
template <class Tiles>
void check_tile_gemm(const GemmCase& g, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t lda = g.k + 32, ldc = g.n + 5;
  const std::vector<bf16> a = random_bf16(static_cast<size_t>(g.m * lda), rng, 1.0f);
  const std::vector<bf16> b = random_bf16(static_cast<size_t>(g.k * g.n), rng, 1.0f);
  // Element (t, j) of B: pair t / 2, column j, half t % 2.
  const auto b_index = [&](int64_t t, int64_t j) {
    return g.blocks ? (j / 16) * (g.k * 16) + (t / 2) * 32 + (j % 16) * 2 + t % 2 : (t / 2) * (2 * g.n) + j * 2 + t % 2;
  };
  const detail::TileB tb = g.blocks ? detail::TileB{b.data(), 32, 16 * g.k} : detail::TileB{b.data(), 2 * g.n, 32};
  std::vector<float> c0(static_cast<size_t>(g.m * ldc));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : c0) x = dist(rng);
  std::vector<float> c = c0;
  Tiles::configure();
  detail::tile_gemm<Tiles>(g.m, g.n, g.k, a.data(), lda, tb, c.data(), ldc, g.accumulate);
  Tiles::release();
  const double gamma = (g.k + 1) * 0x1p-24 / (1 - (g.k + 1) * 0x1p-24);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double exact = g.accumulate ? c0[i * ldc + j] : 0.0, magnitude = std::abs(exact);
      for (int64_t t = 0; t < g.k; ++t) {
        const double term = static_cast<double>(bf16_to_float(a[i * lda + t])) * bf16_to_float(b[b_index(t, j)]);
        exact += term;
        magnitude += std::abs(term);
      }
      ASSERT_NEAR(c[i * ldc + j], exact, gamma * magnitude) << "C[" << i << "][" << j << "]";
    }
    for (int64_t j = g.n; j < ldc; ++j)
      ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]) << "padding C[" << i << "][" << j << "]";
  }
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  for (int64_t m : {16, 32, 48, 80})
    for (int64_t n : {16, 32, 48, 112})
      for (int64_t k : {32, 96}) cases.push_back({m, n, k, (m + n + k) % 3 == 0, (m / 16 + n / 16) % 2 == 0});
  cases.push_back({64, 64, 128, true, false});
  cases.push_back({64, 64, 128, false, true});
  return cases;
}

TEST(AmxTileGemm, MatchesADoubleProductOnTheModel) {
  // tile_gemm carries CABM_AMX's target (AVX-512 with AVX512_BF16) whichever tiles it runs, so the
  // compiler may use those instructions in it: on a CPU without them it would die of SIGILL (an
  // AVX2-only CPU, found under qemu-x86_64 -cpu Haswell, session 39). The library runs the model
  // only where the CPU has AVX512_BF16 (the softmax of the AMX kernels needs it).
  if (!cpu_has_avx512_bf16())
    GTEST_SKIP() << "this CPU has no AVX512_BF16: tile_gemm is compiled for it (CABM_AMX), even on the model";
  uint32_t seed = 1;
  for (const GemmCase& g : gemm_cases()) {
    SCOPED_TRACE(testing::Message() << "m " << g.m << " n " << g.n << " k " << g.k << (g.blocks ? " blocks" : " pairs")
                                    << (g.accumulate ? " +=" : " ="));
    check_tile_gemm<EmulatedTiles>(g, seed++);
  }
}

TEST(AmxTileGemm, MatchesADoubleProductOnTheHardwareWhereItExists) {
  if (!cpu_has_amx_bf16()) GTEST_SKIP() << "this CPU (or OS) has no AMX-BF16 tiles: tile_gemm tested on the model only";
  uint32_t seed = 1;
  for (const GemmCase& g : gemm_cases()) {
    SCOPED_TRACE(testing::Message() << "m " << g.m << " n " << g.n << " k " << g.k);
    check_tile_gemm<detail::HardwareTiles>(g, seed++);
  }
}

#endif

}  // namespace
}  // namespace cabm
