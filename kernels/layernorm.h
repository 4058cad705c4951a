// Layer normalisation over the last axis (Ba et al. 2016), PyTorch's nn.LayerNorm semantics:
//   y = (x − mean) / sqrt(var + eps) · weight + bias,   var biased (divided by E).
#pragma once

#include <cstdint>

namespace cabm {

// x, y: [rows, E] with row strides x_ld, y_ld (y may alias x). weight, bias: [E] (either may
// be null: 1 and 0). mean, rstd: [rows], written if non-null (saved for the backward pass).
struct LayerNormArgs {
  int64_t rows;
  int64_t E;
  float eps;
  const float* weight;
  const float* bias;
};
void layernorm_forward(const LayerNormArgs& args, const float* x, int64_t x_ld, float* y, int64_t y_ld,
                       float* mean, float* rstd);

}  // namespace cabm
