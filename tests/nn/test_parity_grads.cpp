// Gradient parity with PyTorch autograd: tests/fixtures/make_grads.py writes inputs, weights,
// the output gradient (or a loss), outputs and every input and parameter gradient for
// MultiheadAttention, TransformerEncoderLayer, TransformerEncoder and the twins of the causal
// LM and the classifier; cabm runs its forward and backward on the same data.
//
// Loading a case also checks the parameter NAMES: every cabm parameter must be in the file as
// `param.<name>` and every file parameter must be a cabm parameter.
//
// Tolerance. Both sides compute in float32 (eps = 1.2e-7) with different summation orders and
// kernels (cabm: blocked flash attention, oneDNN GEMM; PyTorch: its own). Each gradient
// element is a sum of at most a few hundred products carried through ~10 ops per layer, so
// the two results differ by O(sqrt(K)·depth·eps) of the tensor's scale, K ≈ 500: a few 1e-6
// of max|g| (measured on these cases: at most 1.0e-6). We require, per tensor,
//   max |cabm − torch| <= kTol · max(max |torch|, kFloor),  kTol = 1e-5 (10× the measured worst),
// with kFloor = 1e-3 so tensors of tiny gradients are judged on an absolute scale. A wrong
// term (missing LayerNorm mean term, wrong mask alignment, unaccumulated tied gradient) shows
// up at O(1) of the scale.
#include "cabm/io/safetensors.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/classifier.h"
#include "cabm/nn/encoder.h"
#include "cabm/nn/parameters.h"
#include "util/attention_cases.h"
#include "util/test_util.h"

#include <cmath>
#include <filesystem>
#include <set>

namespace cabm {
namespace {

constexpr double kTol = 1e-5;
constexpr double kFloor = 1e-3;

SafetensorsFile load(const std::string& name) {
  const std::string path = test::fixtures_dir() + "/grads/" + name + ".safetensors";
  if (!std::filesystem::exists(path)) throw Error("missing fixture " + path + " (run ctest: fixtures_grads)");
  return read_safetensors(path);
}

int64_t meta_int(const SafetensorsFile& f, const std::string& key) {
  return std::stoll(f.get_metadata(key));
}
float meta_float(const SafetensorsFile& f, const std::string& key) {
  return std::stof(f.get_metadata(key));
}
bool meta_bool(const SafetensorsFile& f, const std::string& key) {
  return f.get_metadata(key) == "true";
}

// The tolerance of a comparison: |cabm − torch| <= tol · max(max |torch|, floor).
struct Bounds {
  double tol = kTol;
  double floor = kFloor;
};

void expect_matches(const std::string& what, const Tensor& actual, const Tensor& expected, Bounds bounds = {}) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::vector<float> a = actual.to_vector(), e = expected.to_vector();
  double scale = bounds.floor, worst = 0;
  size_t at = 0;
  for (float v : e) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(a[i]) - e[i]);
    if (!(diff <= worst)) worst = diff, at = i;
  }
  EXPECT_LE(worst, bounds.tol * scale) << what << ": worst at " << at << ": cabm " << a[at] << " torch " << e[at]
                                       << " (scale " << scale << ", relative " << worst / scale << ")";
}

// Copies `param.<name>` into every parameter; the two name sets must be equal.
void load_parameters(const NamedTensors& params, const SafetensorsFile& f) {
  std::set<std::string> in_file;
  for (const auto& [name, t] : f.tensors)
    if (name.starts_with("param.")) in_file.insert(name.substr(6));
  std::set<std::string> ours;
  for (const NamedTensor& p : params) {
    ours.insert(p.name);
    const Tensor* t = f.find("param." + p.name);
    ASSERT_NE(t, nullptr) << "cabm parameter " << p.name << " is not in the PyTorch state_dict";
    ASSERT_EQ(t->shape(), p.tensor.shape()) << p.name;
    Tensor dst = p.tensor;
    dst.copy_from(*t);
  }
  EXPECT_EQ(ours, in_file) << "parameter names differ from PyTorch's state_dict";
}

