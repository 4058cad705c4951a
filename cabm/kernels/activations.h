// Element-wise activations, PyTorch semantics: ReLU, and GELU in its exact erf form
// (nn.GELU's default): gelu(x) = x · Φ(x) = 0.5 · x · (1 + erf(x / √2)).
//
// Two implementations of GELU, selected here and nowhere else:
// - the reference (`*_reference`): std::erf / std::exp per element, the formula as written;
// - the fast path (everything else): Φ from one polynomial and one exp, see activations_item.h;
//   compiled once per instruction set (activations_body.h: 16 lanes for AVX-512, 8 for AVX2 + FMA,
//   8 in plain C++) with the widest this CPU runs chosen at run time (cpu_isa.h; CABM_SIMD_ISA pins
//   one). The same operations, each rounded once, so every set gives the same bits. Measured
//   against double precision over every float with 1/8 <= |x| < 8 and every 7th beyond, up to
//   16 (tests/kernels/test_activations.cpp): gelu within 4.5e-7 relative (2.3e-7 absolute on
//   Φ ≈ 1/2 near 0; about 2e-7 relative elsewhere, 7e-39 absolute where |gelu| < 1e-35), gelu'
//   within 2.3e-7 absolute. The reference is within 2.5e-7 relative and 1.4e-7 on gelu' where
//   1 + erf does not cancel, and loses every digit where it does (x < −5); the fast path
//   computes erfc directly and stays accurate there.
// Results are the same bits for every thread count and every split of the buffer.
#pragma once

#include "cabm/core/dtype.h"

#include <cstdint>

namespace cabm {

enum class Activation { kRelu, kGelu };

// y[i] = act(x[i]) for i < n; y may alias x.
void activation_forward(Activation act, const float* x, float* y, int64_t n);

// dx[i] = dy[i] · act'(x[i]) for i < n, x being the forward INPUT; dx may alias dy.
//   relu'(x) = 1 if x > 0 else 0  (PyTorch's choice at 0: gradient 0)
//   gelu'(x) = Φ(x) + x · φ(x),   φ(x) = exp(−x²/2) / √(2π)
void activation_backward(Activation act, const float* x, const float* dy, float* dx, int64_t n);

// The plain per-element formulas (std::erf, std::exp): the oracle of the fast path.
void activation_forward_reference(Activation act, const float* x, float* y, int64_t n);
void activation_backward_reference(Activation act, const float* x, const float* dy, float* dx, int64_t n);

// A linear layer's bias and activation in one pass over its output (the feed-forward hidden layer):
//   pre[r, c] += bias[c];  hidden[r, c] = act(pre[r, c])
// pre, hidden: [rows, F] contiguous, pre updated in place (saved for the backward pass);
// bias: [F] or null (no bias). hidden must not alias pre.
void bias_activation_forward(Activation act, const float* bias, float* pre, float* hidden, int64_t rows, int64_t F);

// Inference (nothing saved for a backward pass): x[r, c] = act(x[r, c] + bias[c]) in place, one
// pass over a product's output. x: [rows, F] contiguous; bias: [F] or null. The same bits as
// bias_activation_forward's hidden.
void bias_activation_inplace(Activation act, const float* bias, float* x, int64_t rows, int64_t F);

// The same with GELU's tanh approximation (PyTorch's approximate="tanh", transformers' gelu_new):
//   x = 0.5·v·(1 + tanh(√(2/π)·(v + 0.044715·v³))),  v = x + bias.   Inference only (no backward).
// Computed as v · sigmoid(2u) (u the tanh's argument), which does not cancel for negative v: within
// 1e-6 relative + 1e-7 absolute of the formula in double (tests/kernels/test_fused_epilogues.cpp),
// dispatched as the exact form, the same bits on every set and for every thread count.
void bias_gelu_tanh_inplace(const float* bias, float* x, int64_t rows, int64_t F);

// The backward of bias_activation_forward, with the bias gradient in the same pass:
//   dpre[r, c] = dh[r, c] · act'(pre[r, c]);   dbias[c] += Σ_r dpre[r, c]
// pre, dh, dpre: [rows, F] contiguous (dpre may alias dh); dbias: [F] accumulated, or null.
// The column sums run over a fixed partition of the rows (as add_column_sums in cabm/nn/linear.cpp:
// min(rows, 32) chunks, each summed in row order, chunks added in order), so they are the same
// bits for every thread count.
void bias_activation_backward(Activation act, const float* pre, const float* dh, float* dpre, float* dbias,
                              int64_t rows, int64_t F);

// The same two passes for a mixed-precision feed-forward layer, whose next product reads only the
// bf16 rounding of what they produce: hidden, resp. dpre, is written as float_to_bf16 of the value
// the fp32 forms compute (the same bits as those forms followed by float_to_bf16), through an
// L1-sized per-thread row buffer, so the fp32 [rows, F] result is never stored and read back.
// dbias sums the fp32 dpre, as in bias_activation_backward. hidden, dpre: BF16 [rows, F].
void bias_activation_forward_bf16(Activation act, const float* bias, float* pre, bf16* hidden, int64_t rows, int64_t F);
void bias_activation_backward_bf16(Activation act, const float* pre, const float* dh, bf16* dpre, float* dbias,
                                   int64_t rows, int64_t F);
// The same with hidden, resp. dpre, F32 [rows, F] holding those bf16 values (round_to_bf16_values,
// cabm/kernels/bf16.h): the operands' form where gemm_bf16_widens() (cabm/kernels/gemm.h).
void bias_activation_forward_bf16(Activation act, const float* bias, float* pre, float* hidden, int64_t rows,
                                  int64_t F);
void bias_activation_backward_bf16(Activation act, const float* pre, const float* dh, float* dpre, float* dbias,
                                   int64_t rows, int64_t F);

}  // namespace cabm
