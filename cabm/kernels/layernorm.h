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

// Where the backward pass writes. dx: [rows, E] row stride dx_ld, OVERWRITTEN (may alias dy).
// dweight, dbias: [E], ACCUMULATED (+=); either may be null (skipped).
struct LayerNormGrads {
  float* dx;
  int64_t dx_ld;
  float* dweight;
  float* dbias;
};

// With x̂ = (x − mean)·rstd and g = dy ⊙ weight (per row, over the E features):
//   dx      = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂))
//   dweight += Σ_rows dy ⊙ x̂,   dbias += Σ_rows dy
// (y = x̂w + b; x̂ depends on x through the mean and rstd, whose derivatives give the two
// subtracted means.) x: [rows, E] (row stride x_ld) is the forward input; mean, rstd: [rows]
// as layernorm_forward saved them; dy: [rows, E] (row stride dy_ld).
// The parameter sums are split into a fixed number of row chunks, so they are bitwise the
// same for every thread count.
void layernorm_backward(const LayerNormArgs& args, const float* x, int64_t x_ld, const float* mean,
                        const float* rstd, const float* dy, int64_t dy_ld, const LayerNormGrads& grads);

}  // namespace cabm
