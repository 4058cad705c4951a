// Position-wise feed-forward sublayer: linear2(dropout(act(linear1(x)))), widths E → F → E.
#pragma once

#include "cabm/kernels/activations.h"
#include "cabm/kernels/dropout.h"
#include "cabm/nn/linear.h"

namespace cabm {

struct FeedForward {
  Linear linear1;  // [F, E]
  Linear linear2;  // [E, F]
  Activation activation = Activation::kRelu;
};

FeedForward make_feed_forward(int64_t E, int64_t F, Activation activation, bool bias);

struct FeedForwardCache {
  Tensor pre_activation;  // [rows, F]: linear1's output
  Tensor hidden;          // [rows, F]: dropout(act(pre_activation)), input of linear2 (fp32 layers)
  DropoutArgs dropout;    // the hidden dropout of the last forward (inactive in eval)
  // Mixed precision: linear1's and linear2's inputs rounded to bf16 by the forward, for the
  // backward (linear_forward's x_bf16); undefined with fp32 layers. With a bf16 linear2 the fp32
  // hidden is dead once rounded and `hidden` is undefined: without dropout the activation pass
  // writes hidden_bf16 directly, with dropout the fp32 hidden goes through a per-thread buffer.
  // BF16, or F32 holding bf16 values where the products widen their operands (rounded_dtype()).
  Tensor x_bf16, hidden_bf16;  // [rows, E], [rows, F]
  Tensor d_hidden;             // [rows, F]: backward scratch
};

// x, y: [rows, E] row views. `dropout` applies to the hidden layer (default: none).
void feed_forward_forward(const FeedForward& ffn, const Tensor& x, const Tensor& y, FeedForwardCache& cache,
                          const DropoutArgs& dropout = {});

// x: [rows, E] the forward input; dy: [rows, E]; dx: [rows, E] written (must not alias dy).
//   dh = dy W2 (linear2),  dh ⊙= dropout mask/(1−p),  dpre = dh ⊙ act'(pre),  dx = dpre W1
void feed_forward_backward(const FeedForward& ffn, const Tensor& x, const Tensor& dy, const Tensor& dx,
                           FeedForwardCache& cache, FeedForward& grads);

}  // namespace cabm
