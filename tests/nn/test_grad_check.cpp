// Every nn/ backward pass against central finite differences in DOUBLE precision.
//
// Oracle: tests/nn/reference_double.h, an independent double-precision forward of each module
// reading the same parameters by name. Its gradient by central differences (step 1e-6) has
// truncation error ~h²·f''' ≈ 1e-12 and rounding error ~1e-16/h ≈ 1e-10 relative to the
// loss scale: exact for our purpose. What remains is the float32 error of the analytic
// backward under test: chains of a few dozen float ops with sums of at most ~100 terms,
// i.e. a few hundred ulps, ≲ 1e-4 of the tensor's largest gradient. So each gradient tensor
// must satisfy max|g − g_ref| <= kRtol · max(1, max|g_ref|) with kRtol = 1e-4 (float eps is
// 1.2e-7); a wrong or missing term shows up at the scale of the gradient itself.
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/classifier.h"
#include "cabm/nn/embedding.h"
#include "cabm/nn/encoder.h"
#include "cabm/nn/parameters.h"
#include "cabm/nn/positional.h"
#include "nn/reference_double.h"
#include "util/test_util.h"

#include <cmath>

namespace cabm {
namespace {

using test::random_tensor;
using test::ref::Params;
using test::ref::Vec;
namespace ref = test::ref;

constexpr double kRtol = 1e-4;

void expect_grad_close(const std::string& what, const Tensor& actual, const Vec& expected) {
  const std::vector<float> a = actual.to_vector();
  ASSERT_EQ(a.size(), expected.size()) << what;
  double scale = 1.0, worst = 0.0;
  size_t worst_i = 0;
  for (double e : expected) scale = std::max(scale, std::fabs(e));
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(a[i] - expected[i]);
    if (!(diff <= worst)) {
      worst = diff;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, kRtol * scale) << what << ": worst at index " << worst_i << ": " << a[worst_i] << " vs "
                                  << expected[worst_i] << " (scale " << scale << ")";
}

// Fills every parameter with U(-0.5, 0.5) (LayerNorm weights around 1).
void randomize(const NamedTensors& params, uint64_t seed) {
  for (const NamedTensor& p : params) {
    Tensor t = random_tensor(p.tensor.shape(), seed++, -0.5f, 0.5f);
    if (p.name.find("norm") != std::string::npos && p.name.ends_with("weight")) {
      float* q = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) q[i] += 1.0f;
    }
    Tensor dst = p.tensor;
    dst.copy_from(t);
  }
}

// Each parameter gradient against central differences of f over the reference parameters.
void check_parameters(const std::function<double()>& f, Params& params, const NamedTensors& grads,
                      const std::string& context) {
  for (const NamedTensor& g : grads) {
    SCOPED_TRACE(context + " " + g.name);
    ASSERT_TRUE(params.count(g.name)) << g.name;
    expect_grad_close(context + " " + g.name, g.tensor, ref::numeric_gradient(f, params[g.name]));
  }
}

// ---------------------------------------------------------------------------------------------

TEST(GradCheck, LinearAndAccumulation) {
  Linear layer = make_linear(4, 3, true), grad = make_linear(4, 3, true);  // zero parameters
  randomize(named_parameters(layer), 1);
  const Tensor x = random_tensor({5, 4}, 10), w = random_tensor({5, 3}, 11);
  Tensor y = Tensor::empty({5, 3}), dx = Tensor::empty({5, 4});
  linear_forward(layer, x, y);
  linear_backward(layer, x, w, dx, grad);
  Params p = ref::to_params(named_parameters(layer));
  Vec xv = ref::to_vec(x);
  const Vec wv = ref::to_vec(w);
  auto f = [&] { return ref::dot(wv, ref::linear(xv, 5, 4, p["weight"], p["bias"].data(), 3)); };
  expect_grad_close("dx", dx, ref::numeric_gradient(f, xv));
  check_parameters(f, p, named_parameters(grad), "linear");

  // A second backward accumulates: gradients double; dx is overwritten (unchanged).
  const std::vector<float> once = grad.weight.to_vector();
  linear_backward(layer, x, w, dx, grad);
  const std::vector<float> twice = grad.weight.to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * once[i]);
  expect_grad_close("dx again", dx, ref::numeric_gradient(f, xv));
}

