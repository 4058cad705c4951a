// bf16 mixed precision in the modules (cabm/nn/mixed_precision.h) against their fp32 paths.
//
// Tolerances come from bf16's unit roundoff u = 2^-8 (8 significant bits: 7 stored + the implicit
// one; round to nearest, so |fl(x) − x| <= u|x|; machine epsilon is 2^-7) and
// the operands, never from tuned constants:
//
// * Linear (exact bounds). Rounding x and W changes each product term by at most (2u + u²)|x||w|,
//   and fp32 summation of K terms adds at most γ_K = K·2^-24 of Σ|terms| to each result, so
//       |y_bf16 − y_fp32| <= ((2u + u²) + 2γ_K)·(|x||W|ᵀ + |b|)   element by element,
//   and likewise for dx = dy·W and dW = dyᵀ·x. Tighter still, y_bf16 must equal the fp32 product
//   of the explicitly rounded operands up to 2γ_K: that pins down which operands are rounded.
// * Composite modules (first-order, normwise). Each bf16 product on the path from an input to an
//   output rounds its two operands (and attention also rounds Q, K, V and P): at most 3u of
//   relative perturbation per product stage measured in the |A||B| norm. Softmax rows and
//   LayerNorm are normalisations (gain about 1), residual adds do not amplify, so to first order
//       ||out_bf16 − out_fp32|| / ||out_fp32|| <= S·3u·κ,
//   S the number of bf16 product stages on the longest path and κ = ||·|A||B|·|| / ||A·B||, the
//   cancellation factor of the data, measured below on the module's first product.
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/gemm.h"
#include "cabm/nn/bf16_util.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/feed_forward.h"
#include "cabm/nn/init.h"
#include "cabm/nn/mixed_precision.h"
#include "cabm/nn/parameters.h"
#include "util/test_util.h"

#include <cmath>

