// Sampling text from a causal language model with its KV cache (cabm/nn/causal_lm.h's
// causal_lm_decode): the prompt is run once, then each new token costs one incremental step.
// When the context fills the model's max_seq_len, the cache is rebuilt from the last half of
// the context (a sliding window), so generation can run past the trained length.
#pragma once

#include "cabm/core/rng.h"
#include "cabm/nn/causal_lm.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace cabm {

struct SamplingOptions {
  float temperature = 0.8f;  // 0: greedy (argmax)
  int64_t top_k = 0;         // > 0: sample among the k most likely tokens only
};

// Draws a token from logits [V] (scratch is reused between calls).
int64_t sample_token(const float* logits, int64_t V, const SamplingOptions& options, Rng& rng,
                     std::vector<float>& scratch);

// Appends `count` tokens to `prompt` (which must hold at least one token), calling
// on_token(token) as each is drawn; returns the new tokens.
std::vector<int64_t> generate(const CausalLM& model, const std::vector<int64_t>& prompt, int64_t count,
                              const SamplingOptions& options, Rng& rng,
                              const std::function<void(int64_t)>& on_token = {});

}  // namespace cabm
