// gemm_bf16_widened (cabm/kernels/gemm.h): the products of operands held as fp32 bf16 values,
// which the mixed-precision modules keep in that form where gemm_bf16 widens its operands anyway.
// Where gemm_bf16 widens (natively, or under forced portable on a CPU with AVX512_BF16) it must
// give gemm_bf16's bits on the bf16 forms of the same compact operands; wherever it runs, the fp32
// product of those values: bf16 values multiply exactly in fp32, so the bound is fp32's summation
// bound (Higham 2002, §3.1: γ_K·Σ|a||b| plus a few roundings of alpha, beta·c and the bias).
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/gemm.h"
#include "util/test_util.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace cabm {
namespace {

constexpr double kU = 0x1p-24;

struct Case {
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
  int64_t pad_c;  // extra elements in c's rows
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      out.push_back({7, 13, 29, ta, tb, 1.0f, 0.0f, 0});
      out.push_back({33, 17, 65, ta, tb, 0.5f, 1.0f, 3});
      out.push_back({1, 40, 3, ta, tb, -2.0f, 0.25f, 1});
      out.push_back({50, 1, 77, ta, tb, 1.0f, -1.0f, 0});
      out.push_back({5, 6, 0, ta, tb, 1.0f, 0.5f, 2});  // K = 0: c = beta·c (+ bias)
      out.push_back({130, 257, 96, ta, tb, 1.0f, 1.0f, 0});
    }
  return out;
}

// n values in [−1, 1] rounded to bf16, as bf16 and as their fp32 values.
void rounded_values(int64_t n, uint64_t seed, std::vector<bf16>& b16, std::vector<float>& f32) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  f32.resize(static_cast<size_t>(n));
  b16.resize(static_cast<size_t>(n));
  for (float& x : f32) x = dist(rng);
  float_to_bf16(f32.data(), b16.data(), n);
  bf16_to_float(b16.data(), f32.data(), n);
}

TEST(GemmBf16Widened, GemmBf16sBitsWhereItWidens) {
  std::vector<bool> forced{false};
  if (cpu_has_avx512_bf16()) forced.push_back(true);
  uint64_t seed = 500;
  for (const bool force : forced) {
    if (force) set_bf16_isa_override(Bf16Isa::kPortable);
    const bool bitwise = gemm_bf16_widens();
    if (!bitwise) std::printf("bitwise comparison skipped: gemm_bf16 runs oneDNN's bf16 kernels here\n");
    for (const Case& c : cases()) {
      const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N, ldc = c.N + c.pad_c;
      std::vector<bf16> a16, b16;
      std::vector<float> a32, b32, bias(static_cast<size_t>(c.N)), c0(static_cast<size_t>(c.M * ldc));
      rounded_values(c.M * c.K, seed++, a16, a32);
      rounded_values(c.K * c.N, seed++, b16, b32);
      for (int64_t j = 0; j < c.N; ++j) bias[static_cast<size_t>(j)] = static_cast<float>((j * 29 % 17) - 8) / 4.0f;
      for (size_t i = 0; i < c0.size(); ++i) c0[i] = static_cast<float>(static_cast<int>(i * 7 % 13) - 6) / 8.0f;
      for (const bool with_bias : {false, true}) {
        if (with_bias && c.alpha != 1.0f) continue;  // a bias needs alpha 1
        SCOPED_TRACE(testing::Message() << "M " << c.M << " N " << c.N << " K " << c.K << " ta " << c.ta << " tb "
                                        << c.tb << " alpha " << c.alpha << " beta " << c.beta << " bias " << with_bias
                                        << (force ? " forced portable" : ""));
        const float* bp = with_bias ? bias.data() : nullptr;
        std::vector<float> got = c0, want = c0;
        gemm_bf16_widened({a32.data(), c.M, c.K, lda, c.ta}, {b32.data(), c.K, c.N, ldb, c.tb}, got.data(), ldc,
                          c.alpha, c.beta, bp);
        gemm_bf16({a16.data(), c.M, c.K, lda, c.ta}, {b16.data(), c.K, c.N, ldb, c.tb}, want.data(), ldc, c.alpha,
                  c.beta, bp);
        if (bitwise) {
          EXPECT_EQ(got, want);
          continue;
        }
        for (int64_t i = 0; i < c.M; ++i)
          for (int64_t j = 0; j < c.N; ++j) {
            const size_t e = static_cast<size_t>(i * ldc + j);
            double magnitude = std::fabs(c.beta * c0[e]) + (bp ? std::fabs(bp[j]) : 0.0);
            for (int64_t k = 0; k < c.K; ++k)
              magnitude += std::fabs(c.alpha * double(a32[static_cast<size_t>(c.ta ? k * lda + i : i * lda + k)]) *
                                     b32[static_cast<size_t>(c.tb ? j * ldb + k : k * ldb + j)]);
            ASSERT_NEAR(got[e], want[e], 4.0 * (c.K + 3) * kU * magnitude) << i << ", " << j;
          }
        for (int64_t i = 0; i < c.M; ++i)  // c's padding untouched
          for (int64_t j = c.N; j < ldc; ++j)
            ASSERT_EQ(got[static_cast<size_t>(i * ldc + j)], c0[static_cast<size_t>(i * ldc + j)]);
      }
    }
    set_bf16_isa_override(Bf16Isa::kAuto);
  }
}

// The products it runs are reported with gemm_bf16's (cabm bench prints the line).
TEST(GemmBf16Widened, CountedInImplementationsUsed) {
  std::vector<float> a(6, 1.0f), b(6, 1.0f), c(4, 0.0f);
  gemm_bf16_widened({a.data(), 2, 3, 3}, {b.data(), 3, 2, 2}, c.data(), 2);
  EXPECT_EQ(c[3], 3.0f);
  EXPECT_NE(gemm_bf16_implementations_used(), "none yet");
  EXPECT_NE(gemm_bf16_implementations_used().find("products)"), std::string::npos) << gemm_bf16_implementations_used();
  EXPECT_THROW(gemm_bf16_widened({a.data(), 2, 3, 3}, {b.data(), 3, 2, 2}, c.data(), 2, 0.5f, 0.0f, a.data()), Error);
}

}  // namespace
}  // namespace cabm
