// Inverted dropout (Srivastava et al. 2014) from the counter-based RNG: element i of a
// buffer is kept iff uniform(seed, stream, i) >= p, and kept elements are scaled by 1/(1 − p).
// The mask is a pure function of (seed, stream, i): forward and backward regenerate the same
// mask instead of storing it, and it is the same for every thread count.
#pragma once

#include "cabm/core/rng.h"

#include <cstdint>

namespace cabm {

struct DropoutArgs {
  float p = 0.0f;  // probability of dropping; 0 = identity (eval mode)
  uint64_t seed = 0;
  uint64_t stream = 0;

  bool active() const { return p > 0.0f; }
};

inline bool dropout_keep(const DropoutArgs& args, uint64_t index) { return uniform(args.seed, args.stream, index) >= args.p; }

// y[i] = keep(i) ? x[i] / (1 − p) : 0 for i < n (contiguous; y may alias x). Identity copy
// when !args.active().
void dropout_forward(const DropoutArgs& args, const float* x, float* y, int64_t n);

// The same linear map applied to the gradient: dx[i] = keep(i) ? dy[i] / (1 − p) : 0.
inline void dropout_backward(const DropoutArgs& args, const float* dy, float* dx, int64_t n) {
  dropout_forward(args, dy, dx, n);
}

}  // namespace cabm