TEST(GradCheck, LayerNorm) {
  LayerNorm norm = make_layer_norm(7, 1e-5f), grad = make_layer_norm(7, 1e-5f);
  zero_parameters(named_parameters(grad));
  randomize(named_parameters(norm), 2);
  const Tensor x = random_tensor({6, 7}, 20, -2.0f, 3.0f), w = random_tensor({6, 7}, 21);
  Tensor y = Tensor::empty({6, 7}), dx = Tensor::empty({6, 7});
  LayerNormCache cache;
  layer_norm_forward(norm, x, y, cache);
  layer_norm_backward(norm, x, w, dx, cache, grad);
  Params p = ref::to_params(named_parameters(norm));
  Vec xv = ref::to_vec(x);
  const Vec wv = ref::to_vec(w);
  auto f = [&] { return ref::dot(wv, ref::layer_norm(xv, 6, 7, p["weight"], p["bias"], 1e-5)); };
  expect_grad_close("dx", dx, ref::numeric_gradient(f, xv));
  check_parameters(f, p, named_parameters(grad), "layernorm");
}

class FeedForwardGrad : public ::testing::TestWithParam<std::tuple<Activation, bool>> {};

TEST_P(FeedForwardGrad, MatchesFiniteDifferences) {
  const auto [activation, training] = GetParam();
  const int64_t R = 6, E = 5, F = 9;
  FeedForward ffn = make_feed_forward(E, F, activation, true), grad = make_feed_forward(E, F, activation, true);
  NamedTensors params, grads;
  append_parameters(ffn.linear1, "linear1.", params);
  append_parameters(ffn.linear2, "linear2.", params);
  append_parameters(grad.linear1, "linear1.", grads);
  append_parameters(grad.linear2, "linear2.", grads);
  randomize(params, 3);
  const Tensor x = random_tensor({R, E}, 30, -2.0f, 2.0f), w = random_tensor({R, E}, 31);
  const DropoutArgs dropout = training ? DropoutArgs{0.3f, 77, 5} : DropoutArgs{};
  Tensor y = Tensor::empty({R, E}), dx = Tensor::empty({R, E});
  FeedForwardCache cache;
  feed_forward_forward(ffn, x, y, cache, dropout);
  feed_forward_backward(ffn, x, w, dx, cache, grad);
  Params p = ref::to_params(params);
  Vec xv = ref::to_vec(x);
  const Vec wv = ref::to_vec(w);
  auto f = [&] {
    Vec h = ref::linear(xv, R, E, p["linear1.weight"], p["linear1.bias"].data(), F);
    for (double& e : h) e = ref::act(activation, e);
    ref::dropout(h, dropout);
    return ref::dot(wv, ref::linear(h, R, F, p["linear2.weight"], p["linear2.bias"].data(), E));
  };
  expect_grad_close("dx", dx, ref::numeric_gradient(f, xv));
  check_parameters(f, p, grads, "ffn");
}

INSTANTIATE_TEST_SUITE_P(All, FeedForwardGrad,
                         ::testing::Combine(::testing::Values(Activation::kRelu, Activation::kGelu),
                                            ::testing::Bool()));

// ---------------------------------------------------------------------------------------------
// Multi-head attention: self (packed) and cross (packed with distinct inputs, or kdim ≠ E),
// every mask kind.

struct MhaCase {
  std::string name;
  int64_t B, N, M, E, H, kdim, vdim;
  bool self;
  bool key_is_value;  // cross-attention with the same tensor as key and value
  std::function<Mask()> mask;
  float dropout = 0.0f;
};

Tensor bool_tensor(const Shape& shape, uint64_t seed, float p_true) {
  Tensor u = random_tensor(shape, seed, 0.0f, 1.0f);
  Tensor t = Tensor::empty(shape, DType::BOOL);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = u.data<float>()[i] < p_true;
  return t;
}