namespace cabm {
namespace {

// rounded_dtype() pinned for a scope (the tests' hook, cabm/nn/bf16_util.h).
class PinnedRoundedForm {
 public:
  explicit PinnedRoundedForm(DType form) { detail::set_rounded_dtype_override(form); }
  ~PinnedRoundedForm() { detail::set_rounded_dtype_override(std::nullopt); }
  PinnedRoundedForm(const PinnedRoundedForm&) = delete;
  PinnedRoundedForm& operator=(const PinnedRoundedForm&) = delete;
};

constexpr double kU = 1.0 / 256;         // bf16 unit roundoff 2^-8
constexpr double kU32 = 1.0 / 16777216;  // fp32 unit roundoff 2^-24

Tensor abs_of(const Tensor& t) {
  Tensor a = t.contiguous().clone();
  for (float* p = a.data<float>(); p != a.data<float>() + a.numel(); ++p) *p = std::fabs(*p);
  return a;
}

// c[M, N] = op(a)·op(b) in double accumulation (the oracle), fp32 tensors.
Tensor product(const Tensor& a, bool ta, const Tensor& b, bool tb) {
  const int64_t M = ta ? a.size(1) : a.size(0), K = ta ? a.size(0) : a.size(1), N = tb ? b.size(0) : b.size(1);
  Tensor c = Tensor::zeros({M, N});
  gemm_reference({a.data<float>(), M, K, a.stride(0), ta}, {b.data<float>(), K, N, b.stride(0), tb}, c.data<float>(),
                 N);
  return c;
}

Tensor rounded_f32(const Tensor& t) {
  Tensor b = Tensor::empty(t.shape(), DType::BF16), f = Tensor::empty(t.shape());
  round_to_bf16(t, b);
  widen_from_bf16(b, f);
  return f;
}

// |actual − expected| <= factor·magnitude (+ tiny) element by element.
void expect_within(const Tensor& actual, const Tensor& expected, const Tensor& magnitude, double factor,
                   const char* what) {
  const std::vector<float> a = actual.to_vector(), e = expected.to_vector(), m = magnitude.to_vector();
  ASSERT_EQ(a.size(), e.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double bound = factor * m[i] + 1e-30;
    worst = std::max(worst, std::fabs(double(a[i]) - e[i]) / bound);
    if (std::fabs(double(a[i]) - e[i]) > bound) {
      ADD_FAILURE() << what << ": index " << i << ": " << a[i] << " vs " << e[i] << ", bound " << bound;
      return;
    }
  }
  ::testing::Test::RecordProperty(what, std::to_string(worst));
}

using test::rel_diff;

// Records measured/allowed in the test's XML output (--gtest_output=xml), to see the margins.
void record(const std::string& what, double measured, double allowed) {
  ::testing::Test::RecordProperty(what, std::to_string(measured / allowed));
}

double frobenius(const Tensor& t) {
  double s = 0;
  for (float v : t.to_vector()) s += double(v) * v;
  return std::sqrt(s);
}

// κ = || |x||W|ᵀ || / || x Wᵀ || of a [rows, in] input and an [out, in] weight.
double cancellation(const Tensor& x, const Tensor& w) {
  return frobenius(product(abs_of(x), false, abs_of(w), true)) / frobenius(product(x, false, w, true));
}

TEST(MixedPrecision, LinearForwardBackwardBounds) {
  const int64_t rows = 37, in = 29, out = 19;
  Linear fp32 = make_linear(in, out, true);
  fp32.weight.copy_from(test::random_tensor({out, in}, 1, -0.3f, 0.3f));
  fp32.bias.copy_from(test::random_tensor({out}, 2));
  Linear bf16 = fp32;  // shares the fp32 weights; only the copy differs
  set_precision(bf16, Precision::kBf16);
  ASSERT_TRUE(bf16.weight_bf16.defined());
  const Tensor x = test::random_tensor({rows, in}, 3), dy = test::random_tensor({rows, out}, 4);

  Tensor y32 = Tensor::empty({rows, out}), y16 = Tensor::empty({rows, out});
  linear_forward(fp32, x, y32);
  linear_forward(bf16, x, y16);
  Tensor magnitude = product(abs_of(x), false, abs_of(fp32.weight), true);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < out; ++c) magnitude.data<float>()[r * out + c] += std::fabs(fp32.bias.data<float>()[c]);
  const double g_in = double(in + 1) * kU32;
  expect_within(y16, y32, magnitude, 2 * kU + kU * kU + 2 * g_in, "forward vs fp32");
  EXPECT_GT(rel_diff(y16, y32), 0.0) << "the bf16 path did not run";
  // Which operands are rounded: y_bf16 = bf16(x)·bf16(W)ᵀ + b up to fp32 summation order.
  Tensor emulated = product(rounded_f32(x), false, rounded_f32(fp32.weight), true);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < out; ++c) emulated.data<float>()[r * out + c] += fp32.bias.data<float>()[c];
  expect_within(y16, emulated, magnitude, 2 * g_in, "forward vs emulation");

  Linear g32 = make_linear(in, out, true), g16 = make_linear(in, out, true);
  Tensor dx32 = Tensor::empty({rows, in}), dx16 = Tensor::empty({rows, in});
  linear_backward(fp32, x, dy, dx32, g32);
  linear_backward(bf16, x, dy, dx16, g16);
  const double g_out = double(out) * kU32, g_rows = double(rows) * kU32;
  expect_within(dx16, dx32, product(abs_of(dy), false, abs_of(fp32.weight), false), 2 * kU + kU * kU + 2 * g_out,
                "dx vs fp32");
  expect_within(g16.weight, g32.weight, product(abs_of(dy), true, abs_of(x), false), 2 * kU + kU * kU + 2 * g_rows,
                "dW vs fp32");
  expect_within(g16.weight, product(rounded_f32(dy), true, rounded_f32(x), false),
                product(abs_of(dy), true, abs_of(x), false), 2 * g_rows, "dW vs emulation");
  EXPECT_EQ(g16.bias.to_vector(), g32.bias.to_vector());  // db is an fp32 reduction in both

  // dW accumulates (beta = 1) in fp32: a second backward doubles it.
  const std::vector<float> once = g16.weight.to_vector();
  linear_backward(bf16, x, dy, dx16, g16);
  const std::vector<float> twice = g16.weight.to_vector();
  for (size_t i = 0; i < once.size(); ++i) ASSERT_NEAR(twice[i], 2 * once[i], 4 * kU32 * std::fabs(once[i]) + 1e-12);

