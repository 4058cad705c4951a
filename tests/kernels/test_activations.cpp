// activation_backward against central differences of a double-precision forward
// (step 1e-6; see tests/nn/test_grad_check.cpp for the error budget), and PyTorch's choices at
// the ReLU kink (gradient 0 at x = 0) and for large |x| with GELU. The fast GELU against double
// precision over every float in [-16, 16] (|x| >= 2^-8; sampled below), against the std::erf
// reference, and for bitwise independence of the thread count and of where a buffer is split.
#include "cabm/kernels/activations.h"
#include "util/test_util.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

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

// Φ(x) in double through erfc: no cancellation in the negative tail.
double phi_double(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0));
}
double gelu_double(double x) {
  return x * phi_double(x);
}
double gelu_grad_double(double x) {
  return phi_double(x) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

struct ErrorStats {
  double max_rel = 0, max_rel_at = 0;  // gelu, where |exact| >= kRelFloor
  double max_abs_tiny = 0;             // gelu, where |exact| < kRelFloor
  double max_grad_abs = 0, max_grad_at = 0;
  static constexpr double kRelFloor = 1e-35;  // below: Φ's factors are subnormal
  void add(double x, float y, float g) {
    const double exact = gelu_double(x);
    const double err = std::fabs(static_cast<double>(y) - exact);
    if (std::isnan(y)) {
      max_rel = std::numeric_limits<double>::infinity();
    } else if (std::fabs(exact) >= kRelFloor) {
      if (err / std::fabs(exact) > max_rel) max_rel = err / std::fabs(exact), max_rel_at = x;
    } else {
      max_abs_tiny = std::max(max_abs_tiny, err);
    }
    const double gerr = std::fabs(static_cast<double>(g) - gelu_grad_double(x));
    if (!(gerr <= max_grad_abs)) max_grad_abs = gerr, max_grad_at = x;
  }
  void merge(const ErrorStats& o) {
    if (o.max_rel > max_rel) max_rel = o.max_rel, max_rel_at = o.max_rel_at;
    max_abs_tiny = std::max(max_abs_tiny, o.max_abs_tiny);
    if (o.max_grad_abs > max_grad_abs) max_grad_abs = o.max_grad_abs, max_grad_at = o.max_grad_at;
  }
};

using ActFn = void (*)(Activation, const float*, float*, int64_t);
using ActGradFn = void (*)(Activation, const float*, const float*, float*, int64_t);

// Every float whose bit pattern lies in [lo_bits, hi_bits) with the given sign, step `stride`.
ErrorStats measure(ActFn fwd, ActGradFn bwd, uint32_t lo_bits, uint32_t hi_bits, uint32_t stride) {
  constexpr int64_t kBatch = 1 << 16;
  const int64_t count = (static_cast<int64_t>(hi_bits) - lo_bits + stride - 1) / stride;
  const int64_t batches = (count + kBatch - 1) / kBatch;
  ErrorStats total;
#pragma omp parallel
  {
    ErrorStats local;
    std::vector<float> x(kBatch), y(kBatch), g(kBatch), ones(kBatch, 1.0f);
#pragma omp for schedule(dynamic, 16)
    for (int64_t b = 0; b < batches; ++b) {
      const int64_t n = std::min<int64_t>(kBatch, count - b * kBatch);
      for (int sign = 0; sign < 2; ++sign) {
        for (int64_t i = 0; i < n; ++i) {
          const uint32_t bits =
              (lo_bits + static_cast<uint32_t>((b * kBatch + i) * stride)) | (sign ? 0x80000000u : 0u);
          x[i] = std::bit_cast<float>(bits);
        }
        fwd(Activation::kGelu, x.data(), y.data(), n);
        bwd(Activation::kGelu, x.data(), ones.data(), g.data(), n);
        for (int64_t i = 0; i < n; ++i) local.add(x[i], y[i], g[i]);
      }
    }
#pragma omp critical
    total.merge(local);
  }
  return total;
}

TEST(Activations, GeluFastAccuracyOverAllFloats) {
  // Every float with 1/8 <= |x| < 8 (where training's pre-activations live), every 7th float
  // beyond (up to 16: the tail is flushed to 0 from x = −13.2) and down to 1e-30.
  const auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
  ErrorStats fast = measure(activation_forward, activation_backward, bits(0.125f), bits(8.0f), 1);
  fast.merge(measure(activation_forward, activation_backward, bits(8.0f), bits(16.0f), 7));
  fast.merge(measure(activation_forward, activation_backward, bits(1e-30f), bits(0.125f), 7));
  std::printf(
      "fast GELU over [-16, 16]: max relative error %.3g (x = %.9g), max absolute error where |gelu| < 1e-35 "
      "%.3g; gelu' max absolute error %.3g (x = %.9g)\n",
      fast.max_rel, fast.max_rel_at, fast.max_abs_tiny, fast.max_grad_abs, fast.max_grad_at);
  // Measured: 4.5e-7 relative, at small |x| where Φ ≈ 1/2 carries 2.3e-7 absolute from the
  // polynomial's float evaluation (elsewhere about 2e-7, also in the negative tail where the
  // reference loses every digit); 7e-39 absolute where |gelu| < 1e-35 (subnormal factors,
  // flushed to 0 from x = −13.2); 2.3e-7 absolute on gelu' (about 2 ulps of 1). The bounds
  // leave a little room.
  EXPECT_LT(fast.max_rel, 6e-7);
  EXPECT_LT(fast.max_abs_tiny, 1e-37);
  EXPECT_LT(fast.max_grad_abs, 3e-7);

  // The reference, for comparison: its 1 + erf cancels for negative x, so it is measured only
  // where that costs less than a few ulps (|x| < 1).
  const ErrorStats ref =
      measure(activation_forward_reference, activation_backward_reference, bits(0.125f), bits(1.0f), 1);
  std::printf("reference (std::erf) GELU over 1/8 <= |x| < 1: max relative error %.3g; gelu' max absolute error %.3g\n",
              ref.max_rel, ref.max_grad_abs);
}

TEST(Activations, FastMatchesReference) {
  const int64_t n = 100003;
  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    Tensor x = test::random_tensor({n}, 7, -8.0f, 8.0f), dy = test::random_tensor({n}, 8);
    Tensor y = Tensor::empty({n}), y_ref = Tensor::empty({n}), dx = Tensor::empty({n}), dx_ref = Tensor::empty({n});
    activation_forward(act, x.data<float>(), y.data<float>(), n);
    activation_forward_reference(act, x.data<float>(), y_ref.data<float>(), n);
    activation_backward(act, x.data<float>(), dy.data<float>(), dx.data<float>(), n);
    activation_backward_reference(act, x.data<float>(), dy.data<float>(), dx_ref.data<float>(), n);
    // The reference's own error is 6e-8 absolute on 1 + erf; the fast path's 4.5e-7 relative.
    EXPECT_CLOSE(y, y_ref, 6e-7, 4e-7);
    EXPECT_CLOSE(dx, dx_ref, 6e-7, 4e-7);
  }
  const float special[] = {0.0f,
                           -0.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           1e-30f,
                           -1e-30f,
                           100.0f,
                           -100.0f};
  const int64_t m = std::size(special);
  float y[m], y_ref[m], dx[m], dx_ref[m], ones[m];
  std::fill(ones, ones + m, 1.0f);
  activation_forward(Activation::kGelu, special, y, m);
  activation_forward_reference(Activation::kGelu, special, y_ref, m);
  activation_backward(Activation::kGelu, special, ones, dx, m);
  activation_backward_reference(Activation::kGelu, special, ones, dx_ref, m);
  for (int64_t i = 0; i < m; ++i) {
    // Same value, NaN where the reference gives NaN (−inf · Φ(−inf) = −inf · 0, as in PyTorch).
    EXPECT_TRUE(std::isnan(y_ref[i]) ? std::isnan(y[i])
                                     : y[i] == y_ref[i] || std::fabs(y[i] - y_ref[i]) <= 5e-7f * std::fabs(y_ref[i]))
        << special[i] << ": " << y[i] << " vs " << y_ref[i];
    EXPECT_TRUE(std::isnan(dx_ref[i]) ? std::isnan(dx[i]) : dx[i] == dx_ref[i] || std::fabs(dx[i] - dx_ref[i]) <= 3e-7f)
        << special[i] << ": " << dx[i] << " vs " << dx_ref[i];
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data<float>(), b.data<float>(), a.nbytes()) == 0;
}

