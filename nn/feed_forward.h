// Position-wise feed-forward sublayer: linear2(dropout(act(linear1(x)))), widths E → F → E.
#pragma once

#include "kernels/activations.h"
#include "nn/linear.h"

namespace cabm {

struct FeedForward {
  Linear linear1;  // [F, E]
  Linear linear2;  // [E, F]
  Activation activation = Activation::kRelu;
};

FeedForward make_feed_forward(int64_t E, int64_t F, Activation activation, bool bias);

struct FeedForwardCache {
  Tensor pre_activation;  // [rows, F]: linear1's output
  Tensor hidden;          // [rows, F]: act(pre_activation), input of linear2
};

// x, y: [rows, E] row views.
void feed_forward_forward(const FeedForward& ffn, const Tensor& x, const Tensor& y, FeedForwardCache& cache);

}  // namespace cabm
