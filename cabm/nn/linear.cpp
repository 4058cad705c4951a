#include "cabm/nn/linear.h"

#include "cabm/kernels/bf16.h"
#include "cabm/kernels/gemm.h"
#include "cabm/nn/bf16_util.h"

#include <algorithm>
#include <string>
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

Linear without_bias(const Linear& layer) {
  Linear copy = layer;
  copy.bias = Tensor();
  return copy;
}

Tensor as_rows(const Tensor& t) {
  CABM_CHECK(t.dim() >= 1, "as_rows of a scalar");
  if (t.dim() == 2) return t;
  return t.view({-1, t.size(-1)});  // checks contiguity: a copy would lose writes
}

namespace {

constexpr int64_t kParallelBroadcast = int64_t{1} << 16;  // floats: below, a thread team costs more than it saves

void check_bf16_copy(const Linear& layer) {
  CABM_CHECK((layer.weight_bf16.dtype() == DType::BF16 || layer.weight_bf16.dtype() == DType::F32) &&
                 layer.weight_bf16.shape() == layer.weight.shape() && layer.weight_bf16.stride(1) == 1,
             "Linear: weight_bf16 {} must be a bf16 copy of the weight {} (BF16, or F32 holding bf16 values)",
             shape_str(layer.weight_bf16.shape()), shape_str(layer.weight.shape()));
}

// x rounded to bf16 in scratch slot `slot`: [rows, cols] contiguous, of rounded_dtype().
Tensor rounded(const Tensor& x, int slot) {
  Tensor out = rounded_scratch(slot, x.size(0), x.size(1));
  round_to_bf16(x, out);
  return out;
}

MatrixRefBf16 bf16_ref(const Tensor& t, bool transposed) {
  // t: BF16 [rows, cols] (unit column stride); the operand is t or tᵀ.
  return transposed ? MatrixRefBf16{t.data<bf16>(), t.size(1), t.size(0), t.stride(0), true}
                    : MatrixRefBf16{t.data<bf16>(), t.size(0), t.size(1), t.stride(0), false};
}

MatrixRef f32_ref(const Tensor& t, bool transposed) {
  return transposed ? MatrixRef{t.data<float>(), t.size(1), t.size(0), t.stride(0), true}
                    : MatrixRef{t.data<float>(), t.size(0), t.size(1), t.stride(0), false};
}

// t as F32: itself, or a BF16 t widened into `buffer` (grown to the largest need, kept).
Tensor as_f32(const Tensor& t, Tensor& buffer) {
  if (t.dtype() == DType::F32) return t;
  const int64_t rows = t.size(0), cols = t.size(1), n = std::max<int64_t>(rows * cols, 1);
  if (!buffer.defined() || buffer.numel() < n) buffer = Tensor::empty({n});
  Tensor out = buffer.narrow(0, 0, rows * cols).view({rows, cols});
  widen_from_bf16(t, out);
  return out;
}

// c = op(a)·op(b) (+ bias in every row), a and b rounded operands (BF16, or F32 holding bf16
// values): gemm_bf16 on two BF16 ones, else gemm_bf16_widened with a BF16 one widened first, as
// gemm_bf16 itself does where it widens (a weight copy made before a test pinned the other form).
void rounded_product(const Tensor& a, bool ta, const Tensor& b, bool tb, float* c, int64_t ldc, float beta,
                     const float* bias = nullptr) {
  if (a.dtype() == DType::BF16 && b.dtype() == DType::BF16)
    return gemm_bf16(bf16_ref(a, ta), bf16_ref(b, tb), c, ldc, 1.0f, beta, bias);
  thread_local Tensor a_buffer, b_buffer;
  gemm_bf16_widened(f32_ref(as_f32(a, a_buffer), ta), f32_ref(as_f32(b, b_buffer), tb), c, ldc, 1.0f, beta, bias);
}

// The bias in every row of y, for the product to add onto: returns the product's beta (1 with a
// bias, 0 without). On all threads: for the QKV projection of a batch this is megabytes, which one
// thread writes at a fraction of the rate of two.
float broadcast_bias(const Linear& layer, const Tensor& y) {
  if (!layer.bias.defined()) return 0.0f;
  const float* b = layer.bias.data<float>();
  float* yp = y.data<float>();
  const int64_t rows = y.size(0), out = y.size(1), ld = y.stride(0);
#pragma omp parallel for schedule(static) if (rows * out >= kParallelBroadcast)
  for (int64_t r = 0; r < rows; ++r) std::copy(b, b + out, yp + r * ld);
  return 1.0f;
}

// y = x_b·W_bf16ᵀ + bias: the forward product of a bf16 layer on its rounded input, the bias added
// by the product (gemm_bf16) rather than broadcast into y first.
void bf16_product_forward(const Linear& layer, const Tensor& x_b, const Tensor& y) {
  rounded_product(x_b, false, layer.weight_bf16, /*tb=*/true, y.data<float>(), y.stride(0), 0.0f,
                  layer.bias.defined() ? layer.bias.data<float>() : nullptr);
}

// The weight and input gradients of a backward over `rows` rows have the layer's shapes.
void check_gradient_shapes(const Linear& layer, int64_t rows, const Tensor& dx, const Linear& grad) {
  CABM_CHECK(grad.weight.shape() == layer.weight.shape() && grad.weight.stride(1) == 1,
             "Linear weight gradient {} must be {}", shape_str(grad.weight.shape()), shape_str(layer.weight.shape()));
  if (dx.defined())
    CABM_CHECK(dx.dim() == 2 && dx.size(0) == rows && dx.size(1) == layer.in_features() && dx.stride(1) == 1,
               "Linear input gradient {} must be [{}, {}]", shape_str(dx.shape()), rows, layer.in_features());
}

void check_rounded(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  CABM_CHECK(t.defined() && (t.dtype() == DType::BF16 || t.dtype() == DType::F32) && t.dim() == 2 &&
                 (rows < 0 || t.size(0) == rows) && t.size(1) == cols && t.stride(1) == 1,
             "Linear: the rounded {} {} {} must be BF16 (or F32 holding bf16 values) [{}, {}]", what,
             t.defined() ? dtype_name(t.dtype()) : "undefined", t.defined() ? shape_str(t.shape()) : "",
             rows < 0 ? std::string("rows") : std::to_string(rows), cols);
}

}  // namespace

