// Mean cross-entropy (ignore_index, label smoothing) against a double-precision reference of
// PyTorch's formula, and its backward against central differences (step 1e-6). Tolerances:
// the loss is accumulated in double from float log-sum-exps (error ~1e-7 relative); the
// gradient entries are (p − target)/count, each a float exp to a few ulps: 1e-6 absolute.
#include "cabm/kernels/cross_entropy.h"
#include "util/test_util.h"

#include <cmath>
#include <vector>

namespace cabm {
namespace {

double ref_loss(const std::vector<double>& z, int64_t rows, int64_t V, const std::vector<int64_t>& t, int64_t ignore,
                double eps) {
  double total = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == ignore) continue;
    double mx = -INFINITY, s = 0;
    for (int64_t c = 0; c < V; ++c) mx = std::max(mx, z[r * V + c]);
    for (int64_t c = 0; c < V; ++c) s += std::exp(z[r * V + c] - mx);
    const double lse = mx + std::log(s);
    double smooth = 0;
    for (int64_t c = 0; c < V; ++c) smooth += lse - z[r * V + c];
    total += (1 - eps) * (lse - z[r * V + t[r]]) + eps / V * smooth;
    ++count;
  }
  return total / count;
}

TEST(CrossEntropy, ForwardAndBackwardWithIgnoreAndSmoothing) {
  const int64_t rows = 6, V = 7;
  const std::vector<int64_t> targets = {3, -1, 0, 6, -1, 2};
  for (float eps : {0.0f, 0.1f, 1.0f}) {
    Tensor logits = test::random_tensor({rows, V}, 1, -4.0f, 4.0f);
    Tensor lse = Tensor::empty({rows}), d = Tensor::empty({rows, V});
    const CrossEntropyArgs args{rows, V, -1, eps};
    const CrossEntropyResult result = cross_entropy_forward(args, logits.data<float>(), V, targets.data(), lse.data<float>());
    EXPECT_EQ(result.count, 4);
    const std::vector<float> zf = logits.to_vector();
    std::vector<double> z(zf.begin(), zf.end());
    EXPECT_NEAR(result.loss, ref_loss(z, rows, V, targets, -1, eps), 1e-6);
    cross_entropy_backward(args, logits.data<float>(), V, targets.data(), lse.data<float>(), result.count, 2.0f,
                           d.data<float>(), V);
    for (int64_t i = 0; i < rows * V; ++i) {
      std::vector<double> up = z, down = z;
      up[i] += 1e-6;
      down[i] -= 1e-6;
      const double numeric =
          2.0 * (ref_loss(up, rows, V, targets, -1, eps) - ref_loss(down, rows, V, targets, -1, eps)) / 2e-6;
      EXPECT_NEAR(d.data<float>()[i], numeric, 1e-6) << "eps " << eps << " index " << i;
    }
    // In place (dlogits aliasing logits).
    cross_entropy_backward(args, logits.data<float>(), V, targets.data(), lse.data<float>(), result.count, 2.0f,
                           logits.data<float>(), V);
    EXPECT_EQ(logits.to_vector(), d.to_vector());
  }
}

TEST(CrossEntropy, AllIgnoredGivesZeroNotNaN) {
  const float logits[] = {1.0f, 2.0f, 3.0f, 4.0f};
  const int64_t targets[] = {-100, -100};
  float lse[2], d[4];
  const CrossEntropyArgs args{2, 2};
  const CrossEntropyResult r = cross_entropy_forward(args, logits, 2, targets, lse);
  EXPECT_EQ(r.count, 0);
  EXPECT_EQ(r.loss, 0.0f);
  cross_entropy_backward(args, logits, 2, targets, lse, r.count, 1.0f, d, 2);
  for (float v : d) EXPECT_EQ(v, 0.0f);
}

TEST(CrossEntropy, BadTargetIsAnError) {
  const float logits[] = {1.0f, 2.0f};
  const int64_t targets[] = {2};
  float lse[1];
  EXPECT_THROW(cross_entropy_forward({1, 2}, logits, 2, targets, lse), Error);
}

}  // namespace
}  // namespace cabm
