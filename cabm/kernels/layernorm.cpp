#include "cabm/kernels/layernorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

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

namespace {

// s = residual + (branch + bias) into y (which may alias either); returns Σ s in double.
double add_row(const float* residual, const float* branch, const float* bias, float* y, int64_t E) {
  double sum = 0.0;
  if (bias) {
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < E; ++c) {
      const float s = residual[c] + (branch[c] + bias[c]);
      y[c] = s;
      sum += s;
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < E; ++c) {
      const float s = residual[c] + branch[c];
      y[c] = s;
      sum += s;
    }
  }
  return sum;
}

// y = (y − mean) · rstd · weight + bias in place, the statistics from two passes in double.
void normalise_row(const LayerNormArgs& args, double sum, float* y) {
  const int64_t E = args.E;
  const double mu = sum / static_cast<double>(E);
  double sq = 0.0;
#pragma omp simd reduction(+ : sq)
  for (int64_t c = 0; c < E; ++c) {
    const double centred = y[c] - mu;
    sq += centred * centred;
  }
  const float m = static_cast<float>(mu);
  const float rs = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(E) + args.eps));
  if (args.weight && args.bias) {
#pragma omp simd
    for (int64_t c = 0; c < E; ++c) y[c] = (y[c] - m) * rs * args.weight[c] + args.bias[c];
    return;
  }
  for (int64_t c = 0; c < E; ++c) {
    const float w = args.weight ? args.weight[c] : 1.0f;
    const float b = args.bias ? args.bias[c] : 0.0f;
    y[c] = (y[c] - m) * rs * w + b;
  }
}

}  // namespace

void add_layernorm_forward(const LayerNormArgs& args, const float* residual, const float* branch,
                           const float* branch_bias, float* y) {
  const int64_t E = args.E;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < args.rows; ++r) {
    float* yr = y + r * E;
    normalise_row(args, add_row(residual + r * E, branch + r * E, branch_bias, yr, E), yr);
  }
}

void layernorm_backward(const LayerNormArgs& args, const float* x, int64_t x_ld, const float* mean,
                        const float* rstd, const float* dy, int64_t dy_ld, const LayerNormGrads& grads) {
  const int64_t rows = args.rows, E = args.E;
  const bool param_grads = grads.dweight != nullptr || grads.dbias != nullptr;
  // Parameter sums over rows: a fixed number of row chunks (independent of the thread count),
  // each summed in row order into its own partial, then the partials summed in chunk order.
  constexpr int64_t kChunks = 32;
  const int64_t chunks = std::clamp<int64_t>(rows, 1, kChunks);
  std::vector<float> partial_w(param_grads ? static_cast<size_t>(chunks * E) : 0, 0.0f);
  std::vector<float> partial_b(param_grads ? static_cast<size_t>(chunks * E) : 0, 0.0f);

#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t r0 = rows * chunk / chunks, r1 = rows * (chunk + 1) / chunks;
    float* pw = param_grads ? partial_w.data() + chunk * E : nullptr;
    float* pb = param_grads ? partial_b.data() + chunk * E : nullptr;
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * x_ld;
      const float* dyr = dy + r * dy_ld;
      float* dxr = grads.dx ? grads.dx + r * grads.dx_ld : nullptr;
      const float m = mean[r], rs = rstd[r];
      // mean(g) and mean(g ⊙ x̂), g = dy ⊙ w, accumulated in double.
      double sum_g = 0.0, sum_gx = 0.0;
      for (int64_t c = 0; c < E; ++c) {
        const float xhat = (xr[c] - m) * rs;
        const float g = dyr[c] * (args.weight ? args.weight[c] : 1.0f);
        sum_g += g;
        sum_gx += static_cast<double>(g) * xhat;
        if (pw) {
          pw[c] += dyr[c] * xhat;
          pb[c] += dyr[c];
        }
      }
      if (!dxr) continue;
      const float mean_g = static_cast<float>(sum_g / static_cast<double>(E));
      const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(E));
      for (int64_t c = 0; c < E; ++c) {
        const float xhat = (xr[c] - m) * rs;
        const float g = dyr[c] * (args.weight ? args.weight[c] : 1.0f);
        dxr[c] = rs * (g - mean_g - xhat * mean_gx);  // dy is read before dx[c] is written
      }
    }
  }
  if (!param_grads) return;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    for (int64_t c = 0; c < E; ++c) {
      if (grads.dweight) grads.dweight[c] += partial_w[chunk * E + c];
      if (grads.dbias) grads.dbias[c] += partial_b[chunk * E + c];
    }
  }
}

}  // namespace cabm
