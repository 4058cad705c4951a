// Gradient clipping by global L2 norm with torch.nn.utils.clip_grad_norm_ semantics:
//   total_norm = ‖(‖g_1‖₂, ‖g_2‖₂, ...)‖₂          over every gradient, as one vector
//   clip_coef  = max_norm / (total_norm + 1e-6)
//   every g  ← g · clip_coef,  only when clip_coef < 1
// Norms accumulate in double (each per-tensor norm rounded to float, as torch returns it);
// the coefficient is computed in float, as torch does on a float tensor.
#pragma once

#include "cabm/nn/parameters.h"

namespace cabm {

// The global L2 norm of all tensors (float, per-tensor norms rounded as torch does).
float global_grad_norm(const NamedTensors& grads);

// Clips in place; returns the total norm before clipping. max_norm <= 0 only measures.
// A non-finite norm propagates (every gradient becomes NaN), as in torch; callers check it.
float clip_grad_norm(const NamedTensors& grads, float max_norm);

}  // namespace cabm
