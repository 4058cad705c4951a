#include "cabm/kernels/layernorm.h"

#include "cabm/core/threads.h"
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/layernorm_item.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cabm {

namespace {

// The row kernels of one instruction set (layernorm_item.h), chosen once per call.
struct LayerNormRows {
  void (*forward)(const LayerNormArgs& args, const float* x, float* y, float* mean, float* rstd);
  void (*add)(const float* residual, const float* branch, const float* bias, float* y, int64_t E);
  void (*backward)(const LayerNormArgs& args, const float* x, float mean, float rstd, const float* dy, float* dx,
                   float* pw, float* pb);
};

LayerNormRows layernorm_rows() {
  switch (simd_isa()) {
    case SimdIsa::kAvx512:
      return {layernorm_avx512::forward_row, layernorm_avx512::add_row, layernorm_avx512::backward_row};
    case SimdIsa::kAvx2:
      return {layernorm_avx2::forward_row, layernorm_avx2::add_row, layernorm_avx2::backward_row};
    case SimdIsa::kPortable:
      break;
  }
  return {layernorm_portable::forward_row, layernorm_portable::add_row, layernorm_portable::backward_row};
}

// Rows are shared among the threads in blocks of about this many elements (parallel_for_blocks:
// small inputs stay on the calling thread). Each row is computed alone, so the split changes no bit.
constexpr int64_t kBlock = 16384;

int64_t rows_per_block(int64_t E) {
  return std::max<int64_t>(1, kBlock / std::max<int64_t>(E, 1));
}

// The parameter sums over rows: a fixed number of row chunks (independent of the thread count),
// each summed in row order into its own partial, then the partials summed in chunk order.
constexpr int64_t kChunks = 32;

}  // namespace

void layernorm_forward(const LayerNormArgs& args, const float* x, int64_t x_ld, float* y, int64_t y_ld, float* mean,
                       float* rstd) {
  const LayerNormRows kernel = layernorm_rows();
  parallel_for_blocks(args.rows, rows_per_block(args.E), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      kernel.forward(args, x + r * x_ld, y + r * y_ld, mean ? mean + r : nullptr, rstd ? rstd + r : nullptr);
  });
}

void add_layernorm_forward(const LayerNormArgs& args, const float* residual, const float* branch,
                           const float* branch_bias, float* y) {
  const int64_t E = args.E;
  const LayerNormRows kernel = layernorm_rows();
  parallel_for_blocks(args.rows, rows_per_block(E), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* yr = y + r * E;
      kernel.add(residual + r * E, branch + r * E, branch_bias, yr, E);
      kernel.forward(args, yr, yr, nullptr, nullptr);
    }
  });
}

void layernorm_backward(const LayerNormArgs& args, const float* x, int64_t x_ld, const float* mean, const float* rstd,
                        const float* dy, int64_t dy_ld, const LayerNormGrads& grads) {
  const int64_t rows = args.rows, E = args.E;
  if (rows <= 0) return;
  const bool param_grads = grads.dweight != nullptr || grads.dbias != nullptr;
  const int64_t chunks = std::min<int64_t>(rows, kChunks);
  std::vector<float> partial_w(param_grads ? static_cast<size_t>(chunks * E) : 0, 0.0f);
  std::vector<float> partial_b(param_grads ? static_cast<size_t>(chunks * E) : 0, 0.0f);
  const LayerNormRows kernel = layernorm_rows();
  // Whole chunks per thread block, about kBlock elements or more.
  const int64_t chunk_elems = std::max<int64_t>(1, (rows + chunks - 1) / chunks * E);
  parallel_for_blocks(chunks, std::max<int64_t>(1, kBlock / chunk_elems), [&](int64_t c0, int64_t c1) {
    for (int64_t chunk = c0; chunk < c1; ++chunk) {
      float* pw = param_grads ? partial_w.data() + chunk * E : nullptr;
      float* pb = param_grads ? partial_b.data() + chunk * E : nullptr;
      for (int64_t r = rows * chunk / chunks; r < rows * (chunk + 1) / chunks; ++r) {
        float* dxr = grads.dx ? grads.dx + r * grads.dx_ld : nullptr;
        kernel.backward(args, x + r * x_ld, mean[r], rstd[r], dy + r * dy_ld, dxr, pw, pb);
      }
    }
  });
  if (!param_grads) return;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    for (int64_t c = 0; c < E; ++c) {
      if (grads.dweight) grads.dweight[c] += partial_w[chunk * E + c];
      if (grads.dbias) grads.dbias[c] += partial_b[chunk * E + c];
    }
  }
}

void layernorm_forward_reference(const LayerNormArgs& args, const float* x, int64_t x_ld, float* y, int64_t y_ld,
                                 float* mean, float* rstd) {
  const int64_t E = args.E;
  for (int64_t r = 0; r < args.rows; ++r) {
    const float* xr = x + r * x_ld;
    float* yr = y + r * y_ld;
    double sum = 0.0;
    for (int64_t c = 0; c < E; ++c) sum += xr[c];
    const double mu = sum / static_cast<double>(E);
    double sq = 0.0;
    for (int64_t c = 0; c < E; ++c) sq += (xr[c] - mu) * (xr[c] - mu);
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

void layernorm_backward_reference(const LayerNormArgs& args, const float* x, int64_t x_ld, const float* mean,
                                  const float* rstd, const float* dy, int64_t dy_ld, const LayerNormGrads& grads) {
  const int64_t E = args.E;
  for (int64_t r = 0; r < args.rows; ++r) {
    const float* xr = x + r * x_ld;
    const float* dyr = dy + r * dy_ld;
    const float m = mean[r], rs = rstd[r];
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t c = 0; c < E; ++c) {
      const float xhat = (xr[c] - m) * rs;
      const float g = dyr[c] * (args.weight ? args.weight[c] : 1.0f);
      sum_g += g;
      sum_gx += static_cast<double>(g) * xhat;
      if (grads.dweight) grads.dweight[c] += dyr[c] * xhat;
      if (grads.dbias) grads.dbias[c] += dyr[c];
    }
    if (!grads.dx) continue;
    const float mean_g = static_cast<float>(sum_g / static_cast<double>(E));
    const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(E));
    float* dxr = grads.dx + r * grads.dx_ld;
    for (int64_t c = 0; c < E; ++c) {
      const float xhat = (xr[c] - m) * rs;
      const float g = dyr[c] * (args.weight ? args.weight[c] : 1.0f);
      dxr[c] = rs * (g - mean_g - xhat * mean_gx);  // dy is read before dx[c] is written
    }
  }
}

}  // namespace cabm
