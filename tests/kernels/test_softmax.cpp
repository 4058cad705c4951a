// Row softmax and log-sum-exp against double precision; softmax_backward against central
// differences (step 1e-6). Fully masked rows (all −inf) give 0 and −inf, not NaN.
#include "cabm/kernels/softmax.h"
#include "util/test_util.h"

#include <cmath>
#include <vector>

namespace cabm {
namespace {

TEST(Softmax, ForwardBackwardAgainstDouble) {
  const int64_t rows = 5, cols = 9, ld = 11;
  Tensor x = test::random_tensor({rows, ld}, 1, -20.0f, 20.0f), dy = test::random_tensor({rows, cols}, 2);
  Tensor y = Tensor::empty({rows, cols}), dx = Tensor::empty({rows, cols}), lse = Tensor::empty({rows});
  softmax_forward(x.data<float>(), ld, y.data<float>(), cols, rows, cols);
  logsumexp_rows(x.data<float>(), ld, rows, cols, lse.data<float>());
  softmax_backward(y.data<float>(), cols, dy.data<float>(), cols, dx.data<float>(), cols, rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> z(cols);
    for (int64_t j = 0; j < cols; ++j) z[j] = x.data<float>()[r * ld + j];
    auto softmax = [&](const std::vector<double>& v) {
      double mx = -INFINITY, s = 0;
      for (double e : v) mx = std::max(mx, e);
      for (double e : v) s += std::exp(e - mx);
      std::vector<double> p(v.size());
      for (size_t j = 0; j < v.size(); ++j) p[j] = std::exp(v[j] - mx) / s;
      return std::make_pair(p, mx + std::log(s));
    };
    const auto [p, l] = softmax(z);
    EXPECT_NEAR(lse.data<float>()[r], l, 1e-5 * std::fabs(l) + 1e-6);
    for (int64_t j = 0; j < cols; ++j) {
      EXPECT_NEAR(y.data<float>()[r * cols + j], p[j], 1e-6);
      // d/dz_j Σ_k dy_k p_k
      std::vector<double> up = z, down = z;
      up[j] += 1e-6;
      down[j] -= 1e-6;
      double f_up = 0, f_down = 0;
      const auto pu = softmax(up).first, pd = softmax(down).first;
      for (int64_t k = 0; k < cols; ++k) {
        f_up += dy.data<float>()[r * cols + k] * pu[k];
        f_down += dy.data<float>()[r * cols + k] * pd[k];
      }
      EXPECT_NEAR(dx.data<float>()[r * cols + j], (f_up - f_down) / 2e-6, 1e-6);
    }
  }
}

TEST(Softmax, FullyMaskedRowIsZeroNotNaN) {
  const float x[] = {-INFINITY, -INFINITY, -INFINITY};
  float y[3], lse;
  softmax_forward(x, 3, y, 3, 1, 3);
  logsumexp_rows(x, 3, 1, 3, &lse);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(lse, -INFINITY);
}

}  // namespace
}  // namespace cabm
