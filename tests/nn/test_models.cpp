// The model API: parameter names (PyTorch's state_dict names), gradient modules that zip name
// by name, initialisation statistics, micro-batch gradient accumulation, incremental decoding
// with a KV cache, and dropout reproducibility.
#include "cabm/core/threads.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/classifier.h"
#include "cabm/nn/init.h"
#include "cabm/nn/parameters.h"
#include "util/test_util.h"

#include <cmath>

namespace cabm {
namespace {

CausalLMConfig small_lm(bool tie, bool norm_first) {
  CausalLMConfig c;
  c.vocab_size = 13;
  c.max_seq_len = 9;
  c.d_model = 16;
  c.nhead = 4;
  c.num_layers = 2;
  c.dim_feedforward = 24;
  c.dropout = 0.1f;
  c.norm_first = norm_first;
  c.tie_head = tie;
  return c;
}

Tensor ids(const std::vector<int64_t>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::I64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

Tensor random_ids(const Shape& shape, int64_t V, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::I64);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = rng.next_u32() % V;
  return t;
}

TEST(Models, CausalLMParameterNames) {
  const CausalLM tied = make_causal_lm(small_lm(true, true));
  const NamedTensors p = named_parameters(tied);
  std::vector<std::string> names;
  for (const auto& n : p) names.push_back(n.name);
  const std::vector<std::string> layer = {
      "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
      "linear1.weight",           "linear1.bias",           "linear2.weight",            "linear2.bias",
      "norm1.weight",             "norm1.bias",             "norm2.weight",              "norm2.bias"};
  std::vector<std::string> expected = {"embed.weight", "pos_embed.weight"};
  for (int l = 0; l < 2; ++l)
    for (const auto& n : layer) expected.push_back("encoder.layers." + std::to_string(l) + "." + n);
  expected.push_back("encoder.norm.weight");
  expected.push_back("encoder.norm.bias");
  EXPECT_EQ(names, expected);
  EXPECT_EQ(p[0].tensor.shape(), (Shape{13, 16}));
  EXPECT_EQ(p[1].tensor.shape(), (Shape{9, 16}));

  const NamedTensors untied = named_parameters(make_causal_lm(small_lm(false, true)));
  EXPECT_EQ(untied.back().name, "head.weight");
  EXPECT_EQ(untied.back().tensor.shape(), (Shape{13, 16}));

  ClassifierConfig cc;
  cc.vocab_size = 5, cc.max_seq_len = 4, cc.d_model = 8, cc.nhead = 2, cc.num_layers = 1, cc.dim_feedforward = 8;
  cc.num_classes = 3;
  const NamedTensors c = named_parameters(make_classifier(cc));
  EXPECT_EQ(c[c.size() - 2].name, "classifier.weight");
  EXPECT_EQ(c.back().name, "classifier.bias");
  EXPECT_EQ(c[c.size() - 3].name, "encoder.norm.bias");
}

TEST(Models, ConfigErrorsAreClear) {
  CausalLMConfig c = small_lm(true, true);
  c.nhead = 5;  // 16 % 5 != 0
  EXPECT_THROW(make_causal_lm(c), Error);
  c = small_lm(true, true);
  c.vocab_size = 0;
  EXPECT_THROW(make_causal_lm(c), Error);
  const CausalLM model = make_causal_lm(small_lm(true, true));
  CausalLMCache cache;
  EXPECT_THROW(causal_lm_forward(model, random_ids({1, 10}, 13, 1), cache), Error);  // > max_seq_len
  EXPECT_THROW(causal_lm_forward(model, ids({0, 13}, {1, 2}), cache), Error);         // id out of range
}

TEST(Models, InitialisationDistributions) {
  CausalLMConfig cfg = small_lm(false, true);
  cfg.d_model = 64, cfg.nhead = 4, cfg.dim_feedforward = 128, cfg.vocab_size = 200, cfg.max_seq_len = 64;
  CausalLM model = make_causal_lm(cfg);
  Rng rng(42);
  init_parameters(model, rng);
  auto stats = [](const Tensor& t) {
    double s = 0, s2 = 0, mx = 0;
    for (float v : t.to_vector()) s += v, s2 += double(v) * v, mx = std::max(mx, std::fabs(double(v)));
    const double n = t.numel();
    return std::make_tuple(s / n, std::sqrt(s2 / n - (s / n) * (s / n)), mx);
  };
  {  // Embedding N(0, 0.02)
    const auto [mean, sd, mx] = stats(model.embed.weight);
    EXPECT_NEAR(mean, 0.0, 0.002);
    EXPECT_NEAR(sd, 0.02, 0.001);
  }
  {  // xavier_uniform on [3E, E]: bound √(6/(4E)), sd = bound/√3
    const auto [mean, sd, mx] = stats(model.encoder.layers[0].self_attn.in_proj_weight);
    const double bound = std::sqrt(6.0 / (4 * 64));
    EXPECT_LE(mx, bound);
    EXPECT_NEAR(sd, bound / std::sqrt(3.0), 0.02 * bound);
  }
  {  // Linear: U(±1/√in)
    const auto [mean, sd, mx] = stats(model.encoder.layers[0].ffn.linear2.weight);
    EXPECT_LE(mx, 1.0 / std::sqrt(128.0));
    EXPECT_NEAR(sd, 1.0 / std::sqrt(128.0) / std::sqrt(3.0), 0.03 / std::sqrt(128.0));
  }
  for (float v : model.encoder.layers[1].self_attn.in_proj_bias.to_vector()) EXPECT_EQ(v, 0.0f);
  for (float v : model.encoder.layers[1].self_attn.out_proj.bias.to_vector()) EXPECT_EQ(v, 0.0f);
  for (float v : model.encoder.norm->weight.to_vector()) EXPECT_EQ(v, 1.0f);
  // The same seed gives the same model.
  CausalLM again = make_causal_lm(cfg);
  Rng rng2(42);
  init_parameters(again, rng2);
  EXPECT_EQ(again.head.weight.to_vector(), model.head.weight.to_vector());
}

// Two half batches with grad_scale 1/2 accumulate the gradient of the full batch (when both
// halves count the same number of targets, the mean over the batch is the mean of the means).
TEST(Models, MicroBatchAccumulation) {
  const CausalLMConfig cfg = small_lm(true, false);
  CausalLM model = make_causal_lm(cfg), full = make_causal_lm(cfg), halves = make_causal_lm(cfg);
  Rng rng(1);
  init_parameters(model, rng);
  zero_parameters(named_parameters(full));
  zero_parameters(named_parameters(halves));
  const Tensor tokens = random_ids({4, 6}, cfg.vocab_size, 2), targets = random_ids({4, 6}, cfg.vocab_size, 3);
  CausalLMCache cache;
  causal_lm_forward(model, tokens, cache);
  const float loss = causal_lm_loss(targets, {}, cache).loss;
  causal_lm_backward(model, cache, full);
  float half_losses = 0;
  for (int64_t h = 0; h < 2; ++h) {
    causal_lm_forward(model, tokens.narrow(0, 2 * h, 2).contiguous(), cache);
    LossOptions options;
    options.grad_scale = 0.5f;
    half_losses += 0.5f * causal_lm_loss(targets.narrow(0, 2 * h, 2).contiguous(), options, cache).loss;
    causal_lm_backward(model, cache, halves);
  }
  EXPECT_NEAR(loss, half_losses, 1e-5);
  const NamedTensors a = named_parameters(full), b = named_parameters(halves);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].name, b[i].name);
    EXPECT_CLOSE(b[i].tensor, a[i].tensor, 1e-4, 1e-6);
  }
}