class MhaGrad : public ::testing::TestWithParam<MhaCase> {};

TEST_P(MhaGrad, MatchesFiniteDifferences) {
  const MhaCase& c = GetParam();
  MultiHeadAttention mha = make_multi_head_attention({c.E, c.H, c.kdim, c.vdim, true});
  MultiHeadAttention grad = make_multi_head_attention({c.E, c.H, c.kdim, c.vdim, true});
  randomize(named_parameters(mha), 4);
  const Tensor query = random_tensor({c.B, c.N, c.E}, 40, -1.5f, 1.5f);
  const Tensor key = c.self ? query : random_tensor({c.B, c.M, c.kdim}, 41, -1.5f, 1.5f);
  const Tensor value = c.self ? query : c.key_is_value ? key : random_tensor({c.B, c.M, c.vdim}, 42, -1.5f, 1.5f);
  const Tensor w = random_tensor({c.B, c.N, c.E}, 43);
  AttentionInputs in{query, key, value, c.mask()};
  in.dropout = c.dropout;
  in.dropout_seed = 1234;
  in.dropout_offset = 7;
  MultiHeadAttentionCache cache;
  multi_head_attention_forward(mha, in, cache);
  const Tensor dq = Tensor::empty(query.shape());
  const Tensor dk = c.self ? dq : Tensor::empty(key.shape());
  const Tensor dv = c.self ? dq : c.key_is_value ? dk : Tensor::empty(value.shape());
  multi_head_attention_backward(mha, in, w, cache, grad, {dq, dk, dv});

  Params p = ref::to_params(named_parameters(mha));
  Vec qv = ref::to_vec(query), kv = ref::to_vec(key), vv = ref::to_vec(value);
  const Vec wv = ref::to_vec(w);
  AttentionOptions options;
  options.mask = in.mask;
  options.dropout = in.dropout;
  options.dropout_seed = in.dropout_seed;
  options.dropout_offset = in.dropout_offset;
  const ref::MhaShape shape{c.B, c.N, c.M, c.E, c.H, c.kdim, c.vdim};
  auto f = [&] {
    const Vec& k = c.self ? qv : kv;
    const Vec& v = c.self ? qv : c.key_is_value ? kv : vv;
    return ref::dot(wv, ref::mha(p, "", shape, qv, k, v, options));
  };
  expect_grad_close("dquery", dq, ref::numeric_gradient(f, qv));
  if (!c.self) expect_grad_close("dkey", dk, ref::numeric_gradient(f, kv));
  if (!c.self && !c.key_is_value) expect_grad_close("dvalue", dv, ref::numeric_gradient(f, vv));
  check_parameters(f, p, named_parameters(grad), c.name);
}