  // The copy follows the weight only when refreshed.
  fp32.weight.fill(0.5f);
  refresh_bf16_weights(bf16);
  for (float v : bf16.weight_bf16.to_vector()) ASSERT_EQ(v, 0.5f);
  set_precision(bf16, Precision::kFp32);
  EXPECT_FALSE(bf16.weight_bf16.defined());
}

// The bf16 input a forward keeps (linear_forward's x_bf16) is x rounded, and a backward handed it
// (x itself undefined, as a bf16 FFN's hidden layer) gives the gradients of the backward that
// rounds x itself, bit for bit; an fp32 layer releases it; a kept copy that does not fit the
// layer is an error naming it. Odd sizes, with and without bias.
TEST(MixedPrecision, LinearKeptBf16Input) {
  for (const DType form : {DType::BF16, DType::F32})
    for (const bool bias : {true, false}) {
      SCOPED_TRACE(testing::Message() << dtype_name(form) << " bias " << bias);
      const PinnedRoundedForm pinned(form);
      const int64_t rows = 23 + bias, in = 17, out = 9 + 2 * bias;
      Linear fp32 = make_linear(in, out, bias);
      fp32.weight.copy_from(test::random_tensor({out, in}, 5, -0.3f, 0.3f));
      Linear bf16 = fp32;
      set_precision(bf16, Precision::kBf16);
      ASSERT_EQ(bf16.weight_bf16.dtype(), form);  // the weight's copy takes the same form
      EXPECT_EQ(bf16.weight_bf16.to_vector(), rounded_f32(fp32.weight).to_vector());
      const Tensor x = test::random_tensor({rows, in}, 6), dy = test::random_tensor({rows, out}, 7);
      Tensor y_plain = Tensor::empty({rows, out}), y_kept = Tensor::empty({rows, out}), kept;
      linear_forward(bf16, x, y_plain);
      linear_forward(bf16, x, y_kept, &kept);
      EXPECT_EQ(y_kept.to_vector(), y_plain.to_vector());
      ASSERT_EQ(kept.dtype(), form);
      ASSERT_EQ(kept.shape(), (Shape{rows, in}));
      Tensor widened = kept;
      if (form == DType::BF16) {
        widened = Tensor::empty({rows, in});
        widen_from_bf16(kept, widened);
      }
      EXPECT_EQ(widened.to_vector(), rounded_f32(x).to_vector());

      Linear g_plain = make_linear(in, out, bias), g_kept = make_linear(in, out, bias);
      Tensor dx_plain = Tensor::empty({rows, in}), dx_kept = Tensor::empty({rows, in});
      linear_backward(bf16, x, dy, dx_plain, g_plain);
      linear_backward(bf16, Tensor(), dy, dx_kept, g_kept, false, &kept);
      EXPECT_EQ(dx_kept.to_vector(), dx_plain.to_vector());
      EXPECT_EQ(g_kept.weight.to_vector(), g_plain.weight.to_vector());
      if (bias) {
        EXPECT_EQ(g_kept.bias.to_vector(), g_plain.bias.to_vector());
      }

      Tensor wrong = Tensor::zeros({rows, in + 1}, DType::BF16);
      EXPECT_NE(test::error_of([&] {
                  linear_backward(bf16, Tensor(), dy, dx_kept, g_kept, false, &wrong);
                }).find("kept bf16 input"),
                std::string::npos);
      EXPECT_NE(test::error_of([&] {
                  linear_backward(fp32, Tensor(), dy, dx_kept, g_kept, false, &kept);
                }).find("no bf16 weight"),
                std::string::npos);
      linear_forward(fp32, x, y_plain, &kept);
      EXPECT_FALSE(kept.defined());
    }
}

