#include "nn/linear.h"

#include "kernels/gemm.h"

#include <algorithm>

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

}  // namespace cabm
