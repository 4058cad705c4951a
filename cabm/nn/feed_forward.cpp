#include "cabm/nn/feed_forward.h"

#include "cabm/nn/bf16_util.h"

#include <algorithm>

namespace cabm {

FeedForward make_feed_forward(int64_t E, int64_t F, Activation activation, bool bias) {
  return FeedForward{make_linear(E, F, bias), make_linear(F, E, bias), activation};
}

namespace {

// The calling thread's grow-only [rows, F] buffer for the hidden layer of bf16 FFNs: every layer
// writes it and linear2 rounds it into the layer's hidden_bf16 at once.
Tensor hidden_scratch(int64_t rows, int64_t F) {
  thread_local Tensor buffer;
  const int64_t n = std::max<int64_t>(rows * F, 1);
  if (!buffer.defined() || buffer.numel() < n) buffer = Tensor::empty({n});
  return buffer.narrow(0, 0, rows * F).view({rows, F});
}

}  // namespace

void feed_forward_forward(const FeedForward& ffn, const Tensor& x, const Tensor& y, FeedForwardCache& cache,
                          const DropoutArgs& dropout) {
  const int64_t rows = x.size(0), F = ffn.linear1.out_features();
  ensure_shape(cache.pre_activation, {rows, F});
  const bool mixed = ffn.linear2.weight_bf16.defined();
  cache.dropout = dropout;
  // pre = x W1ᵀ (linear1 without_bias: its bias is added by the activation pass, and its gradient
  // summed there), then one pass: pre += b1 (kept for the backward), hidden = act(pre). Adding the
  // bias there rather than through linear_forward saves a pass that broadcasts it into pre.
  linear_forward(without_bias(ffn.linear1), x, cache.pre_activation, &cache.x_bf16);
  const float* b1 = ffn.linear1.bias.defined() ? ffn.linear1.bias.data<float>() : nullptr;
  if (mixed) {
    // linear2 reads only the bf16 rounding of the hidden layer: without dropout the activation
    // pass writes that rounding directly; with it, the fp32 hidden goes through a per-thread
    // buffer for the dropout pass and linear2 rounds it.
    cache.hidden = Tensor();
    if (!dropout.active()) {
      // BF16, or F32 holding the bf16 values where the products widen their operands anyway.
      ensure_shape(cache.hidden_bf16, {rows, F}, rounded_dtype());
      float* pre = cache.pre_activation.data<float>();
      if (cache.hidden_bf16.dtype() == DType::F32)
        bias_activation_forward_bf16(ffn.activation, b1, pre, cache.hidden_bf16.data<float>(), rows, F);
      else
        bias_activation_forward_bf16(ffn.activation, b1, pre, cache.hidden_bf16.data<bf16>(), rows, F);
      linear_forward_rounded(ffn.linear2, cache.hidden_bf16, y);
      return;
    }
  } else {
    ensure_shape(cache.hidden, {rows, F});
  }
  const Tensor hidden_rows = mixed ? hidden_scratch(rows, F) : cache.hidden;
  float* hidden = hidden_rows.data<float>();
  bias_activation_forward(ffn.activation, b1, cache.pre_activation.data<float>(), hidden, rows, F);
  if (dropout.active()) dropout_forward(dropout, hidden, hidden, rows * F);
  linear_forward(ffn.linear2, hidden_rows, y, &cache.hidden_bf16);
}

void feed_forward_backward(const FeedForward& ffn, const Tensor& x, const Tensor& dy, const Tensor& dx,
                           FeedForwardCache& cache, FeedForward& grads) {
  const int64_t rows = x.size(0), F = ffn.linear1.out_features();
  CABM_CHECK(cache.pre_activation.defined() && cache.pre_activation.size(0) == rows,
             "FeedForward backward without a matching forward");
  CABM_CHECK(grads.linear1.bias.defined() == ffn.linear1.bias.defined() &&
                 (!grads.linear1.bias.defined() || grads.linear1.bias.is_contiguous()),
             "FeedForward: linear1 bias gradient must match the layer's bias");
  ensure_shape(cache.d_hidden, {rows, F});
  float* dh = cache.d_hidden.data<float>();
  // linear2: dh = dy W2, dW2 += dyᵀ hidden.
  linear_backward(ffn.linear2, cache.hidden, dy, cache.d_hidden, grads.linear2, false, &cache.hidden_bf16);
  // hidden = D(act(pre)): dpre = act'(pre) ⊙ D(dh)  (D is linear: the same mask and scale);
  // db1 += Σ_rows dpre in the same pass.
  if (cache.dropout.active()) dropout_backward(cache.dropout, dh, dh, rows * F);
  float* db1 = grads.linear1.bias.defined() ? grads.linear1.bias.data<float>() : nullptr;
  // linear1: dx = dpre W1, dW1 += dpreᵀ x. A bf16 linear1 reads only dpre's rounding, which the
  // activation pass writes directly (its bias gradient still sums the fp32 dpre).
  Linear grads1 = without_bias(grads.linear1);
  if (ffn.linear1.weight_bf16.defined() && cache.x_bf16.defined()) {
    const Tensor dpre = rounded_scratch(0, rows, F);
    const float* pre = cache.pre_activation.data<float>();
    if (dpre.dtype() == DType::F32)
      bias_activation_backward_bf16(ffn.activation, pre, dh, dpre.data<float>(), db1, rows, F);
    else
      bias_activation_backward_bf16(ffn.activation, pre, dh, dpre.data<bf16>(), db1, rows, F);
    linear_backward_rounded(without_bias(ffn.linear1), cache.x_bf16, dpre, dx, grads1);
    return;
  }
  bias_activation_backward(ffn.activation, cache.pre_activation.data<float>(), dh, dh, db1, rows, F);
  linear_backward(without_bias(ffn.linear1), x, cache.d_hidden, dx, grads1, false, &cache.x_bf16);
}

}  // namespace cabm
