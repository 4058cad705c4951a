#include "nn/linear.h"

#include "kernels/gemm.h"

#include <algorithm>
#include <vector>

namespace cabm {

Linear make_linear(int64_t in_features, int64_t out_features, bool bias) {
  CABM_CHECK(in_features > 0 && out_features > 0, "Linear sizes must be positive, got in={} out={}", in_features,
             out_features);
  Linear layer;
  layer.weight = Tensor::zeros({out_features, in_features});
  if (bias) layer.bias = Tensor::zeros({out_features});
  return layer;
}

Tensor as_rows(const Tensor& t) {
  CABM_CHECK(t.dim() >= 1, "as_rows of a scalar");
  if (t.dim() == 2) return t;
  return t.view({-1, t.size(-1)});  // checks contiguity: a copy would lose writes
}

void linear_forward(const Linear& layer, const Tensor& x, const Tensor& y) {
  const int64_t rows = x.size(0), in = layer.in_features(), out = layer.out_features();
  CABM_CHECK(x.dim() == 2 && x.size(1) == in && x.stride(1) == 1, "Linear input {} must be [rows, {}]",
             shape_str(x.shape()), in);
  CABM_CHECK(y.dim() == 2 && y.size(0) == rows && y.size(1) == out && y.stride(1) == 1,
             "Linear output {} must be [{}, {}]", shape_str(y.shape()), rows, out);
  CABM_CHECK(layer.weight.stride(1) == 1, "Linear weight must have unit column stride");
  float* yp = y.data<float>();
  float beta = 0.0f;
  if (layer.bias.defined()) {
    const float* b = layer.bias.data<float>();
    for (int64_t r = 0; r < rows; ++r) std::copy(b, b + out, yp + r * y.stride(0));
    beta = 1.0f;
  }
  const MatrixRef a{x.data<float>(), rows, in, x.stride(0)};
  const MatrixRef w_t{layer.weight.data<float>(), in, out, layer.weight.stride(0), /*transposed=*/true};
  gemm(a, w_t, yp, y.stride(0), 1.0f, beta);
}

void add_column_sums(const Tensor& x, float* out) {
  CABM_CHECK(x.dim() == 2 && x.stride(1) == 1, "add_column_sums needs a [rows, cols] view, got {}",
             shape_str(x.shape()));
  const int64_t rows = x.size(0), cols = x.size(1), ld = x.stride(0);
  const float* p = x.data<float>();
  constexpr int64_t kChunks = 32;  // fixed: the sum order does not depend on the thread count
  const int64_t chunks = std::clamp<int64_t>(rows, 1, kChunks);
  std::vector<float> partial(static_cast<size_t>(chunks * cols), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    float* acc = partial.data() + chunk * cols;
    for (int64_t r = rows * chunk / chunks; r < rows * (chunk + 1) / chunks; ++r)
      for (int64_t c = 0; c < cols; ++c) acc[c] += p[r * ld + c];
  }
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    for (int64_t c = 0; c < cols; ++c) out[c] += partial[chunk * cols + c];
}

void linear_backward(const Linear& layer, const Tensor& x, const Tensor& dy, const Tensor& dx, Linear& grad,
                     bool accumulate_dx) {
  const int64_t rows = x.size(0), in = layer.in_features(), out = layer.out_features();
  CABM_CHECK(x.dim() == 2 && x.size(1) == in && x.stride(1) == 1, "Linear input {} must be [rows, {}]",
             shape_str(x.shape()), in);
  CABM_CHECK(dy.dim() == 2 && dy.size(0) == rows && dy.size(1) == out && dy.stride(1) == 1,
             "Linear output gradient {} must be [{}, {}]", shape_str(dy.shape()), rows, out);
  CABM_CHECK(grad.weight.shape() == layer.weight.shape() && grad.weight.stride(1) == 1,
             "Linear weight gradient {} must be {}", shape_str(grad.weight.shape()), shape_str(layer.weight.shape()));
  CABM_CHECK(grad.bias.defined() == layer.bias.defined(), "Linear bias gradient must match the layer's bias");
  // dW[out, in] += dy[rows, out]ᵀ · x[rows, in]
  const MatrixRef dy_t{dy.data<float>(), out, rows, dy.stride(0), /*transposed=*/true};
  const MatrixRef xm{x.data<float>(), rows, in, x.stride(0)};
  gemm(dy_t, xm, grad.weight.data<float>(), grad.weight.stride(0), 1.0f, 1.0f);
  // db += Σ_rows dy
  if (grad.bias.defined()) {
    CABM_CHECK(grad.bias.is_contiguous(), "Linear bias gradient must be contiguous");
    add_column_sums(dy, grad.bias.data<float>());
  }
  // dx[rows, in] = dy[rows, out] · W[out, in]
  if (dx.defined()) {
    CABM_CHECK(dx.dim() == 2 && dx.size(0) == rows && dx.size(1) == in && dx.stride(1) == 1,
               "Linear input gradient {} must be [{}, {}]", shape_str(dx.shape()), rows, in);
    const MatrixRef dym{dy.data<float>(), rows, out, dy.stride(0)};
    const MatrixRef w{layer.weight.data<float>(), out, in, layer.weight.stride(0)};
    gemm(dym, w, dx.data<float>(), dx.stride(0), 1.0f, accumulate_dx ? 1.0f : 0.0f);
  }
}

}  // namespace cabm