// The bf16 feed-forward layer writes its hidden layer and dpre as bf16 straight from the
// activation passes (without dropout): the same bits as the unfused composition of
// linear_forward, bias_activation_forward, dropout and linear_backward on fp32 buffers.
TEST(MixedPrecision, FeedForwardFusedRoundingMatchesComposition) {
  for (const bool bias : {true, false})
    for (Activation act : {Activation::kRelu, Activation::kGelu})
      for (const float p : {0.0f, 0.3f}) {
        SCOPED_TRACE(testing::Message() << "bias " << bias << " act " << int(act) << " dropout " << p);
        const int64_t rows = 29, E = 24, F = 61;
        FeedForward ffn = make_feed_forward(E, F, act, bias);
        ffn.linear1.weight.copy_from(test::random_tensor({F, E}, 21, -0.4f, 0.4f));
        ffn.linear2.weight.copy_from(test::random_tensor({E, F}, 22, -0.3f, 0.3f));
        if (bias) {
          ffn.linear1.bias.copy_from(test::random_tensor({F}, 23, -0.5f, 0.5f));
          ffn.linear2.bias.copy_from(test::random_tensor({E}, 24, -0.5f, 0.5f));
        }
        set_precision(ffn.linear1, Precision::kBf16);
        set_precision(ffn.linear2, Precision::kBf16);
        const Tensor x = test::random_tensor({rows, E}, 25), dy = test::random_tensor({rows, E}, 26);
        const DropoutArgs dropout{p, 7, 3};

        FeedForwardCache cache;
        Tensor y = Tensor::empty({rows, E}), dx = Tensor::empty({rows, E});
        FeedForward grads = make_feed_forward(E, F, act, bias);
        feed_forward_forward(ffn, x, y, cache, dropout);
        feed_forward_backward(ffn, x, dy, dx, cache, grads);

        // The composition, every intermediate in fp32.
        Tensor pre = Tensor::empty({rows, F}), hidden = Tensor::empty({rows, F});
        linear_forward(without_bias(ffn.linear1), x, pre);
        bias_activation_forward(act, bias ? ffn.linear1.bias.data<float>() : nullptr, pre.data<float>(),
                                hidden.data<float>(), rows, F);
        dropout_forward(dropout, hidden.data<float>(), hidden.data<float>(), rows * F);
        Tensor y_want = Tensor::empty({rows, E});
        linear_forward(ffn.linear2, hidden, y_want);
        EXPECT_EQ(y.to_vector(), y_want.to_vector());
        EXPECT_EQ(cache.pre_activation.to_vector(), pre.to_vector());

        FeedForward want = make_feed_forward(E, F, act, bias);
        Tensor dh = Tensor::empty({rows, F}), dx_want = Tensor::empty({rows, E});
        linear_backward(ffn.linear2, hidden, dy, dh, want.linear2);
        dropout_backward(dropout, dh.data<float>(), dh.data<float>(), rows * F);
        bias_activation_backward(act, pre.data<float>(), dh.data<float>(), dh.data<float>(),
                                 bias ? want.linear1.bias.data<float>() : nullptr, rows, F);
        Linear want1 = without_bias(want.linear1);
        linear_backward(without_bias(ffn.linear1), x, dh, dx_want, want1);
        EXPECT_EQ(dx.to_vector(), dx_want.to_vector());
        NamedTensors got, expected;
        for (auto [from, to] : {std::pair{&grads, &got}, std::pair{&want, &expected}}) {
          append_parameters(from->linear1, "linear1.", *to);
          append_parameters(from->linear2, "linear2.", *to);
        }
        ASSERT_EQ(got.size(), expected.size());
        for (size_t i = 0; i < got.size(); ++i)
          EXPECT_EQ(got[i].tensor.to_vector(), expected[i].tensor.to_vector()) << got[i].name;
      }
}

