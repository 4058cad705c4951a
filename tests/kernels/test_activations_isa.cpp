// The run-time dispatched GELU spans (activations_body.h) on every instruction set this CPU runs
// (util/simd_isas.h; the others print why they are skipped): each set against the std::erf /
// std::tanh formulas, and every set the same bits as the portable one (the same operations, each
// rounded once), over sizes with partial vectors (0, 1, 7, 15, 17, ...), special values and both
// thread counts. The accuracy over all floats is test_activations.cpp's, on the default set.
#include "cabm/kernels/activations.h"
#include "cabm/kernels/cpu_isa.h"
#include "util/simd_isas.h"
#include "util/test_util.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace cabm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> inputs(int64_t n, uint64_t seed) {
  const Tensor t = test::random_tensor({std::max<int64_t>(n, 1)}, seed, -9.0f, 9.0f);
  std::vector<float> v = t.to_vector();
  v.resize(static_cast<size_t>(n));
  const float special[] = {0.0f, -0.0f, kInf, -kInf, kNaN, 1e-30f, -1e-30f, 100.0f, -100.0f, 3e38f, -3e38f, -13.5f};
  for (size_t i = 0; i < v.size() && i < std::size(special); ++i) v[i * 3 % v.size()] = special[i];
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // (memcmp must not see the null data() of empty vectors: UBSan)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Everything the spans compute for one input, on the pinned set.
struct Outputs {
  std::vector<float> y, dx, pre, hidden, tanh_y;
};
Outputs run_all(const std::vector<float>& x, const std::vector<float>& bias, int64_t rows, int64_t F) {
  const int64_t n = rows * F;
  const std::vector<float> dy(x.size(), 0.75f);
  Outputs o{std::vector<float>(x.size()), std::vector<float>(x.size()), x, std::vector<float>(x.size()), x};
  activation_forward(Activation::kGelu, x.data(), o.y.data(), n);
  activation_backward(Activation::kGelu, x.data(), dy.data(), o.dx.data(), n);
  bias_activation_forward(Activation::kGelu, bias.data(), o.pre.data(), o.hidden.data(), rows, F);
  bias_gelu_tanh_inplace(bias.data(), o.tanh_y.data(), rows, F);
  return o;
}

double gelu_tanh_double(double v) {
  return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
}

// |actual − want| within the fused epilogue test's bound, NaN where the formula gives NaN.
void expect_tanh_form(float actual, double want, float v) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(actual)) << "v " << v << ": " << actual;
  } else if (std::isinf(want)) {
    EXPECT_EQ(actual, want) << "v " << v;
  } else {
    EXPECT_NEAR(actual, want, 1e-6 * std::fabs(want) + 1e-7) << "v " << v;
  }
}

TEST(ActivationsIsa, EverySetMatchesTheFormulasAndThePortableBits) {
  for (int64_t F : {0, 1, 7, 8, 15, 16, 17, 33, 1000}) {
    const int64_t rows = 3;
    const std::vector<float> x = inputs(rows * F, 21 + F), bias = inputs(F, 22 + F);
    Outputs portable;
    {
      const test::ScopedSimdIsa pin(SimdIsa::kPortable);
      portable = run_all(x, bias, rows, F);
    }
    std::vector<float> y_ref(x.size()), dx_ref(x.size());
    const std::vector<float> dy(x.size(), 0.75f);
    activation_forward_reference(Activation::kGelu, x.data(), y_ref.data(), rows * F);
    activation_backward_reference(Activation::kGelu, x.data(), dy.data(), dx_ref.data(), rows * F);
    for (SimdIsa isa : test::runnable_isas("GELU")) {
      const test::ScopedSimdIsa pin(isa);
      SCOPED_TRACE(std::string("isa ") + simd_isa_name(isa) + ", F " + std::to_string(F));
      const Outputs o = run_all(x, bias, rows, F);
      EXPECT_TRUE(same_bits(o.y, portable.y));
      EXPECT_TRUE(same_bits(o.dx, portable.dx));
      EXPECT_TRUE(same_bits(o.pre, portable.pre) && same_bits(o.hidden, portable.hidden));
      EXPECT_TRUE(same_bits(o.tanh_y, portable.tanh_y));
      for (size_t i = 0; i < x.size(); ++i) {
        // The bounds of test_activations.cpp's FastMatchesReference; NaN where the reference is.
        if (std::isnan(y_ref[i])) {
          EXPECT_TRUE(std::isnan(o.y[i])) << x[i];
        } else if (std::fabs(x[i]) < 1e30f) {
          EXPECT_TRUE(o.y[i] == y_ref[i] || std::fabs(o.y[i] - y_ref[i]) <= 6e-7f * std::fabs(y_ref[i]) + 4e-7f)
              << x[i] << ": " << o.y[i] << " vs " << y_ref[i];
          EXPECT_TRUE(o.dx[i] == dx_ref[i] || std::fabs(o.dx[i] - dx_ref[i]) <= 6e-7f * std::fabs(dx_ref[i]) + 4e-7f)
              << x[i] << ": " << o.dx[i] << " vs " << dx_ref[i];
        }
        const float v = x[i] + bias[i % F];
        expect_tanh_form(o.tanh_y[i], gelu_tanh_double(v), v);
      }
    }
  }
}

TEST(ActivationsIsa, SameBitsForBothThreadCounts) {
  const int64_t rows = 67, F = 1001;  // several row blocks and partial vectors
  const std::vector<float> x = inputs(rows * F, 31), bias = inputs(F, 32);
  for (SimdIsa isa : test::runnable_isas("GELU")) {
    const test::ScopedSimdIsa pin(isa);
    SCOPED_TRACE(std::string("isa ") + simd_isa_name(isa));
    Outputs by_threads[2];
    for (int threads : {1, 2}) {
      test::ScopedThreads scoped(threads);
      by_threads[threads - 1] = run_all(x, bias, rows, F);
    }
    EXPECT_TRUE(same_bits(by_threads[0].y, by_threads[1].y));
    EXPECT_TRUE(same_bits(by_threads[0].dx, by_threads[1].dx));
    EXPECT_TRUE(same_bits(by_threads[0].hidden, by_threads[1].hidden));
    EXPECT_TRUE(same_bits(by_threads[0].tanh_y, by_threads[1].tanh_y));
  }
}

}  // namespace
}  // namespace cabm
