// Sampling and generation: greedy/top-k/temperature draws, and KV-cache generation equal to
// recomputing the whole context with the full forward, including past the model's context
// length (sliding window).
#include "cabm/nn/init.h"
#include "cabm/train/generate.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>

namespace cabm {
namespace {

TEST(Sampling, GreedyTopKAndTemperature) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, -1.0f, 1.9f};
  std::vector<float> scratch;
  Rng rng(1);
  SamplingOptions greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(sample_token(logits.data(), 5, greedy, rng, scratch), 1);

  SamplingOptions top2;
  top2.top_k = 2;
  std::vector<int> counts(5, 0);
  for (int i = 0; i < 4000; ++i) ++counts[static_cast<size_t>(sample_token(logits.data(), 5, top2, rng, scratch))];
  EXPECT_EQ(counts[0] + counts[2] + counts[3], 0);  // only the two best
  EXPECT_GT(counts[1], counts[4]);

  // Temperature 1 samples softmax(logits).
  SamplingOptions plain;
  plain.temperature = 1.0f;
  std::fill(counts.begin(), counts.end(), 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[static_cast<size_t>(sample_token(logits.data(), 5, plain, rng, scratch))];
  double z = 0;
  for (float l : logits) z += std::exp(l);
  for (size_t v = 0; v < 5; ++v) EXPECT_NEAR(counts[v] / double(n), std::exp(logits[v]) / z, 0.015) << v;
}

// Greedy continuation computed the slow way: the full forward over the (windowed) context.
std::vector<int64_t> greedy_reference(const CausalLM& model, std::vector<int64_t> context, int64_t count) {
  const int64_t T = model.config.max_seq_len, V = model.config.vocab_size;
  std::vector<int64_t> out;
  size_t window_start = context.size() > static_cast<size_t>(T) ? context.size() - T : 0;
  CausalLMCache cache;
  for (int64_t i = 0; i < count; ++i) {
    const auto n = static_cast<int64_t>(context.size() - window_start);
    Tensor tokens = Tensor::empty({1, n}, DType::I64);
    std::copy(context.begin() + static_cast<std::ptrdiff_t>(window_start), context.end(), tokens.data<int64_t>());
    const float* row = causal_lm_forward(model, tokens, cache).data<float>() + (n - 1) * V;
    const int64_t next = std::max_element(row, row + V) - row;
    out.push_back(next);
    context.push_back(next);
    // Mirror generate(): when the window is full, restart from its last half.
    if (n == T) window_start = context.size() - static_cast<size_t>(T / 2);
  }
  return out;
}

TEST(Generate, KvCacheMatchesFullForwardPastTheContext) {
  CausalLMConfig c;
  c.vocab_size = 256;
  c.max_seq_len = 12;
  c.d_model = 16;
  c.nhead = 2;
  c.num_layers = 2;
  c.dim_feedforward = 32;
  c.dropout = 0.0f;
  CausalLM model = make_causal_lm(c);
  Rng init(3);
  init_parameters(model, init);
  // Larger embeddings give a peaked, non-trivial greedy path.
  for (float *p = model.embed.weight.data<float>(), *e = p + model.embed.weight.numel(); p < e; ++p) *p *= 50.0f;
  const std::vector<int64_t> prompt = {72, 101, 108, 108, 111};
  SamplingOptions greedy;
  greedy.temperature = 0.0f;
  Rng rng(0);
  std::vector<int64_t> streamed;
  const auto produced = generate(model, prompt, 30, greedy, rng, [&](int64_t t) { streamed.push_back(t); });
  EXPECT_EQ(produced, streamed);
  EXPECT_EQ(produced, greedy_reference(model, prompt, 30));
  // A prompt longer than the context keeps its end.
  std::vector<int64_t> long_prompt;
  for (int i = 0; i < 20; ++i) long_prompt.push_back(97 + i);
  EXPECT_EQ(generate(model, long_prompt, 15, greedy, rng), greedy_reference(model, long_prompt, 15));
  EXPECT_THROW(generate(model, {}, 3, greedy, rng), Error);
  EXPECT_THROW(generate(model, {300}, 3, greedy, rng), Error);
}

}  // namespace
}  // namespace cabm
