// Element-wise activations, PyTorch semantics: ReLU, and GELU in its exact erf form
// (nn.GELU's default): gelu(x) = x · Φ(x) = 0.5 · x · (1 + erf(x / √2)).
#pragma once

#include <cstdint>

namespace cabm {

enum class Activation { kRelu, kGelu };

// y[i] = act(x[i]) for i < n; y may alias x.
void activation_forward(Activation act, const float* x, float* y, int64_t n);

}  // namespace cabm
