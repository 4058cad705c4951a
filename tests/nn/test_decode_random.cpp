// Incremental decoding against the full forward, on random causal LMs: each case draws a model
// (1-3 layers, H 1-8 heads over Hkv dividing it, head dims 1-80, pre- or post-norm, ReLU or GELU,
// tied or untied head, learned, sinusoidal or rotary positions with neox or gptj pairs, any
// theta and partial rotary dims, fp32 or bf16), a batch of B 1-3 sequences of T 1-300 tokens and
// a schedule of appends (a prefill of any length, then pieces of 1 to 20 tokens), and requires
// every decoded position's logits to equal causal_lm_forward's over the whole sequence, on 1 or
// 2 threads (bf16: within its rounding error, below). The decode path (KV cache, split-key attention, rotation at the
// cache length, positions from the cache length) and the training forward (flash attention over the whole sequence)
// share only the weights, so any offset, mask or cache error shows.
//
// CABM_RANDOM_CASES (default 40) and CABM_RANDOM_SEED (default 1) widen the run.
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/init.h"
#include "cabm/nn/mixed_precision.h"
#include "util/attention_cases.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace cabm {
namespace {

// Bounds, as shares of the full forward's largest logit. fp32: the two paths sum the same
// products in other orders (GEMMs of n rows against B·T, split-key against flash attention), a
// few float32 roundings per layer; the worst over 6,000 cases was 5.2e-6, at E = 4 (see
// kLayerNormFeatures), and the bound is 4× that. bf16: each path is a bf16 computation with its
// own roundings, not the same ones (the flash kernel rounds its probabilities to bf16, relative to
// a running maximum that depends on its tiles; the decode kernel keeps them in fp32:
// attention/decode.h), so decoding is held to the fp32 forward instead: its error there within
// kBf16Factor times the bf16 forward's own (the worst seen: 1.55 times).
//
// kLayerNormFeatures: E >= 4. A LayerNorm over fewer features is ill-conditioned (over one it is
// constant, over two ±1 up to eps; over three, rows with two nearly equal features amplify
// rounding), and the two paths' roundings then differ by far more than their arithmetic does.
constexpr double kFp32Share = 2e-5;
constexpr double kBf16Factor = 3;

struct Case {
  CausalLMConfig config;
  Precision precision = Precision::kFp32;
  int64_t B = 1, T = 1, prefill = 1, piece = 1;
  int threads = 1;
  uint64_t seed = 0;
  std::string text;
};

Case draw_case(test::Draw& r) {
  Case c;
  CausalLMConfig& m = c.config;
  const int64_t H = r.in(1, 8);
  static const int64_t kKv[] = {1, 2, 4, 8};
  int64_t Hkv = H;
  if (r.chance(0.5)) do
      Hkv = kKv[r.in(0, 3)];
    while (H % Hkv != 0);
  static const int64_t kDims[] = {1, 2, 3, 4, 8, 15, 16, 24, 32, 33, 48, 64, 80};
  const int64_t choice = r.in(0, 4);
  m.positional = choice == 0   ? PositionalKind::kSinusoidal
                 : choice <= 2 ? PositionalKind::kLearned
                               : PositionalKind::kRotary;
  int64_t d = kDims[r.in(0, 12)];
  while (H * d < 4) d = kDims[r.in(0, 12)];  // see kLayerNormFeatures
  if (m.positional == PositionalKind::kRotary) {
    d += d % 2;  // rotated dims are pairs
    m.rope.style = r.chance(0.5) ? RopeStyle::kNeox : RopeStyle::kGptj;
    m.rope.theta = r.chance(0.5) ? 10000.0f : static_cast<float>(r.in(2, 500000));
    m.rope.rope_dim = r.chance(0.6) ? 0 : 2 * r.in(1, d / 2);  // 0: all of d
  }
  m.vocab_size = r.in(2, 300);
  m.d_model = H * d;
  m.nhead = H;
  m.num_kv_heads = Hkv;
  m.num_layers = r.in(1, 3);
  m.dim_feedforward = r.in(1, 96);
  m.dropout = 0.0f;
  m.activation = r.chance(0.5) ? Activation::kGelu : Activation::kRelu;
  m.norm_first = r.chance(0.5);
  m.tie_head = r.chance(0.5);
  c.precision = r.chance(0.3) ? Precision::kBf16 : Precision::kFp32;
  c.B = r.in(1, 3);
  c.T = r.chance(0.2) ? r.in(1, 8) : r.in(1, 300);
  m.max_seq_len = c.T + r.in(0, 10);
  c.prefill = r.in(1, c.T);
  c.piece = r.chance(0.5) ? 1 : r.in(1, 20);
  c.threads = static_cast<int>(r.in(1, 2));
  c.seed = r.seed();
  c.text = "B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " (prefill " + std::to_string(c.prefill) +
           ", then " + std::to_string(c.piece) + " at a time) L " + std::to_string(m.num_layers) + " H " +
           std::to_string(H) + " Hkv " + std::to_string(Hkv) + " d " + std::to_string(d) + " F " +
           std::to_string(m.dim_feedforward) + " V " + std::to_string(m.vocab_size) + ", " +
           positional_name(m.positional) +
           (m.positional == PositionalKind::kRotary
                ? std::string(" ") + rope_style_name(m.rope.style) + " theta " + std::to_string(m.rope.theta) +
                      " dims " + std::to_string(m.rope.rope_dim)
                : "") +
           (m.norm_first ? ", pre-norm" : ", post-norm") + (m.tie_head ? ", tied" : ", untied") +
           (c.precision == Precision::kBf16 ? ", bf16" : ", fp32") + ", " + std::to_string(c.threads) + " threads";
  return c;
}

// What a case measures, as shares of the full forward's largest logit: the largest
// |decoded − full|, and (bf16) the largest |full in bf16 − full in fp32|, bf16's own error.
struct Shares {
  double decode = 0, bf16 = 0;
  double decode_bf16 = 0;  // bf16: the largest |decoded − full in fp32|, decode's own error
};

// The largest |a − b| over two tensors of one shape; NaN counts as infinite.
double largest_difference(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(x[i]) - y[i]);
    worst = std::max(worst, std::isnan(diff) ? INFINITY : diff);
  }
  return worst;
}

