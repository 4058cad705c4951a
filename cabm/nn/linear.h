// Linear map y = x Wᵀ + b, PyTorch's nn.Linear (weight [out, in]).
//
// Gradients ACCUMULATE: every *_backward in nn/ adds into the parameter gradients of `grads`
// (a module of the same configuration; see cabm/nn/parameters.h), so micro-batches accumulate by
// calling backward repeatedly; zero the gradients (zero_parameters) once per optimiser step.
// Input gradients (dx) are OVERWRITTEN unless a function says otherwise.
//
// Mixed precision (cabm/nn/mixed_precision.h): when `weight_bf16` is defined, the three products run
// on bf16 operands with fp32 accumulation (gemm_bf16): x and dy are rounded to bf16
// (float_to_bf16) as inputs of the products, the bf16 copy stands in for W, and y, dx, dW and db
// stay fp32 (dW accumulates in fp32). Rounding x, W and dy each costs at most one unit roundoff
// u = 2^-8 per operand, so |y_bf16 − y_fp32| <= (2u + u²)·(|x||W|ᵀ) + the fp32 summation terms.
#pragma once

#include "cabm/core/tensor.h"

namespace cabm {

struct Linear {
  Tensor weight;  // [out, in], unit column stride (may be a row slice of a packed weight)
  Tensor bias;    // [out]; undefined when the layer has no bias
  // [out, in] copy of `weight` rounded to bf16 (mixed precision): BF16, or F32 holding the bf16
  // values on CPUs where gemm_bf16 widens its operands anyway (rounded_dtype(),
  // cabm/nn/bf16_util.h); undefined: fp32 products. Whoever changes `weight` refreshes it
  // (refresh_bf16_weights in cabm/nn/mixed_precision.h).
  Tensor weight_bf16;

  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }
};

Linear make_linear(int64_t in_features, int64_t out_features, bool bias);  // zero parameters

// x: [rows, in], y: [rows, out] — 2-d views with unit column stride (row strides free).
// x_bf16 (optional, kept by the caller between forward and backward): a bf16 layer rounds x into
// it ([rows, in] of rounded_dtype(), cabm/nn/bf16_util.h: BF16, or F32 holding the bf16 values on
// CPUs where gemm_bf16 widens its operands anyway; reallocated only when it does not fit) and
// linear_backward, handed it,
// uses it instead of rounding x again, as PyTorch's autocast saves the bf16 cast of a matmul's
// input for the backward; an fp32 layer releases it, so a stale copy is never used.
void linear_forward(const Linear& layer, const Tensor& x, const Tensor& y, Tensor* x_bf16 = nullptr);

// With y = x Wᵀ + b (y_rc = Σ_k x_rk W_ck + b_c):
//   dx  = dy W          [rows, in]   (written, or added when accumulate_dx)
//   dW += dyᵀ x         [out, in]
//   db += Σ_rows dy     [out]
// x: [rows, in] the forward input; dy: [rows, out]; dx: [rows, in] or undefined (skipped).
// grad: same shapes as layer (its weight may be a strided view, e.g. of a packed gradient).
// x_bf16: what linear_forward rounded x into, or null or undefined (a bf16 layer rounds x here);
// when it is given, x is not read and may be undefined.
void linear_backward(const Linear& layer, const Tensor& x, const Tensor& dy, const Tensor& dx, Linear& grad,
                     bool accumulate_dx = false, const Tensor* x_bf16 = nullptr);

// The products of a bf16 layer on operands its caller has already rounded to bf16 ([rows, in] and
// [rows, out], unit column stride; BF16, or F32 holding bf16 values, which are taken as they are:
// gemm_bf16_widened), for passes that write bf16 directly (the feed-forward
// hidden layer: bias_activation_forward_bf16 and _backward_bf16). The same bits as linear_forward
// and linear_backward on the fp32 values those roundings came from. linear_backward_rounded has
// no bias gradient to take (a bias gradient sums the fp32 dy): layer and grad must have no bias.
void linear_forward_rounded(const Linear& layer, const Tensor& x_bf16, const Tensor& y);
void linear_backward_rounded(const Linear& layer, const Tensor& x_bf16, const Tensor& dy_bf16, const Tensor& dx,
                             Linear& grad, bool accumulate_dx = false);

// The layer's weights (and bf16 copy, if any) without its bias: for callers that add the bias in
// the pass that follows the product (the activation, or a residual add and LayerNorm).
Linear without_bias(const Linear& layer);

// A contiguous [.., E] tensor seen as [rows, E] (a view; 2-d tensors pass through).
Tensor as_rows(const Tensor& t);

// out[c] += Σ_r x[r, c] over a [rows, cols] view (unit column stride). Summed in a fixed
// number of row chunks, so the result is bitwise the same for every thread count.
void add_column_sums(const Tensor& x, float* out);

}  // namespace cabm
