// Layer normalisation over the last axis (Ba et al. 2016), PyTorch's nn.LayerNorm semantics:
//   y = (x − mean) / sqrt(var + eps) · weight + bias,   var biased (divided by E).
//
// The row kernels are compiled once per instruction set (layernorm_body.h: AVX-512, AVX2 + FMA,
// portable) and the widest this CPU runs is chosen at run time (cpu_isa.h; CABM_SIMD_ISA pins one).
// Row sums are in double in each set's fixed order; results are the same bits for every thread
// count, and within float rounding of the reference below for every set.
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

// Inference: the residual add of a post-norm sublayer and the LayerNorm after it, row by row (each
// row normalised while it is in cache),
//   y = LayerNorm(residual + (branch + branch_bias))
// in PyTorch's order of operations (the bias belongs to the product that made `branch`, which then
// needs none of its own). residual, branch, y: [rows, E] contiguous; y may alias either input;
// branch_bias: [E] or null. Nothing is saved for a backward pass. The sum is formed in y, then
// normalised by layernorm_forward's row kernel: the same bits as layernorm_forward on the explicit
// sum (its reference).
void add_layernorm_forward(const LayerNormArgs& args, const float* residual, const float* branch,
                           const float* branch_bias, float* y);

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

// The same math as plain loops, one row after another on the calling thread, the parameter
// gradients summed in row order: the oracle of the dispatched kernels above.
void layernorm_forward_reference(const LayerNormArgs& args, const float* x, int64_t x_ld, float* y, int64_t y_ld,
                                 float* mean, float* rstd);
void layernorm_backward_reference(const LayerNormArgs& args, const float* x, int64_t x_ld, const float* mean,
                                  const float* rstd, const float* dy, int64_t dy_ld, const LayerNormGrads& grads);

}  // namespace cabm