TEST(MixedPrecision, LinearRoundedOperands) {
  const int64_t rows = 19, in = 13, out = 7;
  Linear fp32 = make_linear(in, out, false);
  fp32.weight.copy_from(test::random_tensor({out, in}, 31, -0.5f, 0.5f));
  Linear bf16 = fp32;
  set_precision(bf16, Precision::kBf16);
  const Tensor x = test::random_tensor({rows, in}, 32), dy = test::random_tensor({rows, out}, 33);
  Tensor x_b = Tensor::empty({rows, in}, DType::BF16), dy_b = Tensor::empty({rows, out}, DType::BF16);
  round_to_bf16(x, x_b);
  round_to_bf16(dy, dy_b);
  Tensor y = Tensor::empty({rows, out}), y_want = Tensor::empty({rows, out});
  linear_forward_rounded(bf16, x_b, y);
  linear_forward(bf16, x, y_want);
  EXPECT_EQ(y.to_vector(), y_want.to_vector());
  Linear g = make_linear(in, out, false), g_want = make_linear(in, out, false);
  Tensor dx = Tensor::full({rows, in}, 1.0f), dx_want = Tensor::full({rows, in}, 1.0f);
  linear_backward_rounded(bf16, x_b, dy_b, dx, g, /*accumulate_dx=*/true);
  linear_backward(bf16, x, dy, dx_want, g_want, /*accumulate_dx=*/true);
  EXPECT_EQ(dx.to_vector(), dx_want.to_vector());
  EXPECT_EQ(g.weight.to_vector(), g_want.weight.to_vector());

  EXPECT_NE(test::error_of([&] { linear_forward_rounded(fp32, x_b, y); }).find("no bf16 weight"), std::string::npos);
  // The same operands as F32 holding their bf16 values: where gemm_bf16 widens anyway, the same
  // bits; elsewhere an fp32 product of the same values (oneDNN's bf16 kernels sum in another order).
  Tensor y_f = Tensor::empty({rows, out}), dx_f = Tensor::full({rows, in}, 1.0f);
  Linear g_f = make_linear(in, out, false);
  linear_forward_rounded(bf16, rounded_f32(x), y_f);
  linear_backward_rounded(bf16, rounded_f32(x), rounded_f32(dy), dx_f, g_f, /*accumulate_dx=*/true);
  if (gemm_bf16_widens()) {
    EXPECT_EQ(y_f.to_vector(), y.to_vector());
    EXPECT_EQ(dx_f.to_vector(), dx.to_vector());
    EXPECT_EQ(g_f.weight.to_vector(), g.weight.to_vector());
  } else {
    EXPECT_LE(rel_diff(y_f, y), 1e-5);
    EXPECT_LE(rel_diff(dx_f, dx), 1e-5);
    EXPECT_LE(rel_diff(g_f.weight, g.weight), 1e-5);
  }

  const Tensor flags = Tensor::zeros({rows, in}, DType::BOOL);
  EXPECT_NE(test::error_of([&] { linear_forward_rounded(bf16, flags, y); }).find("rounded input"), std::string::npos);
  EXPECT_NE(test::error_of([&] { linear_backward_rounded(bf16, x_b, x_b, dx, g); }).find("rounded output gradient"),
            std::string::npos);
  Linear with_bias = make_linear(in, out, true);
  with_bias.weight.copy_from(fp32.weight);
  set_precision(with_bias, Precision::kBf16);
  Linear g_bias = make_linear(in, out, true);
  EXPECT_NE(test::error_of([&] { linear_backward_rounded(with_bias, x_b, dy_b, dx, g_bias); }).find("bias"),
            std::string::npos);
}

struct AttentionRun {
  Tensor out, dx;
  std::vector<Tensor> grads;
};

AttentionRun run_attention(const MultiHeadAttention& mha, const Tensor& x, const Tensor& dout, const Mask& mask) {
  MultiHeadAttentionCache cache;
  AttentionInputs in{x, x, x, mask};
  AttentionRun r;
  r.out = multi_head_attention_forward(mha, in, cache).clone();
  MultiHeadAttention grads = make_multi_head_attention(mha.config);
  zero_parameters(named_parameters(grads));
  r.dx = Tensor::zeros(x.shape());
  multi_head_attention_backward(mha, in, dout, cache, grads, AttentionInputGrads{r.dx, r.dx, r.dx});
  for (const NamedTensor& g : named_parameters(grads)) r.grads.push_back(g.tensor.clone());
  return r;
}

