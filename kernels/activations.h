// Element-wise activations, PyTorch semantics: ReLU, and GELU in its exact erf form
// (nn.GELU's default): gelu(x) = x · Φ(x) = 0.5 · x · (1 + erf(x / √2)).
#pragma once

#include <cstdint>

namespace cabm {

enum class Activation { kRelu, kGelu };

// y[i] = act(x[i]) for i < n; y may alias x.
void activation_forward(Activation act, const float* x, float* y, int64_t n);

// dx[i] = dy[i] · act'(x[i]) for i < n, x being the forward INPUT; dx may alias dy.
//   relu'(x) = 1 if x > 0 else 0  (PyTorch's choice at 0: gradient 0)
//   gelu'(x) = Φ(x) + x · φ(x),   φ(x) = exp(−x²/2) / √(2π)
void activation_backward(Activation act, const float* x, const float* dy, float* dx, int64_t n);

}  // namespace cabm
