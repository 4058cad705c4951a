#include "cabm/train/generate.h"

#include "cabm/core/error.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace cabm {

int64_t sample_token(const float* logits, int64_t V, const SamplingOptions& options, Rng& rng,
                     std::vector<float>& scratch) {
  CABM_CHECK(V > 0, "no logits to sample from");
  if (options.temperature <= 0.0f) return std::max_element(logits, logits + V) - logits;
  // Threshold for top-k: the k-th largest logit (ties at the threshold are all kept).
  float threshold = -INFINITY;
  if (options.top_k > 0 && options.top_k < V) {
    scratch.assign(logits, logits + V);
    std::nth_element(scratch.begin(), scratch.begin() + (options.top_k - 1), scratch.end(), std::greater<float>());
    threshold = scratch[static_cast<size_t>(options.top_k - 1)];
  }
  const float max_logit = *std::max_element(logits, logits + V);
  scratch.resize(static_cast<size_t>(V));
  double total = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    const float p = logits[v] >= threshold ? std::exp((logits[v] - max_logit) / options.temperature) : 0.0f;
    scratch[static_cast<size_t>(v)] = p;
    total += p;
  }
  const double u = static_cast<double>(rng.next_uniform()) * total;
  double acc = 0.0;
  int64_t last_nonzero = 0;
  for (int64_t v = 0; v < V; ++v) {
    if (scratch[static_cast<size_t>(v)] <= 0.0f) continue;
    acc += scratch[static_cast<size_t>(v)];
    last_nonzero = v;
    if (u < acc) return v;
  }
  return last_nonzero;  // u landed on the rounding slack at the top
}

std::vector<int64_t> generate(const CausalLM& model, const std::vector<int64_t>& prompt, int64_t count,
                              const SamplingOptions& options, Rng& rng, const std::function<void(int64_t)>& on_token) {
  CABM_CHECK(!prompt.empty(), "generation needs a prompt of at least one token");
  const int64_t V = model.config.vocab_size;
  const int64_t capacity = model.config.max_seq_len;
  for (const int64_t t : prompt)
    if (t < 0 || t >= V) throw Error(fmt::format("prompt token {} is outside the vocabulary [0, {})", t, V));
  std::vector<int64_t> context = prompt;
  std::vector<int64_t> produced;
  DecodeState state;
  std::vector<float> scratch;

  // Feeds context[from..) into a fresh cache; returns the logits of its last position.
  const auto prefill = [&](size_t from) -> const float* {
    decode_reset(model, 1, capacity, state);
    const auto n = static_cast<int64_t>(context.size() - from);
    Tensor tokens = Tensor::empty({1, n}, DType::I64);
    std::copy(context.begin() + static_cast<std::ptrdiff_t>(from), context.end(), tokens.data<int64_t>());
    const Tensor& logits = causal_lm_decode(model, tokens, state);
    return logits.data<float>() + (n - 1) * V;
  };
  // Longer prompts than the model's context keep their last `capacity` tokens.
  const float* logits = prefill(context.size() > static_cast<size_t>(capacity) ? context.size() - capacity : 0);
  Tensor one = Tensor::empty({1, 1}, DType::I64);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t token = sample_token(logits, V, options, rng, scratch);
    produced.push_back(token);
    context.push_back(token);
    if (on_token) on_token(token);
    if (i + 1 == count) break;
    if (state.length() >= capacity) {
      // Full: rebuild the cache from the most recent half of the context.
      logits = prefill(context.size() - static_cast<size_t>(std::max<int64_t>(1, capacity / 2)));
    } else {
      one.data<int64_t>()[0] = token;
      logits = causal_lm_decode(model, one, state).data<float>();
    }
  }
  return produced;
}

}  // namespace cabm