TEST(MixedPrecision, MultiHeadAttentionForwardBackward) {
  const int64_t B = 2, N = 23, E = 32, H = 4;
  MultiHeadAttention fp32 = make_multi_head_attention({E, H});
  Rng rng(5);
  init_parameters(fp32, rng);
  for (NamedTensor& p : named_parameters(fp32))
    if (p.tensor.dim() == 1) p.tensor.copy_from(test::random_tensor(p.tensor.shape(), 6, -0.1f, 0.1f));
  MultiHeadAttention bf16 = make_multi_head_attention({E, H});
  const NamedTensors src = named_parameters(fp32);
  NamedTensors dst = named_parameters(bf16);
  for (size_t i = 0; i < src.size(); ++i) dst[i].tensor.copy_from(src[i].tensor);
  set_precision(bf16, Precision::kBf16);
  ASSERT_EQ(precision_of(bf16), Precision::kBf16);
  const Tensor x = test::random_tensor({B, N, E}, 7), dout = test::random_tensor({B, N, E}, 8);
  const double kappa = cancellation(as_rows(x), fp32.in_proj_weight);

  for (const Mask& mask : {Mask(), Mask::causal(), Mask::key_padding({N, 11})}) {
    const AttentionRun a = run_attention(fp32, x, dout, mask), b = run_attention(bf16, x, dout, mask);
    // Forward: projection, Q·Kᵀ, P·V, out_proj = 4 stages; backward to the input adds
    // out_proj's dy·W, dO·Vᵀ, dS·K, the projection's dy·W: 8; weight gradients likewise.
    const double forward = rel_diff(b.out, a.out), input = rel_diff(b.dx, a.dx);
    EXPECT_GT(forward, 0.0);
    EXPECT_LE(forward, 4 * 3 * kU * kappa) << "kappa " << kappa;
    record("mha_forward", forward, 4 * 3 * kU * kappa);
    record("mha_input_grad", input, 8 * 3 * kU * kappa);
    EXPECT_LE(input, 8 * 3 * kU * kappa);
    for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_LE(rel_diff(b.grads[i], a.grads[i]), 8 * 3 * kU * kappa) << i;
  }

  // need_weights in bf16: the fp32 reference on the bf16-rounded Q, K, V; the output agrees with
  // the flash path up to P's rounding (u) and fp32 order.
  MultiHeadAttentionCache c1, c2;
  AttentionInputs in{x, x, x, Mask::causal()};
  const Tensor flash = multi_head_attention_forward(bf16, in, c1).clone();
  in.need_weights = true;
  const Tensor ref = multi_head_attention_forward(bf16, in, c2).clone();
  EXPECT_LE(rel_diff(ref, flash), 2 * 3 * kU * kappa);
  ASSERT_TRUE(c2.averaged_weights.defined());
  for (float w : c2.averaged_weights.to_vector()) ASSERT_TRUE(w >= 0.0f && w <= 1.0f);
}

EncoderLayer copy_layer(const EncoderLayer& from) {
  EncoderLayer to = make_encoder_layer(from.config);
  const NamedTensors src = named_parameters(from);
  NamedTensors dst = named_parameters(to);
  for (size_t i = 0; i < src.size(); ++i) dst[i].tensor.copy_from(src[i].tensor);
  return to;
}