void linear_forward(const Linear& layer, const Tensor& x, const Tensor& y, Tensor* x_bf16) {
  const int64_t rows = x.size(0), in = layer.in_features(), out = layer.out_features();
  CABM_CHECK(x.dim() == 2 && x.size(1) == in && x.stride(1) == 1, "Linear input {} must be [rows, {}]",
             shape_str(x.shape()), in);
  CABM_CHECK(y.dim() == 2 && y.size(0) == rows && y.size(1) == out && y.stride(1) == 1,
             "Linear output {} must be [{}, {}]", shape_str(y.shape()), rows, out);
  CABM_CHECK(layer.weight.stride(1) == 1, "Linear weight must have unit column stride");
  if (layer.weight_bf16.defined()) {
    check_bf16_copy(layer);
    Tensor x_b;
    if (x_bf16) {
      ensure_shape(*x_bf16, {rows, in}, rounded_dtype());
      round_to_bf16(x, *x_bf16);
      x_b = *x_bf16;
    } else {
      x_b = rounded(x, 0);
    }
    bf16_product_forward(layer, x_b, y);
    return;
  }
  if (x_bf16) *x_bf16 = Tensor();
  float* yp = y.data<float>();
  const float beta = broadcast_bias(layer, y);
  const MatrixRef a{x.data<float>(), rows, in, x.stride(0)};
  const MatrixRef w_t{layer.weight.data<float>(), in, out, layer.weight.stride(0), /*transposed=*/true};
  gemm(a, w_t, yp, y.stride(0), 1.0f, beta);
}

namespace {

// add_column_sums, calling also(r, row) on each row r of x as it is summed (the row is then in L1).
template <class RowFn>
void add_column_sums_and(const Tensor& x, float* out, RowFn&& also) {
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
    for (int64_t r = rows * chunk / chunks; r < rows * (chunk + 1) / chunks; ++r) {
      for (int64_t c = 0; c < cols; ++c) acc[c] += p[r * ld + c];
      also(r, p + r * ld);
    }
  }
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    for (int64_t c = 0; c < cols; ++c) out[c] += partial[chunk * cols + c];
}

// dW += dyᵀ·x and dx = dy·W (or +=) on bf16 operands, fp32 accumulation.
void bf16_products_backward(const Linear& layer, const Tensor& x_b, const Tensor& dy_b, const Tensor& dx, Linear& grad,
                            bool accumulate_dx) {
  rounded_product(dy_b, /*ta=*/true, x_b, false, grad.weight.data<float>(), grad.weight.stride(0), 1.0f);
  if (dx.defined())
    rounded_product(dy_b, false, layer.weight_bf16, false, dx.data<float>(), dx.stride(0), accumulate_dx ? 1.0f : 0.0f);
}

}  // namespace

void add_column_sums(const Tensor& x, float* out) {
  add_column_sums_and(x, out, [](int64_t, const float*) {});
}

