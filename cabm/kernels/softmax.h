// Row softmax and log-sum-exp over the last axis of a [rows, cols] matrix (row strides free).
//   y = softmax(x): y_j = exp(x_j − max) / Σ_k exp(x_k − max)
// A row whose entries are all −inf gives y = 0 and lse = −inf (never NaN), as attention does.
#pragma once

#include <cstdint>

namespace cabm {

// lse[r] = log Σ_j exp(x[r, j]); x: [rows, cols] row stride x_ld; lse: [rows].
void logsumexp_rows(const float* x, int64_t x_ld, int64_t rows, int64_t cols, float* lse);

// y: [rows, cols] row stride y_ld (may alias x).
void softmax_forward(const float* x, int64_t x_ld, float* y, int64_t y_ld, int64_t rows, int64_t cols);

// From y = softmax(x):  ∂y_j/∂x_k = y_j (δ_jk − y_k), so
//   dx = y ⊙ (dy − Σ_j dy_j y_j)    (per row)
// y, dy, dx: [rows, cols] with row strides y_ld, dy_ld, dx_ld; dx may alias dy.
void softmax_backward(const float* y, int64_t y_ld, const float* dy, int64_t dy_ld, float* dx, int64_t dx_ld,
                      int64_t rows, int64_t cols);

}  // namespace cabm