TEST(MixedPrecision, EncoderLayerAndForcedPortable) {
  for (const bool norm_first : {true, false}) {
    EncoderLayerConfig config{32, 4, 48, 0.0f, Activation::kGelu, 1e-5f, norm_first};
    EncoderLayer fp32 = make_encoder_layer(config);
    Rng rng(9);
    init_parameters(fp32, rng);
    EncoderLayer bf16 = copy_layer(fp32);
    set_precision(bf16, Precision::kBf16);
    const Tensor x = test::random_tensor({3, 17, 32}, 10), dy = test::random_tensor({3, 17, 32}, 11);
    const double kappa = cancellation(as_rows(x), fp32.self_attn.in_proj_weight);
    auto run = [&](const EncoderLayer& layer, std::vector<Tensor>& grads) {
      EncoderLayerCache cache;
      const Tensor y = encoder_layer_forward(layer, x, Mask::causal(), cache).clone();
      EncoderLayer g = make_encoder_layer(config);
      zero_parameters(named_parameters(g));
      Tensor dx = Tensor::empty(x.shape());
      encoder_layer_backward(layer, x, dy, dx, cache, g);
      grads = {dx};
      for (const NamedTensor& p : named_parameters(g)) grads.push_back(p.tensor.clone());
      return y;
    };
    std::vector<Tensor> g32, g16, g16p;
    const Tensor y32 = run(fp32, g32), y16 = run(bf16, g16);
    // Attention (4 stages) then the feed-forward sublayer (2): 6 forward, 12 backward.
    EXPECT_GT(rel_diff(y16, y32), 0.0);
    EXPECT_LE(rel_diff(y16, y32), 6 * 3 * kU * kappa) << "norm_first " << norm_first;
    record("layer_forward", rel_diff(y16, y32), 6 * 3 * kU * kappa);
    record("layer_dx", rel_diff(g16[0], g32[0]), 12 * 3 * kU * kappa);
    for (size_t i = 0; i < g32.size(); ++i) EXPECT_LE(rel_diff(g16[i], g32[i]), 12 * 3 * kU * kappa) << i;

    // The portable path (forced) gives the same results up to fp32 summation order; where it is
    // also the path that ran (conversions, gemm_bf16 and both attention kernels), bitwise.
    const bool same_paths = std::string(bf16_path_name()) == "portable" &&
                            std::string(attention_flash_bf16_path()) == "portable" &&
                            std::string(attention_flash_bf16_backward_path()) == "portable";
    set_bf16_isa_override(Bf16Isa::kPortable);
    const Tensor y16p = run(bf16, g16p);
    set_bf16_isa_override(Bf16Isa::kAuto);
    if (same_paths) {
      EXPECT_EQ(y16p.to_vector(), y16.to_vector());
      for (size_t i = 0; i < g16.size(); ++i) EXPECT_EQ(g16p[i].to_vector(), g16[i].to_vector()) << i;
    } else {
      // Rounding boundaries may flip by one bf16 ulp between the paths: the bf16 bound applies.
      EXPECT_LE(rel_diff(y16p, y16), 6 * 3 * kU * kappa);
      for (size_t i = 0; i < g16.size(); ++i) EXPECT_LE(rel_diff(g16p[i], g16[i]), 12 * 3 * kU * kappa) << i;
    }
  }
}

// The modules keep the operands of their bf16 products as BF16, or as F32 holding the bf16 values
// where gemm_bf16 widens its operands anyway (rounded_dtype()). Both forms hold the same values:
// on such a CPU the same bits, forward and backward (the feed-forward layer with and without
// dropout, attention, the residual sublayers); elsewhere an fp32 product of the same values
// against oneDNN's bf16 kernels, within the bf16 bound.
TEST(MixedPrecision, RoundedFormsAgree) {
  for (const bool norm_first : {true, false})
    for (const float dropout : {0.0f, 0.2f}) {
      SCOPED_TRACE(testing::Message() << "norm_first " << norm_first << " dropout " << dropout);
      EncoderLayerConfig config{32, 4, 48, dropout, Activation::kGelu, 1e-5f, norm_first};
      EncoderLayer fp32 = make_encoder_layer(config);
      Rng rng(19);
      init_parameters(fp32, rng);
      const Tensor x = test::random_tensor({2, 21, 32}, 20), dy = test::random_tensor({2, 21, 32}, 21);
      const double kappa = cancellation(as_rows(x), fp32.self_attn.in_proj_weight);
      auto run = [&](DType form, std::vector<Tensor>& grads) {
        const PinnedRoundedForm pinned(form);
        EncoderLayer bf16 = copy_layer(fp32);
        set_precision(bf16, Precision::kBf16);  // the weights' copies in that form too
        EXPECT_EQ(bf16.self_attn.in_proj_weight_bf16.dtype(), form);
        EXPECT_EQ(bf16.ffn.linear2.weight_bf16.dtype(), form);
        EncoderLayerCache cache;
        const Tensor y = encoder_layer_forward(bf16, x, Mask::causal(), cache, ForwardMode{true, 5, 1, 0}).clone();
        EXPECT_EQ(cache.ffn.x_bf16.dtype(), form);
        EXPECT_EQ(cache.attn.query_bf16.dtype(), form);
        EXPECT_EQ(cache.attn.attn_bf16.dtype(), form);
        EXPECT_EQ(cache.ffn.hidden_bf16.dtype(), form);
        EncoderLayer g = make_encoder_layer(config);
        zero_parameters(named_parameters(g));
        Tensor dx = Tensor::empty(x.shape());
        encoder_layer_backward(bf16, x, dy, dx, cache, g);
        grads = {dx};
        for (const NamedTensor& p : named_parameters(g)) grads.push_back(p.tensor.clone());
        return y;
      };
      std::vector<Tensor> gb, gf;
      const Tensor yb = run(DType::BF16, gb), yf = run(DType::F32, gf);
      ASSERT_EQ(gb.size(), gf.size());
      if (gemm_bf16_widens()) {
        EXPECT_EQ(yf.to_vector(), yb.to_vector());
        for (size_t i = 0; i < gb.size(); ++i) EXPECT_EQ(gf[i].to_vector(), gb[i].to_vector()) << i;
      } else {
        EXPECT_LE(rel_diff(yf, yb), 6 * 3 * kU * kappa);
        for (size_t i = 0; i < gb.size(); ++i) EXPECT_LE(rel_diff(gf[i], gb[i]), 12 * 3 * kU * kappa) << i;
      }
    }
}

