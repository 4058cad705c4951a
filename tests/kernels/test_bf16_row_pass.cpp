// The row pass of the avx512_bf16 forward's online softmax (softmax_rows_avx512,
// attention/bf16_avx512.h; the AMX forward runs it too) against the same math written plainly
// here, one row after another: m' = max(m, max(s·qscale + mask)), P = exp2_weight(x − m') rounded
// to bf16 (times the dropout factor first), α = exp2(m − m'), l = α·l + Σ P. P and α must match
// bit for bit and m as a value (0 and −0 are one maximum): the kernel takes each row's maximum
// during the previous row's weights, which must change nothing. l to the rounding of a 16-lane
// sum. Random row counts and tile widths, masks with blocked keys, fully blocked rows and
// additive biases, dropout factors, scales of either sign and 0, first tiles (m = −FLT_MAX) and
// later ones.
#include "cabm/kernels/attention/bf16_avx512.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/exp2_poly.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace cabm {
namespace {

#if defined(CABM_HAVE_AVX512_BF16_CODE)

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

struct Case {
  int64_t ni, nk16;
  bool masked, dropout, first_tile;
  float qscale;
};

void check(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << "rows " << c.ni << " keys " << c.nk16 << " masked " << c.masked << " dropout "
                                    << c.dropout << " first tile " << c.first_tile << " qscale " << c.qscale);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  const int64_t lds = c.nk16 + 16 * static_cast<int64_t>(rng() % 3);  // rows as long as the tile, or longer
  std::vector<float> s(static_cast<size_t>(c.ni * lds)), mask, z;
  for (float& x : s) x = normal(rng);
  if (c.masked) {
    mask.resize(s.size());
    for (int64_t r = 0; r < c.ni; ++r) {
      const bool blocked_row = rng() % 8 == 0;
      for (int64_t j = 0; j < lds; ++j) mask[r * lds + j] = blocked_row || rng() % 4 == 0 ? -INFINITY : uniform(rng);
    }
  }
  if (c.dropout) {
    z.resize(s.size());
    for (float& x : z) x = rng() % 4 == 0 ? 0.0f : 1.25f;
  }
  std::vector<float> m(static_cast<size_t>(c.ni)), l(m.size()), alpha(m.size());
  for (int64_t r = 0; r < c.ni; ++r) {
    m[r] = c.first_tile ? -FLT_MAX : uniform(rng);
    l[r] = c.first_tile ? 0.0f : 1.0f + std::abs(uniform(rng));
  }
  std::vector<bf16> p(s.size());
  std::vector<float> m_got = m, l_got = l, alpha_got(m.size());
  detail::softmax_rows_avx512(s.data(), lds, c.ni, c.nk16, c.masked ? mask.data() : nullptr,
                              c.dropout ? z.data() : nullptr, c.qscale, p.data(), lds, m_got.data(), l_got.data(),
                              alpha_got.data());
  for (int64_t r = 0; r < c.ni; ++r) {
    const float* x = s.data() + r * lds;
    const auto scaled = [&](int64_t j) {
      return c.masked ? std::fma(x[j], c.qscale, mask[r * lds + j]) : x[j] * c.qscale;
    };
    float tmax = -INFINITY;
    for (int64_t j = 0; j < c.nk16; ++j) tmax = std::max(tmax, scaled(j));
    const float m_new = std::max(m[r], tmax);
    double sum = 0.0;
    for (int64_t j = 0; j < c.nk16; ++j) {
      const float e = detail::exp2_weight(c.masked ? scaled(j) - m_new : std::fma(x[j], c.qscale, -m_new));
      sum += e;
      const float want = bf16_to_float(float_to_bf16(c.dropout ? e * z[r * lds + j] : e));
      const float got = bf16_to_float(p[r * lds + j]);
      ASSERT_EQ(bits(got), bits(want)) << "P row " << r << " key " << j;
    }
    const float a = m_new == m[r] ? 1.0f : std::exp2(m[r] - m_new);
    EXPECT_EQ(m_got[r], m_new) << "m row " << r;  // as values: with scale 0 the raw maximum may be +0 for −0
    EXPECT_EQ(bits(alpha_got[r]), bits(a)) << "alpha row " << r;
    const double l_want = static_cast<double>(l[r]) * a + sum;
    EXPECT_NEAR(l_got[r], l_want, 1e-6 * (l_want + 1.0) * std::sqrt(static_cast<double>(c.nk16))) << "l row " << r;
  }
}

TEST(Bf16RowPass, MatchesPlainRowByRowMath) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU (or OS) has no AVX-512 BF16: the avx512_bf16 row pass not run";
  std::mt19937 rng(2026);
  std::vector<Case> cases = {
      {64, 768, false, false, true, 0.18f},  // the forward's wide tile at d 64, first tile
      {32, 768, true, true, false, 0.13f},   // masked, dropout, a later tile
      {1, 16, false, false, true, 0.5f},     // one row, one vector
      {3, 48, true, false, true, -0.7f},     // a negative scale (no raw maximum)
      {5, 80, false, true, false, 0.0f},     // scale 0: every weight exp2(−m')
  };
  for (int n = 0; n < 80; ++n) {
    const int64_t ni = 1 + static_cast<int64_t>(rng() % 40), nk16 = 16 * (1 + static_cast<int64_t>(rng() % 50));
    const float qscale = (rng() % 5 == 0 ? -1.0f : 1.0f) * static_cast<float>(rng() % 100) / 200.0f;
    cases.push_back({ni, nk16, rng() % 2 == 0, rng() % 2 == 0, rng() % 3 == 0, qscale});
  }
  for (const Case& c : cases) check(c, rng);
}

#else

TEST(Bf16RowPass, MatchesPlainRowByRowMath) {
  GTEST_SKIP() << "not an x86-64 build: no AVX-512 BF16 code to test";
}

#endif

}  // namespace
}  // namespace cabm