void expect_gradients(const NamedTensors& grads, const SafetensorsFile& f, const std::string& context, Bounds bounds) {
  for (const NamedTensor& g : grads)
    expect_matches(context + " grad " + g.name, g.tensor, f.get("grad.param." + g.name), bounds);
}

Mask mask_of(const SafetensorsFile& f) {
  Mask mask;
  if (const std::string* causal = f.find_metadata("causal"); causal && *causal == "true") mask = mask & Mask::causal();
  if (const Tensor* additive = f.find("mask.additive")) mask = mask & Mask::additive(*additive);
  if (const Tensor* blocked = f.find("mask.blocked")) {
    Tensor allow = Tensor::empty(blocked->shape(), DType::BOOL);
    for (int64_t i = 0; i < allow.numel(); ++i) allow.data<uint8_t>()[i] = !blocked->data<uint8_t>()[i];
    mask = mask & Mask::allow(allow);
  }
  if (const Tensor* lengths = f.find("in.lengths")) {
    const int64_t* p = lengths->data<int64_t>();
    mask = mask & Mask::key_padding(std::vector<int64_t>(p, p + lengths->numel()));
  }
  return mask;
}

EncoderLayerConfig layer_config(const SafetensorsFile& f) {
  EncoderLayerConfig c;
  c.d_model = meta_int(f, "d_model");
  c.nhead = meta_int(f, "nhead");
  c.dim_feedforward = meta_int(f, "dim_feedforward");
  c.dropout = 0.0f;
  c.activation = f.get_metadata("activation") == "gelu" ? Activation::kGelu : Activation::kRelu;
  c.layer_norm_eps = meta_float(f, "layer_norm_eps");
  c.norm_first = meta_bool(f, "norm_first");
  return c;
}

void check_mha(const SafetensorsFile& f, const std::string& name, Bounds bounds = {}) {
  const Tensor& query = f.get("in.query");
  const int64_t E = query.size(2);
  const bool self = meta_bool(f, "self");
  const MultiHeadAttentionConfig cfg{E, meta_int(f, "nhead"), meta_int(f, "kdim"), meta_int(f, "vdim"), true};
  MultiHeadAttention mha = make_multi_head_attention(cfg), grads = make_multi_head_attention(cfg);
  load_parameters(named_parameters(mha), f);
  zero_parameters(named_parameters(grads));
  const Tensor key = self ? query : f.get("in.key"), value = self ? query : f.get("in.value");
  AttentionInputs in{query, key, value, mask_of(f)};
  MultiHeadAttentionCache cache;
  expect_matches("output", multi_head_attention_forward(mha, in, cache), f.get("out.output"), bounds);
  const Tensor dq = Tensor::empty(query.shape());
  const Tensor dk = self ? dq : Tensor::empty(key.shape()), dv = self ? dq : Tensor::empty(value.shape());
  multi_head_attention_backward(mha, in, f.get("dout"), cache, grads, {dq, dk, dv});
  expect_matches("grad query", dq, f.get("grad.in.query"), bounds);
  if (!self) {
    expect_matches("grad key", dk, f.get("grad.in.key"), bounds);
    expect_matches("grad value", dv, f.get("grad.in.value"), bounds);
  }
  expect_gradients(named_parameters(grads), f, name, bounds);
}

class MhaParity : public ::testing::TestWithParam<std::string> {};