TEST(MixedPrecision, Bf16KvCacheDecodingMatchesFullForward) {
  CausalLMConfig c;
  c.vocab_size = 40;
  c.max_seq_len = 24;
  c.d_model = 32;
  c.nhead = 4;
  c.num_layers = 2;
  c.dim_feedforward = 48;
  c.dropout = 0.0f;
  CausalLM model = make_causal_lm(c);
  Rng rng(12);
  init_parameters(model, rng);
  set_precision(model, Precision::kBf16);
  ASSERT_EQ(precision_of(model), Precision::kBf16);
  const int64_t B = 2, T = 19;
  Tensor tokens = Tensor::empty({B, T}, DType::I64);
  Rng ids(13);
  for (int64_t i = 0; i < B * T; ++i) tokens.data<int64_t>()[i] = ids.next_u32() % c.vocab_size;
  CausalLMCache cache;
  const Tensor full = causal_lm_forward(model, tokens, cache).clone();

  // Prompt of 7 tokens, then one at a time.
  DecodeState state;
  decode_reset(model, B, c.max_seq_len, state);
  ASSERT_EQ(state.kv[0].k.dtype(), DType::BF16);  // half the memory of an F32 cache
  Tensor decoded = Tensor::empty({B, T, c.vocab_size});
  int64_t pos = 0;
  for (const int64_t n : {int64_t{7}, int64_t{1}, int64_t{1}, int64_t{4}, int64_t{1}, int64_t{5}}) {
    Tensor step = Tensor::empty({B, n}, DType::I64);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t) step.data<int64_t>()[b * n + t] = tokens.data<int64_t>()[b * T + pos + t];
    const Tensor& logits = causal_lm_decode(model, step, state);
    for (int64_t b = 0; b < B; ++b) decoded.select(0, b).narrow(0, pos, n).copy_from(logits.select(0, b));
    pos += n;
  }
  ASSERT_EQ(pos, T);
  // Both run the same bf16 products; they differ in fp32 summation order (GEMM shapes differ),
  // which can flip a bf16 rounding by one ulp (2u relative) anywhere on the path: per layer
  // attention (4 stages) + feed-forward (2), plus the head.
  const double kappa = cancellation(as_rows(model.embed.weight), model.encoder.layers[0].self_attn.in_proj_weight);
  EXPECT_LE(rel_diff(decoded, full), (6 * c.num_layers + 1) * 2 * kU * kappa);
  record("decode", rel_diff(decoded, full), (6 * c.num_layers + 1) * 2 * kU * kappa);
  // Back in fp32: an F32 cache, and logits that differ from the bf16 ones (the bf16 path ran).
  set_precision(model, Precision::kFp32);
  decode_reset(model, B, c.max_seq_len, state);
  EXPECT_EQ(state.kv[0].k.dtype(), DType::F32);
  EXPECT_GT(rel_diff(causal_lm_forward(model, tokens, cache), full), 0.0);
}

}  // namespace
}  // namespace cabm
