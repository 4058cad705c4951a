#include "nn/feed_forward.h"

namespace cabm {

FeedForward make_feed_forward(int64_t E, int64_t F, Activation activation, bool bias) {
  return FeedForward{make_linear(E, F, bias), make_linear(F, E, bias), activation};
}

void feed_forward_forward(const FeedForward& ffn, const Tensor& x, const Tensor& y, FeedForwardCache& cache) {
  const int64_t rows = x.size(0), F = ffn.linear1.out_features();
  ensure_shape(cache.pre_activation, {rows, F});
  ensure_shape(cache.hidden, {rows, F});
  linear_forward(ffn.linear1, x, cache.pre_activation);
  activation_forward(ffn.activation, cache.pre_activation.data<float>(), cache.hidden.data<float>(), rows * F);
  linear_forward(ffn.linear2, cache.hidden, y);
}

}  // namespace cabm
