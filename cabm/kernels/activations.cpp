#include "cabm/kernels/activations.h"

#include "cabm/core/threads.h"
#include "cabm/kernels/activations_item.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/cpu_isa.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cabm {

namespace {

using gelu::kInvSqrt2;
using gelu::kInvSqrt2Pi;

// The GELU spans of one instruction set (activations_item.h), chosen once per call.
struct GeluSpans {
  void (*forward)(const float* x, const float* bias, float* x_out, float* y, int64_t n);
  void (*backward)(const float* x, const float* dy, float* dx, int64_t n);
  void (*tanh_forward)(const float* bias, float* x, int64_t n);
};

GeluSpans gelu_spans() {
  switch (simd_isa()) {
    case SimdIsa::kAvx512:
      return {gelu_avx512::forward_span, gelu_avx512::backward_span, gelu_avx512::tanh_forward_span};
    case SimdIsa::kAvx2:
      return {gelu_avx2::forward_span, gelu_avx2::backward_span, gelu_avx2::tanh_forward_span};
    case SimdIsa::kPortable:
      break;
  }
  return {gelu_portable::forward_span, gelu_portable::backward_span, gelu_portable::tanh_forward_span};
}

void relu_forward_span(const float* x, const float* bias, float* x_out, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = bias ? x[i] + bias[i] : x[i];
    if (x_out) x_out[i] = v;
    y[i] = v < 0.0f ? 0.0f : v;  // NaN passes through, as in PyTorch
  }
}

// PyTorch's threshold_backward: gradient where x > 0, else 0.
void relu_backward_span(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

void forward_span(const GeluSpans& gelu, Activation act, const float* x, const float* bias, float* x_out, float* y,
                  int64_t n) {
  if (act == Activation::kRelu)
    relu_forward_span(x, bias, x_out, y, n);
  else
    gelu.forward(x, bias, x_out, y, n);
}

void backward_span(const GeluSpans& gelu, Activation act, const float* x, const float* dy, float* dx, int64_t n) {
  if (act == Activation::kRelu)
    relu_backward_span(x, dy, dx, n);
  else
    gelu.backward(x, dy, dx, n);
}

// Element-wise work is split into blocks of this many elements, a multiple of the vector width.
constexpr int64_t kBlock = 16384;

// fn(r0, r1) over blocks of whole rows, about kBlock elements each, so a bias lines up with the columns.
template <typename Fn>
void for_row_blocks(int64_t rows, int64_t F, Fn&& fn) {
  parallel_for_blocks(rows, std::max<int64_t>(1, kBlock / std::max<int64_t>(F, 1)), fn);
}

}  // namespace

void activation_forward(Activation act, const float* x, float* y, int64_t n) {
  const GeluSpans gelu = gelu_spans();
  parallel_for_blocks(n, kBlock, [&](int64_t begin, int64_t end) {
    forward_span(gelu, act, x + begin, nullptr, nullptr, y + begin, end - begin);
  });
}

void activation_backward(Activation act, const float* x, const float* dy, float* dx, int64_t n) {
  const GeluSpans gelu = gelu_spans();
  parallel_for_blocks(n, kBlock, [&](int64_t begin, int64_t end) {
    backward_span(gelu, act, x + begin, dy + begin, dx + begin, end - begin);
  });
}

void activation_forward_reference(Activation act, const float* x, float* y, int64_t n) {
  if (act == Activation::kRelu) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
}

void activation_backward_reference(Activation act, const float* x, const float* dy, float* dx, int64_t n) {
  if (act == Activation::kRelu) {
    for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    return;
  }
  // d/dx [x Φ(x)] = Φ(x) + x φ(x).
  for (int64_t i = 0; i < n; ++i) {
    const float cdf = 0.5f * (1.0f + std::erf(x[i] * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}

void bias_activation_forward(Activation act, const float* bias, float* pre, float* hidden, int64_t rows, int64_t F) {
  if (!bias) return activation_forward(act, pre, hidden, rows * F);
  const GeluSpans gelu = gelu_spans();
  for_row_blocks(rows, F, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) forward_span(gelu, act, pre + r * F, bias, pre + r * F, hidden + r * F, F);
  });
}

void bias_activation_inplace(Activation act, const float* bias, float* x, int64_t rows, int64_t F) {
  if (!bias) return activation_forward(act, x, x, rows * F);
  const GeluSpans gelu = gelu_spans();
  for_row_blocks(rows, F, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) forward_span(gelu, act, x + r * F, bias, nullptr, x + r * F, F);
  });
}

void bias_gelu_tanh_inplace(const float* bias, float* x, int64_t rows, int64_t F) {
  const GeluSpans gelu = gelu_spans();
  if (!bias) {
    return parallel_for_blocks(rows * F, kBlock,
                               [&](int64_t begin, int64_t end) { gelu.tanh_forward(nullptr, x + begin, end - begin); });
  }
  for_row_blocks(rows, F, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) gelu.tanh_forward(bias, x + r * F, F);
  });
}

