// nn.LayerNorm over the last axis, with learnable weight and bias.
#pragma once

#include "cabm/core/tensor.h"

namespace cabm {

struct LayerNorm {
  Tensor weight;  // [E]
  Tensor bias;    // [E]
  float eps = 1e-5f;

  int64_t dim() const { return weight.size(0); }
};

LayerNorm make_layer_norm(int64_t E, float eps);  // weight 1, bias 0, as PyTorch initialises

// Saved for the backward pass: per-row mean and 1/sqrt(var + eps).
struct LayerNormCache {
  Tensor mean;  // [rows]
  Tensor rstd;  // [rows]
};

// x, y: [rows, E] row views (y may alias x; then the backward pass needs x kept elsewhere).
void layer_norm_forward(const LayerNorm& norm, const Tensor& x, const Tensor& y, LayerNormCache& cache);

// x: [rows, E] the forward input; dy: [rows, E]; dx: [rows, E] written (may alias dy).
// grads.weight/bias [E] accumulate (see cabm/kernels/layernorm.h for the derivation).
void layer_norm_backward(const LayerNorm& norm, const Tensor& x, const Tensor& dy, const Tensor& dx,
                         const LayerNormCache& cache, LayerNorm& grads);

}  // namespace cabm