std::vector<MhaCase> mha_cases() {
  std::vector<MhaCase> cases;
  auto self = [](std::string name, std::function<Mask()> mask, float dropout = 0.0f) {
    return MhaCase{std::move(name), 2, 4, 4, 8, 2, 8, 8, true, false, std::move(mask), dropout};
  };
  auto cross = [](std::string name, int64_t kdim, int64_t vdim, std::function<Mask()> mask) {
    return MhaCase{std::move(name), 2, 3, 5, 8, 2, kdim, vdim, false, false, std::move(mask)};
  };
  cases.push_back(self("self_nomask", [] { return Mask(); }));
  cases.push_back(self("self_causal", [] { return Mask::causal(); }));
  cases.push_back(self("self_key_padding", [] { return Mask::key_padding({4, 2}); }));
  cases.push_back(self("self_sliding_window", [] { return Mask::sliding_window(1, 1); }));
  cases.push_back(self("self_allow", [] { return Mask::allow(bool_tensor({4, 4}, 50, 0.6f)); }));
  cases.push_back(self("self_additive", [] {
    Tensor bias = random_tensor({2, 1, 4, 4}, 51, -1.0f, 1.0f);
    bias.data<float>()[5] = -INFINITY;
    return Mask::additive(bias);
  }));
  cases.push_back(self("self_causal_and_padding_dropout", [] { return Mask::causal() & Mask::key_padding({3, 4}); },
                       0.25f));
  cases.push_back(cross("cross_packed_causal_bottom_right", 8, 8, [] { return Mask::causal(CausalAlign::kBottomRight); }));
  cases.push_back(cross("cross_kdim_causal_top_left", 6, 5, [] { return Mask::causal(CausalAlign::kTopLeft); }));
  cases.push_back(cross("cross_kdim_fully_masked_rows", 6, 5, [] { return Mask::key_padding({0, 3}); }));
  cases.push_back(cross("cross_kdim_allow_with_empty_row", 6, 6, [] {
    Tensor allow = bool_tensor({3, 5}, 52, 0.6f);
    for (int64_t j = 0; j < 5; ++j) allow.data<uint8_t>()[j] = 0;  // query 0 sees nothing
    return Mask::allow(allow);
  }));
  cases.push_back(cross("cross_additive_window", 6, 6, [] {
    return Mask::additive(random_tensor({3, 5}, 53, -2.0f, 2.0f)) & Mask::sliding_window(2, 0);
  }));
  MhaCase kv_same = cross("cross_key_is_value", 6, 6, [] { return Mask::key_padding({5, 4}); });
  kv_same.key_is_value = true;
  cases.push_back(kv_same);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Masks, MhaGrad, ::testing::ValuesIn(mha_cases()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Encoder layer (post/pre-norm × relu/gelu × eval/training), encoder with final norm.

struct LayerCase {
  std::string name;
  bool norm_first;
  Activation activation;
  bool training;
  std::function<Mask()> mask;
};

class EncoderLayerGrad : public ::testing::TestWithParam<LayerCase> {};

TEST_P(EncoderLayerGrad, MatchesFiniteDifferences) {
  const LayerCase& c = GetParam();
  const int64_t B = 2, N = 4, E = 8;
  EncoderLayerConfig cfg{E, 2, 12, 0.2f, c.activation, 1e-5f, c.norm_first, true};
  EncoderLayer layer = make_encoder_layer(cfg), grad = make_encoder_layer(cfg);
  zero_parameters(named_parameters(grad));
  randomize(named_parameters(layer), 5);
  const Tensor x = random_tensor({B, N, E}, 60, -1.5f, 1.5f), w = random_tensor({B, N, E}, 61);
  const Mask mask = c.mask();
  ForwardMode mode{c.training, 99, 3, 0};
  EncoderLayerCache cache;
  encoder_layer_forward(layer, x, mask, cache, mode);
  Tensor dx = Tensor::empty({B, N, E});
  encoder_layer_backward(layer, x, w, dx, cache, grad);
  Params p = ref::to_params(named_parameters(layer));
  Vec xv = ref::to_vec(x);
  const Vec wv = ref::to_vec(w);
  auto f = [&] { return ref::dot(wv, ref::encoder_layer(p, "", cfg, B, N, xv, mask, mode)); };
  expect_grad_close("dx", dx, ref::numeric_gradient(f, xv));
  check_parameters(f, p, named_parameters(grad), c.name);

  // Backward again on the same forward: the cache is not consumed. Then dx aliasing dy.
  Tensor dx2 = Tensor::empty({B, N, E});
  encoder_layer_backward(layer, x, w, dx2, cache, grad);
  expect_grad_close("dx again", dx2, ref::numeric_gradient(f, xv));
  Tensor g = w.clone();
  encoder_layer_backward(layer, x, g, g, cache, grad);
  expect_grad_close("dx in place", g, ref::numeric_gradient(f, xv));
}

INSTANTIATE_TEST_SUITE_P(
    Variants, EncoderLayerGrad,
    ::testing::Values(LayerCase{"post_relu", false, Activation::kRelu, false, [] { return Mask(); }},
                      LayerCase{"post_gelu_causal", false, Activation::kGelu, false, [] { return Mask::causal(); }},
                      LayerCase{"pre_relu_padding", true, Activation::kRelu, false,
                                [] { return Mask::key_padding({4, 2}); }},
                      LayerCase{"pre_gelu", true, Activation::kGelu, false, [] { return Mask(); }},
                      LayerCase{"post_gelu_training", false, Activation::kGelu, true, [] { return Mask::causal(); }},
                      LayerCase{"pre_relu_training", true, Activation::kRelu, true,
                                [] { return Mask::key_padding({3, 4}); }}),
    [](const auto& info) { return info.param.name; });

TEST(GradCheck, EncoderTwoLayersFinalNorm) {
  const int64_t B = 2, N = 3, E = 8, L = 2;
  for (bool norm_first : {false, true}) {
    EncoderLayerConfig cfg{E, 2, 10, 0.1f, Activation::kGelu, 1e-5f, norm_first, true};
    Encoder enc = make_encoder(cfg, L, true), grad = make_encoder(cfg, L, true);
    zero_parameters(named_parameters(grad));
    randomize(named_parameters(enc), 6);
    const Tensor x = random_tensor({B, N, E}, 70, -1.5f, 1.5f), w = random_tensor({B, N, E}, 71);
    const ForwardMode mode{true, 5, 11, 0};
    EncoderCache cache;
    encoder_forward(enc, x, Mask::causal(), cache, mode);
    Tensor dx = Tensor::empty({B, N, E});
    encoder_backward(enc, x, w, dx, cache, grad);
    Params p = ref::to_params(named_parameters(enc));
    Vec xv = ref::to_vec(x);
    const Vec wv = ref::to_vec(w);
    auto f = [&] { return ref::dot(wv, ref::encoder(p, "", cfg, L, B, N, xv, Mask::causal(), mode)); };
    expect_grad_close("dx", dx, ref::numeric_gradient(f, xv));
    check_parameters(f, p, named_parameters(grad), norm_first ? "pre" : "post");
  }
}

// ---------------------------------------------------------------------------------------------
// Embeddings and the models (with cross-entropy: ignore_index and label smoothing).

std::vector<int64_t> random_ids(int64_t n, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = rng.next_u32() % V;
  return ids;
}

Tensor id_tensor(const std::vector<int64_t>& ids, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::I64);
  std::copy(ids.begin(), ids.end(), t.data<int64_t>());
  return t;
}

TEST(GradCheck, EmbeddingScatterAddWithRepeats) {
  Embedding embed = make_embedding(5, 3), grad = make_embedding(5, 3);
  randomize(named_parameters(embed), 7);
  const std::vector<int64_t> ids = {1, 3, 1, 1, 0, 4};
  const Tensor tokens = id_tensor(ids, {2, 3});
  const Tensor w = random_tensor({6, 3}, 80);
  Tensor y = Tensor::empty({6, 3});
  embedding_forward(embed, tokens, y);
  embedding_backward(tokens, w, grad);
  Params p = ref::to_params(named_parameters(embed));
  const Vec wv = ref::to_vec(w);
  auto f = [&] {
    double s = 0;
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t c = 0; c < 3; ++c) s += wv[i * 3 + c] * p["weight"][ids[i] * 3 + c];
    return s;
  };
  check_parameters(f, p, named_parameters(grad), "embedding");
  EXPECT_THROW(embedding_forward(embed, id_tensor({0, 5}, {1, 2}), Tensor::empty({2, 3})), Error);
}

