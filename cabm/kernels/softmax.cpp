#include "cabm/kernels/softmax.h"

#include <algorithm>
#include <cmath>

namespace cabm {

namespace {
// log Σ exp(x) of one row with the maximum subtracted; −inf for an all −inf row.
float row_logsumexp(const float* x, int64_t cols) {
  float row_max = -INFINITY;
  for (int64_t j = 0; j < cols; ++j) row_max = std::max(row_max, x[j]);
  if (row_max == -INFINITY) return -INFINITY;
  double sum = 0.0;
  for (int64_t j = 0; j < cols; ++j) sum += std::exp(x[j] - row_max);
  return row_max + static_cast<float>(std::log(sum));
}
}  // namespace

void logsumexp_rows(const float* x, int64_t x_ld, int64_t rows, int64_t cols, float* lse) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) lse[r] = row_logsumexp(x + r * x_ld, cols);
}

void softmax_forward(const float* x, int64_t x_ld, float* y, int64_t y_ld, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_ld;
    float* yr = y + r * y_ld;
    float row_max = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) row_max = std::max(row_max, xr[j]);
    if (row_max == -INFINITY) {
      std::fill_n(yr, cols, 0.0f);
      continue;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < cols; ++j) {
      yr[j] = std::exp(xr[j] - row_max);
      sum += yr[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < cols; ++j) yr[j] *= inv;
  }
}

void softmax_backward(const float* y, int64_t y_ld, const float* dy, int64_t dy_ld, float* dx, int64_t dx_ld,
                      int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * y_ld;
    const float* dyr = dy + r * dy_ld;
    float* dxr = dx + r * dx_ld;
    double dot = 0.0;
    for (int64_t j = 0; j < cols; ++j) dot += static_cast<double>(dyr[j]) * yr[j];
    const float d = static_cast<float>(dot);
    for (int64_t j = 0; j < cols; ++j) dxr[j] = yr[j] * (dyr[j] - d);
  }
}

}  // namespace cabm