TEST(Activations, SameBitsForEveryThreadCountAndSplit) {
  const int64_t rows = 67, F = 1000, n = rows * F;  // odd sizes: partial vectors and blocks
  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    Tensor x = test::random_tensor({rows, F}, 11, -6.0f, 6.0f), dy = test::random_tensor({rows, F}, 12);
    Tensor bias = test::random_tensor({F}, 13);
    Tensor y1 = Tensor::empty({rows, F}), y2 = Tensor::empty({rows, F}), y3 = Tensor::empty({rows, F});
    Tensor g1 = Tensor::empty({rows, F}), g2 = Tensor::empty({rows, F}), g3 = Tensor::empty({rows, F});
    {
      test::ScopedThreads threads(1);
      activation_forward(act, x.data<float>(), y1.data<float>(), n);
      activation_backward(act, x.data<float>(), dy.data<float>(), g1.data<float>(), n);
    }
    {
      test::ScopedThreads threads(2);
      activation_forward(act, x.data<float>(), y2.data<float>(), n);
      activation_backward(act, x.data<float>(), dy.data<float>(), g2.data<float>(), n);
    }
    // Element by element from odd offsets: the same bits as the whole buffer.
    for (int64_t i = 0; i < n; i += 13) {
      const int64_t len = std::min<int64_t>(13, n - i);
      activation_forward(act, x.data<float>() + i, y3.data<float>() + i, len);
      activation_backward(act, x.data<float>() + i, dy.data<float>() + i, g3.data<float>() + i, len);
    }
    EXPECT_TRUE(same_bits(y1, y2) && same_bits(y1, y3));
    EXPECT_TRUE(same_bits(g1, g2) && same_bits(g1, g3));

    // The fused bias pass: the same bits as adding the bias first, and the bias gradient the same
    // bits for every thread count.
    Tensor pre_expected = x.clone();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < F; ++c) pre_expected.data<float>()[r * F + c] += bias.data<float>()[c];
    Tensor hidden_expected = Tensor::empty({rows, F});
    activation_forward(act, pre_expected.data<float>(), hidden_expected.data<float>(), n);
    Tensor dpre_expected = Tensor::empty({rows, F});
    activation_backward(act, pre_expected.data<float>(), dy.data<float>(), dpre_expected.data<float>(), n);
    std::vector<Tensor> dbias;
    for (int threads : {1, 2}) {
      test::ScopedThreads scoped(threads);
      Tensor pre = x.clone(), hidden = Tensor::empty({rows, F});
      bias_activation_forward(act, bias.data<float>(), pre.data<float>(), hidden.data<float>(), rows, F);
      EXPECT_TRUE(same_bits(pre, pre_expected) && same_bits(hidden, hidden_expected));
      Tensor dpre = dy.clone(), db = Tensor::full({F}, 0.5f);
      bias_activation_backward(act, pre.data<float>(), dpre.data<float>(), dpre.data<float>(), db.data<float>(), rows,
                               F);  // in place
      EXPECT_TRUE(same_bits(dpre, dpre_expected));
      dbias.push_back(db);
    }
    EXPECT_TRUE(same_bits(dbias[0], dbias[1]));
    for (int64_t c = 0; c < F; ++c) {
      double sum = 0.5;
      for (int64_t r = 0; r < rows; ++r) sum += dpre_expected.data<float>()[r * F + c];
      EXPECT_NEAR(dbias[0].data<float>()[c], sum, 1e-5 * rows) << "column " << c;
    }
  }
}

}  // namespace
}  // namespace cabm
