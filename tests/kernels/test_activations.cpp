// activation_backward against central differences of a double-precision forward
// (step 1e-6; see tests/nn/test_grad_check.cpp for the error budget), and PyTorch's choices at
// the ReLU kink (gradient 0 at x = 0) and for large |x| with GELU.
#include "kernels/activations.h"
#include "util/test_util.h"

#include <cmath>

namespace cabm {
namespace {

double ref_act(Activation a, double x) {
  return a == Activation::kRelu ? (x > 0 ? x : 0.0) : 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}

TEST(Activations, BackwardMatchesFiniteDifferences) {
  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    const int64_t n = 257;
    Tensor x = test::random_tensor({n}, 1, -6.0f, 6.0f), dy = test::random_tensor({n}, 2);
    Tensor dx = Tensor::empty({n});
    activation_backward(act, x.data<float>(), dy.data<float>(), dx.data<float>(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double xi = x.data<float>()[i], h = 1e-6;
      if (act == Activation::kRelu && std::fabs(xi) < 2 * h) continue;  // the kink
      const double numeric = dy.data<float>()[i] * (ref_act(act, xi + h) - ref_act(act, xi - h)) / (2 * h);
      // float: erf/exp to a few ulps; 1e-6 absolute on derivatives of size <= 1.13.
      EXPECT_NEAR(dx.data<float>()[i], numeric, 1e-6) << "x = " << xi;
    }
  }
}

TEST(Activations, EdgeCasesAndInPlace) {
  const float x[] = {0.0f, -0.0f, 1e-30f, -40.0f, 40.0f};
  float dy[] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  float dx[5];
  activation_backward(Activation::kRelu, x, dy, dx, 5);
  EXPECT_EQ(dx[0], 0.0f);  // PyTorch: threshold_backward gives 0 at x = 0
  EXPECT_EQ(dx[1], 0.0f);
  EXPECT_EQ(dx[2], 1.0f);
  activation_backward(Activation::kGelu, x, dy, dy, 5);  // dx aliases dy
  EXPECT_FLOAT_EQ(dy[0], 0.5f);                          // Φ(0)
  EXPECT_EQ(dy[3], 0.0f);
  EXPECT_FLOAT_EQ(dy[4], 1.0f);
}

}  // namespace
}  // namespace cabm