namespace {

// The calling thread's grow-only buffer of F floats: one fp32 row of a bf16 pass, in L1.
float* row_scratch(int64_t F) {
  thread_local std::vector<float> row;
  if (row.size() < static_cast<size_t>(F)) row.resize(static_cast<size_t>(F));
  return row.data();
}

// dpre = dh ⊙ act'(pre) row by row with dbias += Σ_r dpre: row r is computed into row_out(r) and
// then handed to done(r, row). The column sums run over a fixed partition of the rows (min(rows,
// 32) chunks, each summed in row order, chunks added in order): the same bits for every thread count.
template <class RowOut, class Done>
void backward_with_bias_sums(Activation act, const float* pre, const float* dh, float* dbias, int64_t rows, int64_t F,
                             RowOut&& row_out, Done&& done) {
  if (rows <= 0 || F <= 0) return;
  constexpr int64_t kChunks = 32;
  const int64_t chunks = std::min<int64_t>(rows, kChunks);
  thread_local std::vector<float> partial;
  partial.assign(static_cast<size_t>(chunks * F), 0.0f);
  float* partial_data = partial.data();
  const GeluSpans gelu = gelu_spans();
  // Whole chunks per thread block, about kBlock elements or more, so small buffers stay on one thread.
  const int64_t chunk_elems = (rows + chunks - 1) / chunks * F;
  parallel_for_blocks(chunks, std::max<int64_t>(1, kBlock / chunk_elems), [&](int64_t c0, int64_t c1) {
    for (int64_t chunk = c0; chunk < c1; ++chunk) {
      float* acc = partial_data + chunk * F;
      for (int64_t r = rows * chunk / chunks; r < rows * (chunk + 1) / chunks; ++r) {
        float* out = row_out(r);
        backward_span(gelu, act, pre + r * F, dh + r * F, out, F);
        for (int64_t c = 0; c < F; ++c) acc[c] += out[c];
        done(r, out);
      }
    }
  });
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    for (int64_t c = 0; c < F; ++c) dbias[c] += partial_data[chunk * F + c];
}

}  // namespace

void bias_activation_backward(Activation act, const float* pre, const float* dh, float* dpre, float* dbias,
                              int64_t rows, int64_t F) {
  if (!dbias) return activation_backward(act, pre, dh, dpre, rows * F);
  backward_with_bias_sums(
      act, pre, dh, dbias, rows, F, [&](int64_t r) { return dpre + r * F; }, [](int64_t, const float*) {});
}

namespace {

// Row r's fp32 result `row` rounded into out's row r: bf16, or bf16 values in fp32.
void round_row_into(const float* row, bf16* out, int64_t r, int64_t F) {
  float_to_bf16(row, out + r * F, F);
}
void round_row_into(const float* row, float* out, int64_t r, int64_t F) {
  round_to_bf16_values(row, out + r * F, F);
}

template <typename Out>
void forward_rounded(Activation act, const float* bias, float* pre, Out* hidden, int64_t rows, int64_t F) {
  const GeluSpans gelu = gelu_spans();
  for_row_blocks(rows, F, [&](int64_t r0, int64_t r1) {
    float* row = row_scratch(F);
    for (int64_t r = r0; r < r1; ++r) {
      forward_span(gelu, act, pre + r * F, bias, bias ? pre + r * F : nullptr, row, F);
      round_row_into(row, hidden, r, F);
    }
  });
}

template <typename Out>
void backward_rounded(Activation act, const float* pre, const float* dh, Out* dpre, float* dbias, int64_t rows,
                      int64_t F) {
  const auto round_row = [&](int64_t r, const float* row) { round_row_into(row, dpre, r, F); };
  if (dbias)
    return backward_with_bias_sums(
        act, pre, dh, dbias, rows, F, [&](int64_t) { return row_scratch(F); }, round_row);
  const GeluSpans gelu = gelu_spans();
  for_row_blocks(rows, F, [&](int64_t r0, int64_t r1) {
    float* row = row_scratch(F);
    for (int64_t r = r0; r < r1; ++r) {
      backward_span(gelu, act, pre + r * F, dh + r * F, row, F);
      round_row(r, row);
    }
  });
}

}  // namespace

void bias_activation_forward_bf16(Activation act, const float* bias, float* pre, bf16* hidden, int64_t rows,
                                  int64_t F) {
  forward_rounded(act, bias, pre, hidden, rows, F);
}

void bias_activation_forward_bf16(Activation act, const float* bias, float* pre, float* hidden, int64_t rows,
                                  int64_t F) {
  forward_rounded(act, bias, pre, hidden, rows, F);
}

void bias_activation_backward_bf16(Activation act, const float* pre, const float* dh, bf16* dpre, float* dbias,
                                   int64_t rows, int64_t F) {
  backward_rounded(act, pre, dh, dpre, dbias, rows, F);
}

void bias_activation_backward_bf16(Activation act, const float* pre, const float* dh, float* dpre, float* dbias,
                                   int64_t rows, int64_t F) {
  backward_rounded(act, pre, dh, dpre, dbias, rows, F);
}

}  // namespace cabm