struct LmCase {
  std::string name;
  bool tie_head;
  bool norm_first;
  bool training;
  float label_smoothing;
  PositionalKind positional = PositionalKind::kLearned;
  int64_t kv_heads = 0;
};

class CausalLMGrad : public ::testing::TestWithParam<LmCase> {};

TEST_P(CausalLMGrad, MatchesFiniteDifferences) {
  const LmCase& c = GetParam();
  CausalLMConfig cfg;
  cfg.vocab_size = 11;
  cfg.max_seq_len = 6;
  cfg.d_model = 8;
  cfg.nhead = 2;
  cfg.num_layers = 2;
  cfg.dim_feedforward = 12;
  cfg.dropout = 0.15f;
  cfg.norm_first = c.norm_first;
  cfg.tie_head = c.tie_head;
  cfg.positional = c.positional;
  if (c.positional == PositionalKind::kRotary) cfg.rope = {RopeStyle::kNeox, 10000.0f, 0};
  cfg.nhead = c.kv_heads ? 4 : 2;
  cfg.num_kv_heads = c.kv_heads;
  const int64_t B = 2, T = 5;
  CausalLM model = make_causal_lm(cfg), grads = make_causal_lm(cfg);
  zero_parameters(named_parameters(grads));
  randomize(named_parameters(model), 8);
  const std::vector<int64_t> ids = random_ids(B * T, cfg.vocab_size, 90);
  std::vector<int64_t> targets = random_ids(B * T, cfg.vocab_size, 91);
  targets[3] = -100;
  targets[9] = -100;
  const ForwardMode mode{c.training, 17, 2, 0};
  const LossOptions options{-100, c.label_smoothing, true, 0.5f};
  CausalLMCache cache;
  causal_lm_forward(model, id_tensor(ids, {B, T}), cache, mode);
  const CrossEntropyResult loss = causal_lm_loss(id_tensor(targets, {B, T}), options, cache);
  EXPECT_EQ(loss.count, B * T - 2);
  causal_lm_backward(model, cache, grads);

  Params p = ref::to_params(named_parameters(model));
  auto f = [&] {
    const Vec logits = ref::causal_lm_logits(p, cfg, ids, B, T, mode);
    return 0.5 * ref::cross_entropy(logits, B * T, cfg.vocab_size, targets, -100, c.label_smoothing);
  };
  EXPECT_NEAR(0.5 * loss.loss, f(), 1e-5);
  check_parameters(f, p, named_parameters(grads), c.name);
}