TEST_P(MhaParity, GradientsMatchPyTorch) {
  check_mha(load(GetParam()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, MhaParity,
                         ::testing::Values("mha_self_causal", "mha_self_padding", "mha_cross_packed_blocked",
                                           "mha_cross_kdim_additive_padding"));

void check_encoder(const SafetensorsFile& f, const std::string& name, Bounds bounds = {}) {
  const EncoderLayerConfig cfg = layer_config(f);
  const Tensor& src = f.get("in.src");
  const Mask mask = mask_of(f);
  Tensor dx = Tensor::empty(src.shape());
  if (f.get_metadata("module") == "TransformerEncoderLayer") {
    EncoderLayer layer = make_encoder_layer(cfg), grads = make_encoder_layer(cfg);
    load_parameters(named_parameters(layer), f);
    zero_parameters(named_parameters(grads));
    EncoderLayerCache cache;
    expect_matches("output", encoder_layer_forward(layer, src, mask, cache), f.get("out.output"), bounds);
    encoder_layer_backward(layer, src, f.get("dout"), dx, cache, grads);
    expect_gradients(named_parameters(grads), f, name, bounds);
  } else {
    Encoder enc = make_encoder(cfg, meta_int(f, "num_layers"), true);
    Encoder grads = make_encoder(cfg, meta_int(f, "num_layers"), true);
    load_parameters(named_parameters(enc), f);
    zero_parameters(named_parameters(grads));
    EncoderCache cache;
    expect_matches("output", encoder_forward(enc, src, mask, cache), f.get("out.output"), bounds);
    encoder_backward(enc, src, f.get("dout"), dx, cache, grads);
    expect_gradients(named_parameters(grads), f, name, bounds);
  }
  expect_matches("grad src", dx, f.get("grad.in.src"), bounds);
}

class EncoderParity : public ::testing::TestWithParam<std::string> {};

TEST_P(EncoderParity, GradientsMatchPyTorch) {
  check_encoder(load(GetParam()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, EncoderParity,
                         ::testing::Values("layer_post_relu_causal", "layer_pre_gelu_padding",
                                           "layer_post_gelu_additive", "layer_pre_relu_nomask",
                                           "encoder_post_relu_padding", "encoder_pre_gelu_causal"));

void check_causal_lm(const SafetensorsFile& f, const std::string& name, Bounds bounds = {}) {
  const EncoderLayerConfig lc = layer_config(f);
  CausalLMConfig cfg;
  cfg.vocab_size = meta_int(f, "vocab_size");
  cfg.max_seq_len = meta_int(f, "max_seq_len");
  cfg.d_model = lc.d_model;
  cfg.nhead = lc.nhead;
  cfg.num_layers = meta_int(f, "num_layers");
  cfg.dim_feedforward = lc.dim_feedforward;
  cfg.dropout = 0.0f;
  cfg.activation = lc.activation;
  cfg.norm_first = lc.norm_first;
  cfg.layer_norm_eps = lc.layer_norm_eps;
  cfg.tie_head = meta_bool(f, "tie_head");
  CausalLM model = make_causal_lm(cfg), grads = make_causal_lm(cfg);
  load_parameters(named_parameters(model), f);
  zero_parameters(named_parameters(grads));
  CausalLMCache cache;
  // Training mode with dropout 0 (the path a training step takes).
  expect_matches("logits", causal_lm_forward(model, f.get("in.tokens"), cache, {true, 1, 1}), f.get("out.output"),
                 bounds);
  LossOptions options;
  options.ignore_index = meta_int(f, "ignore_index");
  options.label_smoothing = meta_float(f, "label_smoothing");
  const CrossEntropyResult loss = causal_lm_loss(f.get("in.targets"), options, cache);
  EXPECT_NEAR(loss.loss, f.get("out.loss").data<float>()[0], 1e-5);
  causal_lm_backward(model, cache, grads);
  expect_gradients(named_parameters(grads), f, name, bounds);
}

class CausalLMParity : public ::testing::TestWithParam<std::string> {};

TEST_P(CausalLMParity, LossAndGradientsMatchPyTorch) {
  check_causal_lm(load(GetParam()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, CausalLMParity, ::testing::Values("lm_tied_pre_gelu", "lm_untied_post_relu_smoothing"));

void check_classifier(const SafetensorsFile& f, const std::string& name, Bounds bounds = {}) {
  const EncoderLayerConfig lc = layer_config(f);
  ClassifierConfig cfg;
  cfg.vocab_size = meta_int(f, "vocab_size");
  cfg.max_seq_len = meta_int(f, "max_seq_len");
  cfg.d_model = lc.d_model;
  cfg.nhead = lc.nhead;
  cfg.num_layers = meta_int(f, "num_layers");
  cfg.dim_feedforward = lc.dim_feedforward;
  cfg.dropout = 0.0f;
  cfg.activation = lc.activation;
  cfg.norm_first = lc.norm_first;
  cfg.layer_norm_eps = lc.layer_norm_eps;
  cfg.num_classes = meta_int(f, "num_classes");
  Classifier model = make_classifier(cfg), grads = make_classifier(cfg);
  load_parameters(named_parameters(model), f);
  zero_parameters(named_parameters(grads));
  const Tensor& lengths_t = f.get("in.lengths");
  const std::vector<int64_t> lengths(lengths_t.data<int64_t>(), lengths_t.data<int64_t>() + lengths_t.numel());
  ClassifierCache cache;
  expect_matches("logits", classifier_forward(model, f.get("in.tokens"), lengths, cache), f.get("out.output"), bounds);
  LossOptions options;
  options.label_smoothing = meta_float(f, "label_smoothing");
  const CrossEntropyResult loss = classifier_loss(f.get("in.labels"), options, cache);
  EXPECT_NEAR(loss.loss, f.get("out.loss").data<float>()[0], 1e-5);
  classifier_backward(model, cache, grads);
  expect_gradients(named_parameters(grads), f, name, bounds);
}

class ClassifierParity : public ::testing::TestWithParam<std::string> {};

TEST_P(ClassifierParity, LossAndGradientsMatchPyTorch) {
  check_classifier(load(GetParam()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, ClassifierParity, ::testing::Values("classifier_post_relu", "classifier_pre_gelu"));

// make_grads.py's random_<k> cases (CABM_GRADS_CASES, CABM_GRADS_SEED): modules of every kind
// above with random shapes (E = H·d >= 4 with d 1-12, N and M 1-40, kdim/vdim 1-20), masks, key
// padding, layer counts, activations, norm placement, tied or untied heads, ignored targets and
// label smoothing, computed by PyTorch in float64.
//
// Their tolerance is kRandomTol = 1e-4, not kTol: random shapes meet ill-conditioned rows that
// the fixed cases do not (a LayerNorm over 4 features two of which are nearly equal, a ReLU input
// within rounding of 0), where float32 itself lands 1e-5 from float64; the worst seen over 2,700
// cases was 2.3e-5. Their floor is also 1% of the case's largest gradient (kCaseShare): where
// every query row sees one key (M 1, T 1, or key padding down to one key), the true dQ and dK are
// exactly 0; PyTorch's softmax backward P ∘ (dP − rowsum(P ∘ dP)) cancels exactly there, while
// cabm's flash backward, whose D = rowsum(dO ∘ O) sums the same products in another order,
// leaves ~1e-7 of the rows' scale (up to 2e-7 seen): above kRandomTol · kFloor = 1e-7 at times,
// far below kRandomTol times 1% of the case's largest gradient.
constexpr double kRandomTol = 1e-4;
constexpr double kCaseShare = 1e-2;

double case_floor(const SafetensorsFile& f) {
  double largest = 0;
  for (const auto& [name, t] : f.tensors)
    if (name.starts_with("grad.")) largest = std::max(largest, test::max_abs(t));
  return std::max(kFloor, kCaseShare * largest);
}

TEST(RandomParity, EveryRandomCaseMatchesPyTorchInFloat64) {
  int cases = 0;
  for (;; ++cases) {
    const std::string name = "random_" + std::to_string(cases);
    if (!std::filesystem::exists(test::fixtures_dir() + "/grads/" + name + ".safetensors")) break;
    const SafetensorsFile f = load(name);
    const std::string& module = f.get_metadata("module");
    SCOPED_TRACE(name + ": " + module);
    const Bounds bounds{kRandomTol, case_floor(f)};
    if (module == "MultiheadAttention") {
      check_mha(f, name, bounds);
    } else if (module == "TransformerEncoderLayer" || module == "TransformerEncoder") {
      check_encoder(f, name, bounds);
    } else if (module == "CausalLM") {
      check_causal_lm(f, name, bounds);
    } else if (module == "Classifier") {
      check_classifier(f, name, bounds);
    } else {
      FAIL() << name << ": unknown module " << module;
    }
  }
  EXPECT_GT(cases, 0) << "no random_0 case in " << test::fixtures_dir() << "/grads";
  std::printf("%d random cases\n", cases);
}

}  // namespace
}  // namespace cabm