Shares run_case(const Case& c) {
  test::ScopedThreads threads(c.threads);
  CausalLM model = make_causal_lm(c.config);
  Rng rng(c.seed);
  init_parameters(model, rng);
  // Embeddings well above init's 0.02 so that the logits spread (softmax rows far from uniform).
  for (float *p = model.embed.weight.data<float>(), *e = p + model.embed.weight.numel(); p < e; ++p) *p *= 20.0f;
  Tensor tokens = Tensor::empty({c.B, c.T}, DType::I64);
  for (int64_t i = 0; i < c.B * c.T; ++i)
    tokens.data<int64_t>()[i] = static_cast<int64_t>(rng.next_u32() % static_cast<uint32_t>(c.config.vocab_size));
  CausalLMCache cache;
  Tensor fp32;
  if (c.precision == Precision::kBf16) {
    fp32 = causal_lm_forward(model, tokens, cache).clone();
    set_precision(model, Precision::kBf16);
  }
  const Tensor full = causal_lm_forward(model, tokens, cache).clone();

  // The decoded logits of every position, gathered in the full forward's layout [B, T, V].
  Tensor decoded = Tensor::empty(full.shape());
  DecodeState state;
  decode_reset(model, c.B, c.config.max_seq_len, state);
  for (int64_t start = 0; start < c.T;) {
    const int64_t n = start == 0 ? c.prefill : std::min(c.piece, c.T - start);
    decoded.narrow(1, start, n).copy_from(causal_lm_decode(model, tokens.narrow(1, start, n).contiguous(), state));
    EXPECT_EQ(state.length(), start + n);
    start += n;
  }
  const double scale = std::max(test::max_abs(full), 1e-30);
  Shares shares;
  shares.decode = largest_difference(decoded, full) / scale;
  if (fp32.defined()) {
    shares.bf16 = largest_difference(full, fp32) / scale;
    shares.decode_bf16 = largest_difference(decoded, fp32) / scale;
  }
  return shares;
}

TEST(DecodeRandom, EveryCaseMatchesTheFullForward) {
  const int cases = test::env_int("CABM_RANDOM_CASES", 40);
  test::Draw draw(static_cast<uint64_t>(test::env_int("CABM_RANDOM_SEED", 1)));
  double worst_fp32 = 0, worst_bf16 = 0, worst_ratio = 0;
  for (int k = 0; k < cases; ++k) {
    const Case c = draw_case(draw);
    SCOPED_TRACE("case " + std::to_string(k) + ": " + c.text);
    const Shares s = run_case(c);
    if (c.precision == Precision::kFp32) {
      worst_fp32 = std::max(worst_fp32, s.decode);
      EXPECT_LE(s.decode, kFp32Share);
    } else {
      worst_bf16 = std::max(worst_bf16, s.decode);
      worst_ratio = std::max(worst_ratio, s.decode_bf16 / (kFp32Share + s.bf16));
      EXPECT_LE(s.decode_bf16, kFp32Share + kBf16Factor * s.bf16)
          << "decoded against the fp32 forward; the bf16 forward's own error " << s.bf16;
    }
  }
  std::printf(
      "%d cases; the largest |decoded - full| as a share of the largest logit: fp32 %.3g, bf16 %.3g; bf16 decoding's "
      "error against fp32 at most %.3g times the bf16 forward's\n",
      cases, worst_fp32, worst_bf16, worst_ratio);
}

}  // namespace
}  // namespace cabm
