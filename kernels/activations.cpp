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

}  // namespace cabm
