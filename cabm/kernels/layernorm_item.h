// What layernorm.cpp (threads, the row partition, the choice of set) shares with the row kernels it
// runs once per instruction set (layernorm_body.h, compiled in layernorm_{avx512,avx2,portable}.cpp
// and chosen at run time by cpu_isa.h). Internal to kernels/. Also every header the body needs: the
// per-set files include this before their `#pragma GCC target` region, so that nothing outside the
// kernel's own code is compiled for a set.
#pragma once

#include "cabm/kernels/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include "cabm/kernels/x86_intrinsics.h"
#endif

// The row kernels, the same code in each set's namespace. E = args.E; rows are contiguous.
//   forward_row:   y = (x − mean) · rstd · weight + bias, the statistics from two passes in double
//                  (mean, then centred squares); mean and rstd written if non-null. y may alias x.
//   add_row:       y = residual + (branch + bias) (bias may be null); y may alias either input.
//   backward_row:  dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)) (dx may alias dy, or be null), and
//                  pw += dy ⊙ x̂, pb += dy if pw is non-null (see layernorm.h).
namespace cabm::layernorm_avx512 {
void forward_row(const LayerNormArgs& args, const float* x, float* y, float* mean, float* rstd);
void add_row(const float* residual, const float* branch, const float* bias, float* y, int64_t E);
void backward_row(const LayerNormArgs& args, const float* x, float mean, float rstd, const float* dy, float* dx,
                  float* pw, float* pb);
}  // namespace cabm::layernorm_avx512
namespace cabm::layernorm_avx2 {
void forward_row(const LayerNormArgs& args, const float* x, float* y, float* mean, float* rstd);
void add_row(const float* residual, const float* branch, const float* bias, float* y, int64_t E);
void backward_row(const LayerNormArgs& args, const float* x, float mean, float rstd, const float* dy, float* dx,
                  float* pw, float* pb);
}  // namespace cabm::layernorm_avx2
namespace cabm::layernorm_portable {
void forward_row(const LayerNormArgs& args, const float* x, float* y, float* mean, float* rstd);
void add_row(const float* residual, const float* branch, const float* bias, float* y, int64_t E);
void backward_row(const LayerNormArgs& args, const float* x, float mean, float rstd, const float* dy, float* dx,
                  float* pw, float* pb);
}  // namespace cabm::layernorm_portable
