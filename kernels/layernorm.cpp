#include "kernels/layernorm.h"

#include <cmath>

namespace cabm {

void layernorm_forward(const LayerNormArgs& args, const float* x, int64_t x_ld, float* y, int64_t y_ld,
                       float* mean, float* rstd) {
  const int64_t E = args.E;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < args.rows; ++r) {
    const float* xr = x + r * x_ld;
    float* yr = y + r * y_ld;
    // Two passes (mean, then centred squares) in double: exact enough to match PyTorch's
    // Welford to the last float bit in practice, and immune to cancellation.
    double sum = 0.0;
    for (int64_t c = 0; c < E; ++c) sum += xr[c];
    const double mu = sum / static_cast<double>(E);
    double sq = 0.0;
    for (int64_t c = 0; c < E; ++c) {
      const double centred = xr[c] - mu;
      sq += centred * centred;
    }
    const float m = static_cast<float>(mu);
    const float rs = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(E) + args.eps));
    for (int64_t c = 0; c < E; ++c) {
      const float w = args.weight ? args.weight[c] : 1.0f;
      const float b = args.bias ? args.bias[c] : 0.0f;
      yr[c] = (xr[c] - m) * rs * w + b;
    }
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = rs;
  }
}

}  // namespace cabm