INSTANTIATE_TEST_SUITE_P(Variants, CausalLMGrad,
                         ::testing::Values(LmCase{"tied_pre", true, true, false, 0.0f},
                                           LmCase{"untied_post_smoothing", false, false, false, 0.1f},
                                           LmCase{"tied_pre_training_smoothing", true, true, true, 0.2f},
                                           LmCase{"sinusoidal", true, true, false, 0.0f, PositionalKind::kSinusoidal},
                                           LmCase{"rotary", true, true, true, 0.0f, PositionalKind::kRotary},
                                           LmCase{"gqa", false, false, true, 0.0f, PositionalKind::kLearned, 2},
                                           LmCase{"mqa_rotary", true, true, false, 0.1f, PositionalKind::kRotary, 1}),
                         [](const auto& info) { return info.param.name; });

TEST(GradCheck, Classifier) {
  for (bool training : {false, true}) {
    ClassifierConfig cfg;
    cfg.vocab_size = 9;
    cfg.max_seq_len = 6;
    cfg.d_model = 8;
    cfg.nhead = 2;
    cfg.num_layers = 2;
    cfg.dim_feedforward = 10;
    cfg.dropout = 0.2f;
    cfg.num_classes = 3;
    cfg.norm_first = training;  // both variants
    const int64_t B = 3, T = 5;
    Classifier model = make_classifier(cfg), grads = make_classifier(cfg);
    zero_parameters(named_parameters(grads));
    randomize(named_parameters(model), 9);
    const std::vector<int64_t> ids = random_ids(B * T, cfg.vocab_size, 100);
    const std::vector<int64_t> lengths = {5, 2, 3};
    const std::vector<int64_t> labels = {2, 0, 1};
    const ForwardMode mode{training, 3, 4, 0};
    ClassifierCache cache;
    classifier_forward(model, id_tensor(ids, {B, T}), lengths, cache, mode);
    const LossOptions options{-100, 0.1f, true, 1.0f};
    const CrossEntropyResult loss = classifier_loss(id_tensor(labels, {B}), options, cache);
    classifier_backward(model, cache, grads);
    Params p = ref::to_params(named_parameters(model));
    auto f = [&] {
      return ref::cross_entropy(ref::classifier_logits(p, cfg, ids, lengths, B, T, mode), B, 3, labels, -100, 0.1);
    };
    EXPECT_NEAR(loss.loss, f(), 1e-5);
    check_parameters(f, p, named_parameters(grads), training ? "training" : "eval");
  }
}

}  // namespace
}  // namespace cabm
