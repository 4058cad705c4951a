#include "cabm/train/grad_clip.h"

#include "cabm/core/error.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cabm {

float global_grad_norm(const NamedTensors& grads) {
  double total_sq = 0.0;
  for (const auto& [name, g] : grads) {
    CABM_CHECK(g.dtype() == DType::F32 && g.is_contiguous(), "gradient '{}' must be contiguous F32", name);
    const float* p = g.data<float>();
    const int64_t n = g.numel();
    // Fixed chunks summed in order: the same bits for every thread count and every run
    // (an OpenMP reduction combines partial sums in whatever order threads finish).
    constexpr int64_t kChunk = 32768;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      double s = 0.0;
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) s += static_cast<double>(p[i]) * p[i];
      partial[static_cast<size_t>(c)] = s;
    }
    double sq = 0.0;
    for (const double s : partial) sq += s;
    const float norm = static_cast<float>(std::sqrt(sq));
    total_sq += static_cast<double>(norm) * norm;
  }
  return static_cast<float>(std::sqrt(total_sq));
}

float clip_grad_norm(const NamedTensors& grads, float max_norm) {
  const float total = global_grad_norm(grads);
  if (max_norm <= 0.0f) return total;
  const float clip_coef = max_norm / (total + 1e-6f);
  if (!(clip_coef < 1.0f) && std::isfinite(total)) return total;
  for (const auto& [name, g] : grads) {
    float* p = g.data<float>();
    const int64_t n = g.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) p[i] *= clip_coef;
  }
  return total;
}

}  // namespace cabm
