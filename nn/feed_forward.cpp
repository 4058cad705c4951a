#include "nn/feed_forward.h"

namespace cabm {

FeedForward make_feed_forward(int64_t E, int64_t F, Activation activation, bool bias) {
  return FeedForward{make_linear(E, F, bias), make_linear(F, E, bias), activation};
}

void feed_forward_forward(const FeedForward& ffn, const Tensor& x, const Tensor& y, FeedForwardCache& cache,
                          const DropoutArgs& dropout) {
  const int64_t rows = x.size(0), F = ffn.linear1.out_features();
  ensure_shape(cache.pre_activation, {rows, F});
  ensure_shape(cache.hidden, {rows, F});
  cache.dropout = dropout;
  linear_forward(ffn.linear1, x, cache.pre_activation);
  float* hidden = cache.hidden.data<float>();
  activation_forward(ffn.activation, cache.pre_activation.data<float>(), hidden, rows * F);
  if (dropout.active()) dropout_forward(dropout, hidden, hidden, rows * F);
  linear_forward(ffn.linear2, cache.hidden, y);
}

void feed_forward_backward(const FeedForward& ffn, const Tensor& x, const Tensor& dy, const Tensor& dx,
                           FeedForwardCache& cache, FeedForward& grads) {
  const int64_t rows = x.size(0), F = ffn.linear1.out_features();
  CABM_CHECK(cache.hidden.defined() && cache.hidden.size(0) == rows, "FeedForward backward without a matching forward");
  ensure_shape(cache.d_hidden, {rows, F});
  float* dh = cache.d_hidden.data<float>();
  // linear2: dh = dy W2, dW2 += dyᵀ hidden.
  linear_backward(ffn.linear2, cache.hidden, dy, cache.d_hidden, grads.linear2);
  // hidden = D(act(pre)): dpre = act'(pre) ⊙ D(dh)  (D is linear: the same mask and scale).
  if (cache.dropout.active()) dropout_backward(cache.dropout, dh, dh, rows * F);
  activation_backward(ffn.activation, cache.pre_activation.data<float>(), dh, dh, rows * F);
  // linear1: dx = dpre W1, dW1 += dpreᵀ x.
  linear_backward(ffn.linear1, x, cache.d_hidden, dx, grads.linear1);
}

}  // namespace cabm