// Incremental decoding: the prompt, then one token at a time, gives the logits of a full
// forward over the same prefix (different kernels and summation orders: float rounding only).
TEST(Models, KVCacheDecodingMatchesFullForward) {
  for (bool norm_first : {true, false}) {
    const CausalLMConfig cfg = small_lm(!norm_first, norm_first);
    CausalLM model = make_causal_lm(cfg);
    Rng rng(7);
    init_parameters(model, rng);
    const int64_t B = 2, T = 9;
    const Tensor tokens = random_ids({B, T}, cfg.vocab_size, 8);
    CausalLMCache cache;
    const Tensor full = causal_lm_forward(model, tokens, cache).clone();  // [B, T, V]

    DecodeState state;
    decode_reset(model, B, T, state);
    const int64_t prompt = 3;
    Tensor step = causal_lm_decode(model, tokens.narrow(1, 0, prompt).contiguous(), state);
    EXPECT_CLOSE(step, full.narrow(1, 0, prompt).contiguous(), 1e-4, 1e-5);
    for (int64_t t = prompt; t < T; ++t) {
      EXPECT_EQ(state.length(), t);
      step = causal_lm_decode(model, tokens.narrow(1, t, 1).contiguous(), state);
      EXPECT_CLOSE(step, full.narrow(1, t, 1).contiguous(), 1e-4, 1e-5);
    }
    EXPECT_THROW(causal_lm_decode(model, tokens.narrow(1, 0, 1).contiguous(), state), Error);  // full
    // Reset and decode again: same answers.
    decode_reset(model, B, T, state);
    EXPECT_CLOSE(causal_lm_decode(model, tokens, state), full, 1e-4, 1e-5);
  }
}

// --- Dropout ---------------------------------------------------------------------------------

