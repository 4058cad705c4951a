// encoder_layer_infer (cabm/nn/encoder_inference.h) against encoder_layer_forward in eval mode:
// the same numbers up to float rounding, for both activations, with and without key padding, in
// fp32 and bf16, over a sequence of shapes that one workspace serves; and that workspace keeps
// its buffers when a smaller batch follows a larger one (no fresh memory per batch).
#include "cabm/nn/encoder_inference.h"
#include "cabm/nn/mixed_precision.h"
#include "cabm/nn/parameters.h"
#include "util/test_util.h"

#include <cmath>

namespace cabm {
namespace {

constexpr int64_t kE = 32, kH = 4, kF = 48;

// Every parameter random (biases and LayerNorm affines too, which PyTorch's init leaves 0 and 1).
EncoderLayer random_layer(Activation activation, uint64_t seed) {
  EncoderLayerConfig config;
  config.d_model = kE;
  config.nhead = kH;
  config.dim_feedforward = kF;
  config.dropout = 0.0f;
  config.activation = activation;
  EncoderLayer layer = make_encoder_layer(config);
  for (const auto& p : named_parameters(layer)) {
    Tensor t = p.tensor;
    t.copy_from(test::random_tensor(t.shape(), seed++, -0.5f, 0.5f));
  }
  return layer;
}

Mask padding_of(int64_t B, int64_t N, bool padded) {
  if (!padded) return Mask();
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < B; ++b) lengths.push_back(std::max<int64_t>(1, N - 2 * b));
  return Mask::key_padding(lengths);
}

struct Case {
  Activation activation;
  Precision precision;
  bool padded;
};

class EncoderInference : public ::testing::TestWithParam<Case> {};

TEST_P(EncoderInference, MatchesEncoderLayerForward) {
  const Case c = GetParam();
  EncoderLayer layer = random_layer(c.activation, 7);
  set_precision(layer, c.precision);
  // fp32: the two paths differ only in where a bias is added and in the order of LayerNorm's
  // double sums, a few float roundings of values of order 1. bf16: such a difference can move
  // an operand across a bf16 rounding boundary (2^-8 relative) inside the layer.
  const double tol = c.precision == Precision::kFp32 ? 2e-6 : 2e-2;
  EncoderInferenceWorkspace ws;
  const Shape shapes[] = {{3, 11, kE}, {2, 5, kE}, {3, 11, kE}, {1, 1, kE}, {4, 13, kE}};
  uint64_t seed = 100;
  for (const Shape& shape : shapes) {
    const Tensor x = test::random_tensor(shape, seed++);
    const Mask mask = padding_of(shape[0], shape[1], c.padded);
    EncoderLayerCache cache;
    const Tensor expected = encoder_layer_forward(layer, x, mask, cache).clone();
    const Tensor y = x.clone();
    encoder_layer_infer(layer, y, mask, ws);
    EXPECT_CLOSE(y, expected, tol, tol);
  }
}

INSTANTIATE_TEST_SUITE_P(All, EncoderInference,
                         ::testing::Values(Case{Activation::kGelu, Precision::kFp32, false},
                                           Case{Activation::kGelu, Precision::kFp32, true},
                                           Case{Activation::kRelu, Precision::kFp32, true},
                                           Case{Activation::kGelu, Precision::kBf16, true},
                                           Case{Activation::kRelu, Precision::kBf16, false}));

// 0.5·v·(1 + tanh(√(2/π)·(v + 0.044715·v³))) in double.
float gelu_tanh_double(float v) {
  const double x = v;
  return static_cast<float>(0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))));
}

// y = LN(a + b), a and b [rows, E].
Tensor add_then_norm(const LayerNorm& norm, const Tensor& a, const Tensor& b) {
  Tensor sum = a.clone(), y = Tensor::empty(a.shape());
  for (int64_t i = 0; i < sum.numel(); ++i) sum.data<float>()[i] += b.data<float>()[i];
  LayerNormCache cache;
  layer_norm_forward(norm, sum, y, cache);
  return y;
}

TEST(EncoderInference, GeluTanhAsWritten) {
  // The post-norm layer from its modules, with the tanh GELU evaluated per element in double.
  const EncoderLayer layer = random_layer(Activation::kGelu, 3);
  const Tensor x = test::random_tensor({2, 6, kE}, 9, -2.0f, 2.0f);
  MultiHeadAttentionCache attn;
  const Tensor& a = multi_head_attention_forward(layer.self_attn, AttentionInputs{x, x, x, Mask()}, attn);
  const Tensor h = add_then_norm(layer.norm1, as_rows(x), as_rows(a));
  Tensor hidden = Tensor::empty({h.size(0), kF}), branch = Tensor::empty(h.shape());
  linear_forward(layer.ffn.linear1, h, hidden);
  for (int64_t i = 0; i < hidden.numel(); ++i) hidden.data<float>()[i] = gelu_tanh_double(hidden.data<float>()[i]);
  linear_forward(layer.ffn.linear2, hidden, branch);
  const Tensor expected = add_then_norm(layer.norm2, h, branch);

  EncoderInferenceWorkspace ws;
  const Tensor y = x.clone();
  encoder_layer_infer(layer, y, Mask(), ws, InferenceActivation::kGeluTanh);
  EXPECT_CLOSE(as_rows(y), expected, 1e-5, 1e-5);
  // And it is not the erf GELU's result.
  const Tensor erf = x.clone();
  encoder_layer_infer(layer, erf, Mask(), ws);
  EXPECT_GT(test::rel_diff(erf, y), 1e-5);
}

TEST(EncoderInferenceWorkspace, SmallerBatchesReuseTheBuffers) {
  const EncoderLayer layer = random_layer(Activation::kGelu, 11);
  EncoderInferenceWorkspace ws;
  encoder_layer_infer(layer, test::random_tensor({4, 16, kE}, 1), Mask(), ws);
  const void* buffers[] = {ws.h.raw_data(),        ws.branch.raw_data(),    ws.hidden.raw_data(),
                           ws.attn.qkv.raw_data(), ws.attn.attn.raw_data(), ws.attn.lse.raw_data()};
  for (const Shape& shape : {Shape{3, 9, kE}, Shape{4, 16, kE}, Shape{1, 2, kE}}) {
    encoder_layer_infer(layer, test::random_tensor(shape, 2), padding_of(shape[0], shape[1], true), ws);
    const void* now[] = {ws.h.raw_data(),        ws.branch.raw_data(),    ws.hidden.raw_data(),
                         ws.attn.qkv.raw_data(), ws.attn.attn.raw_data(), ws.attn.lse.raw_data()};
    for (size_t i = 0; i < std::size(buffers); ++i) EXPECT_EQ(now[i], buffers[i]) << "buffer " << i;
  }
}

TEST(EncoderInferenceWorkspace, RefusesPreNormLayers) {
  EncoderLayerConfig config{kE, kH, kF, 0.0f, Activation::kRelu, 1e-5f, /*norm_first=*/true};
  const EncoderLayer layer = make_encoder_layer(config);
  EncoderInferenceWorkspace ws;
  EXPECT_NE(test::error_of([&] { encoder_layer_infer(layer, Tensor::zeros({1, 2, kE}), Mask(), ws); }), "");
}

}  // namespace
}  // namespace cabm
