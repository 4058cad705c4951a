#include "kernels/activations.h"

#include <cmath>

namespace cabm {

void activation_forward(Activation act, const float* x, float* y, int64_t n) {
  if (act == Activation::kRelu) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];  // NaN passes through, as in PyTorch
    return;
  }
  constexpr float kInvSqrt2 = 0.70710678118654752f;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
}

void activation_backward(Activation act, const float* x, const float* dy, float* dx, int64_t n) {
  if (act == Activation::kRelu) {
    // PyTorch's threshold_backward: gradient where x > 0, else 0.
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    return;
  }
  // d/dx [x Φ(x)] = Φ(x) + x φ(x).
  constexpr float kInvSqrt2 = 0.70710678118654752f;
  constexpr float kInvSqrt2Pi = 0.39894228040143268f;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float cdf = 0.5f * (1.0f + std::erf(x[i] * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}

}  // namespace cabm
