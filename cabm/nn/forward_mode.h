// Training versus evaluation, and where each dropout site takes its random numbers.
//
// Every module forward takes a `const ForwardMode& mode = {}`; the default is eval mode, in
// which dropout is the identity and outputs are deterministic. In training mode each dropout
// site draws from its own Philox stream, derived from (seed, step, layer, site):
//   key    = mix(seed, step)                (a fresh Philox key per optimiser step)
//   stream = ((layer << 8) | site) << 32    (+ b·H + h for attention weights, as the attention
//                                            kernels number their streams)
// and element i of the site's buffer uses counter i. So masks are reproducible for a given
// seed and step, independent of the thread count, and distinct across steps, layers and sites.
#pragma once

#include "cabm/kernels/dropout.h"

#include <cstdint>

namespace cabm {

struct ForwardMode {
  bool training = false;
  uint64_t seed = 0;   // the run's dropout seed
  uint64_t step = 0;   // optimiser step (or micro-batch counter): new masks every step
  uint64_t layer = 0;  // set by containers (Encoder: layer index; models: kModelLayer for embeddings)
};

enum class DropoutSite : uint64_t {
  kAttentionWeights = 0,  // MHA attention weights (AttentionOptions.dropout)
  kAttentionResidual = 1, // PyTorch's dropout1: on the attention branch before the residual add
  kFeedForwardHidden = 2, // PyTorch's dropout: on act(linear1(x))
  kFeedForwardResidual = 3,  // PyTorch's dropout2
  kEmbedding = 4,         // models: on token + position embeddings
};

// Layer id used for model-level sites (embeddings), outside any encoder layer.
inline constexpr uint64_t kModelLayer = (uint64_t{1} << 24) - 1;

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t dropout_key(const ForwardMode& mode) { return splitmix64(mode.seed ^ splitmix64(mode.step)); }

// For AttentionOptions.dropout_offset (the kernel adds b·H + h below bit 32).
inline uint64_t dropout_offset(const ForwardMode& mode, DropoutSite site) {
  return ((mode.layer & kModelLayer) << 8) | static_cast<uint64_t>(site);
}

// Dropout arguments for a site: inactive (p = 0) in eval mode.
inline DropoutArgs dropout_args(const ForwardMode& mode, DropoutSite site, float p) {
  if (!mode.training || p <= 0.0f) return {};
  return DropoutArgs{p, dropout_key(mode), dropout_offset(mode, site) << 32};
}

}  // namespace cabm
