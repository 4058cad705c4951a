// The inference passes that follow a product (cabm/kernels/layernorm.h, activations.h):
// add_layernorm_forward against the explicit sum and layernorm_forward, bias_activation_inplace
// against bias_activation_forward (the same bits), bias_activation_{forward,backward}_bf16 against
// the fp32 forms followed by float_to_bf16 (the same bits, on every instruction set), and
// bias_gelu_tanh_inplace against its formula in double; over odd widths, aliasing, null parameters
// and thread counts.
#include "cabm/kernels/activations.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/layernorm.h"
#include "util/simd_isas.h"
#include "util/test_util.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

namespace cabm {
namespace {

std::vector<float> random_floats(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  const Tensor t = test::random_tensor({n}, seed, lo, hi);
  return t.to_vector();
}

// y = layernorm_forward(residual + (branch + bias)), the sum formed first.
std::vector<float> reference(const LayerNormArgs& args, const std::vector<float>& residual,
                             const std::vector<float>& branch, const float* bias) {
  std::vector<float> sum(residual.size()), y(residual.size());
  for (size_t i = 0; i < sum.size(); ++i)
    sum[i] = residual[i] + (bias ? branch[i] + bias[i % static_cast<size_t>(args.E)] : branch[i]);
  layernorm_forward(args, sum.data(), args.E, y.data(), args.E, nullptr, nullptr);
  return y;
}

// The outputs are of order |weight|·few + |bias|; the two differ only in the order of the
// double sums behind mean and rstd, i.e. by a float rounding or two of the result.
void expect_close(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 4 * FLT_EPSILON * (1.0f + std::fabs(want[i]))) << "element " << i;
}

TEST(AddLayerNorm, MatchesAddThenLayerNorm) {
  for (int threads : {1, 2}) {
    test::ScopedThreads scoped(threads);
    for (int64_t E : {1, 7, 16, 384, 1001}) {
      const int64_t rows = 37;
      const std::vector<float> residual = random_floats(rows * E, 1), branch = random_floats(rows * E, 2, -3, 3);
      const std::vector<float> weight = random_floats(E, 3), beta = random_floats(E, 4), bias = random_floats(E, 5);
      for (bool affine : {true, false})
        for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
          const LayerNormArgs args{rows, E, 1e-12f, affine ? weight.data() : nullptr, affine ? beta.data() : nullptr};
          const std::vector<float> want = reference(args, residual, branch, b);
          std::vector<float> y(residual.size());
          add_layernorm_forward(args, residual.data(), branch.data(), b, y.data());
          expect_close(y, want);
          // In place over either input.
          std::vector<float> r = residual, br = branch;
          add_layernorm_forward(args, r.data(), branch.data(), b, r.data());
          add_layernorm_forward(args, residual.data(), br.data(), b, br.data());
          EXPECT_EQ(r, y);
          EXPECT_EQ(br, y);
        }
    }
  }
}

TEST(AddLayerNorm, LargeMeanSmallSpread) {
  // Rows around 1e4 with a spread of 1e-2: the two passes in double keep the variance.
  const int64_t rows = 5, E = 384;
  std::vector<float> residual = random_floats(rows * E, 6, -0.01f, 0.01f);
  for (float& v : residual) v += 1e4f;
  const std::vector<float> branch = random_floats(rows * E, 7, -0.01f, 0.01f);
  const LayerNormArgs args{rows, E, 1e-12f, nullptr, nullptr};
  std::vector<float> y(residual.size());
  add_layernorm_forward(args, residual.data(), branch.data(), nullptr, y.data());
  // The float sums residual + branch are exact to 1e-3 (ulp of 1e4), so compare at that scale:
  // a single-pass float variance would be off by orders of magnitude here.
  const std::vector<float> want = reference(args, residual, branch, nullptr);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 1e-5f) << i;
}

TEST(BiasActivationInplace, SameBitsAsBiasActivationForward) {
  for (int threads : {1, 2})
    for (Activation act : {Activation::kRelu, Activation::kGelu})
      for (int64_t F : {1, 13, 16, 1536}) {
        test::ScopedThreads scoped(threads);
        const int64_t rows = 29;
        const std::vector<float> x = random_floats(rows * F, 8, -6, 6), bias = random_floats(F, 9);
        for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
          std::vector<float> pre = x, hidden(x.size()), inplace = x;
          bias_activation_forward(act, b, pre.data(), hidden.data(), rows, F);
          bias_activation_inplace(act, b, inplace.data(), rows, F);
          EXPECT_EQ(0, std::memcmp(inplace.data(), hidden.data(), hidden.size() * sizeof(float)))
              << "F " << F << " threads " << threads;
        }
      }
}

std::vector<bf16> rounded(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  float_to_bf16(x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}

TEST(BiasActivationBf16, SameBitsAsFp32FormsRounded) {
  for (SimdIsa isa : test::runnable_isas("GELU"))
    for (int threads : {1, 2})
      for (Activation act : {Activation::kRelu, Activation::kGelu})
        for (int64_t F : {1, 13, 16, 1000}) {
          test::ScopedSimdIsa pinned(isa);
          test::ScopedThreads scoped(threads);
          for (int64_t rows : {int64_t{1}, int64_t{37}, int64_t{131}}) {
            SCOPED_TRACE(testing::Message() << simd_isa_name(isa) << " threads " << threads << " F " << F << " rows "
                                            << rows << " act " << int(act));
            const int64_t n = rows * F;
            const std::vector<float> x = random_floats(n, 10 + F, -6, 6), bias = random_floats(F, 11);
            const std::vector<float> dh = random_floats(n, 12 + rows);
            for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
              std::vector<float> pre = x, hidden(n), pre_b = x;
              std::vector<bf16> hidden_b(n);
              bias_activation_forward(act, b, pre.data(), hidden.data(), rows, F);
              bias_activation_forward_bf16(act, b, pre_b.data(), hidden_b.data(), rows, F);
              EXPECT_EQ(0, std::memcmp(pre.data(), pre_b.data(), n * sizeof(float))) << "pre, bias " << (b != nullptr);
              EXPECT_TRUE(same_bits(hidden_b, rounded(hidden))) << "hidden, bias " << (b != nullptr);

              std::vector<float> dpre(n), db(F, 0.25f), db_b(F, 0.25f);
              std::vector<bf16> dpre_b(n);
              bias_activation_backward(act, pre.data(), dh.data(), dpre.data(), b ? db.data() : nullptr, rows, F);
              bias_activation_backward_bf16(act, pre.data(), dh.data(), dpre_b.data(), b ? db_b.data() : nullptr, rows,
                                            F);
              EXPECT_TRUE(same_bits(dpre_b, rounded(dpre))) << "dpre, bias " << (b != nullptr);
              EXPECT_EQ(0, std::memcmp(db.data(), db_b.data(), F * sizeof(float))) << "dbias";
            }
          }
        }
}

TEST(BiasGeluTanhInplace, MatchesTheFormula) {
  const int64_t rows = 7, F = 1001;
  const std::vector<float> x = random_floats(rows * F, 10, -8, 8), bias = random_floats(F, 11);
  std::vector<float> y = x;
  bias_gelu_tanh_inplace(bias.data(), y.data(), rows, F);
  for (int64_t i = 0; i < rows * F; ++i) {
    const double v = static_cast<double>(x[i] + bias[i % F]);
    const double want = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    // A few float roundings of the terms; near the negative tail |want| is tiny and the error absolute.
    ASSERT_NEAR(y[i], want, 1e-6 * std::fabs(want) + 1e-7) << "v " << v;
  }
}

}  // namespace
}  // namespace cabm