TEST(Dropout, KernelRateScaleAndThreadCount) {
  const int64_t n = 100003;
  const Tensor x = Tensor::full({n}, 1.0f);
  const DropoutArgs args{0.3f, 5, 9};
  std::vector<float> out[2];
  for (int threads : {1, 2}) {
    test::ScopedThreads scoped(threads);
    Tensor y = Tensor::empty({n});
    dropout_forward(args, x.data<float>(), y.data<float>(), n);
    out[threads - 1] = y.to_vector();
  }
  EXPECT_EQ(out[0], out[1]);
  int64_t dropped = 0;
  for (float v : out[0]) {
    if (v == 0.0f) ++dropped;
    else EXPECT_FLOAT_EQ(v, 1.0f / 0.7f);
  }
  EXPECT_NEAR(static_cast<double>(dropped) / n, 0.3, 0.005);  // ~3.5 standard deviations
  Tensor y = Tensor::empty({n});
  dropout_forward({}, x.data<float>(), y.data<float>(), n);  // inactive: identity
  EXPECT_EQ(y.to_vector(), x.to_vector());
}

TEST(Dropout, ModelReproducibleForSeedAndStep) {
  CausalLMConfig cfg = small_lm(true, true);
  cfg.dropout = 0.3f;
  CausalLM model = make_causal_lm(cfg);
  Rng rng(3);
  init_parameters(model, rng);
  const Tensor tokens = random_ids({2, 8}, cfg.vocab_size, 4);
  CausalLMCache cache;
  auto run = [&](ForwardMode mode) { return causal_lm_forward(model, tokens, cache, mode).clone(); };
  const Tensor eval = run({});
  const Tensor a = run({true, 11, 5});
  const Tensor b = run({true, 11, 5});
  EXPECT_EQ(a.to_vector(), b.to_vector());                        // same seed and step: identical
  EXPECT_NE(run({true, 11, 6}).to_vector(), a.to_vector());        // another step
  EXPECT_NE(run({true, 12, 5}).to_vector(), a.to_vector());        // another seed
  EXPECT_NE(eval.to_vector(), a.to_vector());
  EXPECT_EQ(run({false, 11, 5}).to_vector(), eval.to_vector());    // eval: dropout is the identity
  CausalLM no_dropout_model = model;
  no_dropout_model.config.dropout = 0.0f;
  for (auto& layer : no_dropout_model.encoder.layers) layer.config.dropout = 0.0f;
  EXPECT_EQ(causal_lm_forward(no_dropout_model, tokens, cache, {true, 11, 5}).to_vector(), eval.to_vector());

  // Layers and sites draw distinct masks: the FFN hidden zero patterns of layers 0 and 1 differ.
  run({true, 11, 5});
  auto zeros = [](const Tensor& t) {
    std::vector<bool> z;
    for (float v : t.to_vector()) z.push_back(v == 0.0f);
    return z;
  };
  EXPECT_NE(zeros(cache.encoder.layers[0].ffn.hidden), zeros(cache.encoder.layers[1].ffn.hidden));
}

TEST(Dropout, ThreadCountDoesNotChangeMasksOrResults) {
  CausalLMConfig cfg = small_lm(true, true);
  cfg.dropout = 0.25f;
  CausalLM model = make_causal_lm(cfg), grads1 = make_causal_lm(cfg), grads2 = make_causal_lm(cfg);
  Rng rng(5);
  init_parameters(model, rng);
  zero_parameters(named_parameters(grads1));
  zero_parameters(named_parameters(grads2));
  const Tensor tokens = random_ids({3, 9}, cfg.vocab_size, 6), targets = random_ids({3, 9}, cfg.vocab_size, 7);
  Tensor logits[2];
  std::vector<float> hidden[2], embedded[2];
  float loss[2];
  for (int threads : {1, 2}) {
    test::ScopedThreads scoped(threads);
    CausalLMCache cache;
    logits[threads - 1] = causal_lm_forward(model, tokens, cache, {true, 99, 1}).clone();
    hidden[threads - 1] = cache.encoder.layers[1].ffn.hidden.to_vector();
    embedded[threads - 1] = cache.embedded.to_vector();
    loss[threads - 1] = causal_lm_loss(targets, {}, cache).loss;
    causal_lm_backward(model, cache, threads == 1 ? grads1 : grads2);
  }
  // Masks: the same elements are zero (embedding dropout is applied to a gather: bitwise equal).
  EXPECT_EQ(embedded[0], embedded[1]);
  ASSERT_EQ(hidden[0].size(), hidden[1].size());
  for (size_t i = 0; i < hidden[0].size(); ++i) EXPECT_EQ(hidden[0][i] == 0.0f, hidden[1][i] == 0.0f) << i;
  // Values: equal up to float rounding (the GEMM library may split sums by thread).
  EXPECT_CLOSE(logits[1], logits[0], 1e-5, 1e-5);
  EXPECT_NEAR(loss[0], loss[1], 1e-5);
  const NamedTensors g1 = named_parameters(grads1), g2 = named_parameters(grads2);
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_CLOSE(g2[i].tensor, g1[i].tensor, 1e-4, 1e-6);
}

}  // namespace
}  // namespace cabm