void linear_backward(const Linear& layer, const Tensor& x, const Tensor& dy, const Tensor& dx, Linear& grad,
                     bool accumulate_dx, const Tensor* x_bf16) {
  const int64_t in = layer.in_features(), out = layer.out_features();
  // With a kept bf16 input, x itself is not read and may be undefined.
  const bool kept = x_bf16 && x_bf16->defined();
  if (kept) {
    CABM_CHECK(layer.weight_bf16.defined(), "Linear: a kept bf16 input, but the layer has no bf16 weight");
    CABM_CHECK((x_bf16->dtype() == DType::BF16 || x_bf16->dtype() == DType::F32) && x_bf16->dim() == 2 &&
                   x_bf16->size(1) == in && x_bf16->stride(1) == 1 && (!x.defined() || x.shape() == x_bf16->shape()),
               "Linear: the kept bf16 input {} {} must be BF16 (or F32 holding bf16 values) [rows, {}] (input {})",
               dtype_name(x_bf16->dtype()), shape_str(x_bf16->shape()), in,
               x.defined() ? shape_str(x.shape()) : "undefined");
  } else {
    CABM_CHECK(x.defined() && x.dim() == 2 && x.size(1) == in && x.stride(1) == 1, "Linear input {} must be [rows, {}]",
               x.defined() ? shape_str(x.shape()) : "undefined", in);
  }
  const int64_t rows = kept ? x_bf16->size(0) : x.size(0);
  CABM_CHECK(dy.dim() == 2 && dy.size(0) == rows && dy.size(1) == out && dy.stride(1) == 1,
             "Linear output gradient {} must be [{}, {}]", shape_str(dy.shape()), rows, out);
  check_gradient_shapes(layer, rows, dx, grad);
  CABM_CHECK(grad.bias.defined() == layer.bias.defined(), "Linear bias gradient must match the layer's bias");
  if (layer.weight_bf16.defined()) {
    check_bf16_copy(layer);
    // The same three products on bf16 operands: dy and x rounded once each (x by the forward when
    // it kept x_bf16), fp32 accumulation.
    // The bias gradient sums the fp32 dy (a reduction, not a product), in the pass that rounds it.
    Tensor dy_b;
    if (grad.bias.defined()) {
      CABM_CHECK(grad.bias.is_contiguous(), "Linear bias gradient must be contiguous");
      dy_b = rounded_scratch(0, rows, out);
      if (dy_b.dtype() == DType::F32) {
        float* dy_rounded = dy_b.data<float>();
        add_column_sums_and(dy, grad.bias.data<float>(),
                            [&](int64_t r, const float* row) { round_to_bf16_values(row, dy_rounded + r * out, out); });
      } else {
        bf16* dy_rounded = dy_b.data<bf16>();
        add_column_sums_and(dy, grad.bias.data<float>(),
                            [&](int64_t r, const float* row) { float_to_bf16(row, dy_rounded + r * out, out); });
      }
    } else {
      dy_b = rounded(dy, 0);
    }
    bf16_products_backward(layer, kept ? *x_bf16 : rounded(x, 1), dy_b, dx, grad, accumulate_dx);
    return;
  }
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
    const MatrixRef dym{dy.data<float>(), rows, out, dy.stride(0)};
    const MatrixRef w{layer.weight.data<float>(), out, in, layer.weight.stride(0)};
    gemm(dym, w, dx.data<float>(), dx.stride(0), 1.0f, accumulate_dx ? 1.0f : 0.0f);
  }
}

void linear_forward_rounded(const Linear& layer, const Tensor& x_bf16, const Tensor& y) {
  CABM_CHECK(layer.weight_bf16.defined(), "Linear: a rounded bf16 input, but the layer has no bf16 weight");
  check_bf16_copy(layer);
  check_rounded(x_bf16, -1, layer.in_features(), "input");
  const int64_t rows = x_bf16.size(0), out = layer.out_features();
  CABM_CHECK(y.dim() == 2 && y.size(0) == rows && y.size(1) == out && y.stride(1) == 1,
             "Linear output {} must be [{}, {}]", shape_str(y.shape()), rows, out);
  bf16_product_forward(layer, x_bf16, y);
}

void linear_backward_rounded(const Linear& layer, const Tensor& x_bf16, const Tensor& dy_bf16, const Tensor& dx,
                             Linear& grad, bool accumulate_dx) {
  CABM_CHECK(layer.weight_bf16.defined(), "Linear: rounded bf16 operands, but the layer has no bf16 weight");
  CABM_CHECK(!layer.bias.defined() && !grad.bias.defined(),
             "Linear: a backward from a rounded output gradient has no bias gradient (its sums need fp32)");
  check_bf16_copy(layer);
  const int64_t in = layer.in_features(), out = layer.out_features();
  check_rounded(x_bf16, -1, in, "input");
  const int64_t rows = x_bf16.size(0);
  check_rounded(dy_bf16, rows, out, "output gradient");
  check_gradient_shapes(layer, rows, dx, grad);
  bf16_products_backward(layer, x_bf16, dy_bf16, dx, grad, accumulate_dx);
}

}  // namespace cabm
