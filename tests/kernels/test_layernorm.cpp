// layernorm_forward / layernorm_backward against a double-precision reference and its central
// differences (step 1e-6: truncation ~1e-12, rounding ~1e-10). The float kernel's error is a
// few ulps per op over rows of E <= 33 elements, so 1e-5 relative to the largest gradient
// (float eps 1.2e-7 × ~100) separates rounding from a wrong term.
#include "cabm/kernels/layernorm.h"
#include "util/test_util.h"

#include <cmath>
#include <vector>

namespace cabm {
namespace {

using Vec = std::vector<double>;

Vec ref_layernorm(const Vec& x, int64_t rows, int64_t E, const Vec& w, const Vec& b, double eps) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < E; ++c) mean += x[r * E + c] / E;
    for (int64_t c = 0; c < E; ++c) var += (x[r * E + c] - mean) * (x[r * E + c] - mean) / E;
    for (int64_t c = 0; c < E; ++c) y[r * E + c] = (x[r * E + c] - mean) / std::sqrt(var + eps) * w[c] + b[c];
  }
  return y;
}

Vec to_vec(const Tensor& t) {
  const auto f = t.to_vector();
  return Vec(f.begin(), f.end());
}

void expect_close(const char* what, const float* actual, const Vec& expected, double rtol) {
  double scale = 1.0;
  for (double e : expected) scale = std::max(scale, std::fabs(e));
  for (size_t i = 0; i < expected.size(); ++i)
    ASSERT_NEAR(actual[i], expected[i], rtol * scale) << what << " index " << i;
}

TEST(LayerNormKernel, BackwardMatchesFiniteDifferences) {
  for (int64_t E : {1, 5, 33}) {
    const int64_t rows = 7, ld = E + 3;  // strided rows
    const float eps = 1e-5f;
    Tensor x = test::random_tensor({rows, ld}, 1, -2.0f, 3.0f), dy = test::random_tensor({rows, E}, 2);
    Tensor w = test::random_tensor({E}, 3, 0.5f, 1.5f), b = test::random_tensor({E}, 4);
    Tensor y = Tensor::empty({rows, E}), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
    const LayerNormArgs args{rows, E, eps, w.data<float>(), b.data<float>()};
    layernorm_forward(args, x.data<float>(), ld, y.data<float>(), E, mean.data<float>(), rstd.data<float>());
    Tensor dx = Tensor::empty({rows, E}), dw = Tensor::full({E}, 0.5f), db = Tensor::full({E}, 0.5f);
    layernorm_backward(args, x.data<float>(), ld, mean.data<float>(), rstd.data<float>(), dy.data<float>(), E,
                       {dx.data<float>(), E, dw.data<float>(), db.data<float>()});

    Vec xv(rows * E);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < E; ++c) xv[r * E + c] = x.data<float>()[r * ld + c];
    Vec wv = to_vec(w), bv = to_vec(b);
    const Vec g = to_vec(dy);
    auto loss = [&] {
      const Vec out = ref_layernorm(xv, rows, E, wv, bv, eps);
      double s = 0;
      for (size_t i = 0; i < out.size(); ++i) s += g[i] * out[i];
      return s;
    };
    expect_close("forward", y.data<float>(), ref_layernorm(xv, rows, E, wv, bv, eps), 1e-6);
    auto numeric = [&](Vec& v, double offset) {
      Vec out(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        const double saved = v[i];
        v[i] = saved + 1e-6;
        const double up = loss();
        v[i] = saved - 1e-6;
        const double down = loss();
        v[i] = saved;
        out[i] = (up - down) / 2e-6 + offset;
      }
      return out;
    };
    expect_close("dx", dx.data<float>(), numeric(xv, 0.0), 1e-5);
    expect_close("dweight (accumulated onto 0.5)", dw.data<float>(), numeric(wv, 0.5), 1e-5);
    expect_close("dbias (accumulated onto 0.5)", db.data<float>(), numeric(bv, 0.5), 1e-5);
  }
}

TEST(LayerNormKernel, ParameterGradientsIndependentOfThreadCount) {
  const int64_t rows = 100, E = 16;
  Tensor x = test::random_tensor({rows, E}, 5), dy = test::random_tensor({rows, E}, 6);
  Tensor mean = Tensor::empty({rows}), rstd = Tensor::empty({rows}), y = Tensor::empty({rows, E});
  const LayerNormArgs args{rows, E, 1e-5f, nullptr, nullptr};
  layernorm_forward(args, x.data<float>(), E, y.data<float>(), E, mean.data<float>(), rstd.data<float>());
  std::vector<float> results[2];
  for (int threads : {1, 2}) {
    test::ScopedThreads scoped(threads);
    Tensor dw = Tensor::zeros({E}), db = Tensor::zeros({E});
    layernorm_backward(args, x.data<float>(), E, mean.data<float>(), rstd.data<float>(), dy.data<float>(), E,
                       {nullptr, 0, dw.data<float>(), db.data<float>()});
    results[threads - 1] = dw.to_vector();
  }
  EXPECT_EQ(results[0], results[1]);  // bitwise
}

}  // namespace
}  // namespace cabm
