// Grouped-query attention in the modules (multi_head_attention.h, num_kv_heads): a module with
// Hkv key/value heads is exactly a plain multi-head module whose K and V projections repeat each
// key/value head's rows for the H/Hkv query heads of its group (the definition of GQA), forward
// and backward (the GQA weight gradients are the group sums of the plain module's); decoding with
// a KV cache of Hkv heads matches the full causal forward; the parameter shapes and the errors.
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/init.h"
#include "cabm/nn/mixed_precision.h"
#include "cabm/nn/multi_head_attention.h"
#include "cabm/nn/parameters.h"
#include "util/test_util.h"

#include <cmath>

namespace cabm {
namespace {

// The plain module (H key/value heads) equivalent to `gqa`: K and V rows of key/value head
// h / group copied to head h.
MultiHeadAttention expanded(const MultiHeadAttention& gqa) {
  MultiHeadAttentionConfig c = gqa.config;
  c.num_kv_heads = 0;
  MultiHeadAttention plain = make_multi_head_attention(c);
  const int64_t H = gqa.num_heads(), d = gqa.head_dim(), group = H / gqa.num_kv_heads();
  plain.q_proj.weight.copy_from(gqa.q_proj.weight);
  plain.out_proj.weight.copy_from(gqa.out_proj.weight);
  if (c.bias) {
    plain.q_proj.bias.copy_from(gqa.q_proj.bias);
    plain.out_proj.bias.copy_from(gqa.out_proj.bias);
  }
  for (int64_t h = 0; h < H; ++h) {
    const int64_t hk = h / group;
    for (auto [from, to] : {std::pair{&gqa.k_proj, &plain.k_proj}, std::pair{&gqa.v_proj, &plain.v_proj}}) {
      to->weight.narrow(0, h * d, d).copy_from(from->weight.narrow(0, hk * d, d));
      if (c.bias) to->bias.narrow(0, h * d, d).copy_from(from->bias.narrow(0, hk * d, d));
    }
  }
  return plain;
}

// Σ over the query heads of each group of the plain module's K or V gradient rows.
Tensor group_sum(const Tensor& plain_rows, int64_t H, int64_t Hkv, int64_t d) {
  const int64_t group = H / Hkv;
  Tensor sum = Tensor::zeros({Hkv * d, plain_rows.size(1)});
  for (int64_t h = 0; h < H; ++h) {
    const Tensor from = plain_rows.narrow(0, h * d, d).contiguous();
    Tensor to = sum.narrow(0, (h / group) * d, d);
    for (int64_t r = 0; r < d; ++r)
      for (int64_t c = 0; c < from.size(1); ++c)
        to.data<float>()[r * to.stride(0) + c] += from.data<float>()[r * from.size(1) + c];
  }
  return sum;
}

Tensor group_sum_bias(const Tensor& plain_bias, int64_t H, int64_t Hkv, int64_t d) {
  return group_sum(plain_bias.contiguous().view({H * d, 1}), H, Hkv, d).view({Hkv * d});
}

struct Case {
  int64_t E, H, Hkv, kdim;  // kdim != E: separate (unpacked) projections, cross-attention
  bool causal;
};

class GroupedQueryAttention : public ::testing::TestWithParam<Case> {};

TEST_P(GroupedQueryAttention, EqualsMultiHeadWithRepeatedKeyValueHeads) {
  const Case c = GetParam();
  const int64_t B = 2, N = 7, M = c.kdim == c.E ? N : 5, d = c.E / c.H;
  MultiHeadAttention gqa = make_multi_head_attention({c.E, c.H, c.kdim, c.kdim, true, c.Hkv});
  Rng rng(3);
  init_parameters(gqa, rng);
  for (Linear* p : {&gqa.q_proj, &gqa.k_proj, &gqa.v_proj})
    p->bias.copy_from(test::random_tensor(p->bias.shape(), 11, -0.5f, 0.5f));
  ASSERT_EQ(gqa.k_proj.weight.shape(), (Shape{c.Hkv * d, c.kdim}));
  if (gqa.packed()) {
    ASSERT_EQ(gqa.in_proj_weight.shape(), (Shape{c.E + 2 * c.Hkv * d, c.E}));
  }
  const MultiHeadAttention plain = expanded(gqa);

  const Tensor x = test::random_tensor({B, N, c.E}, 5);
  const Tensor kv_in = c.kdim == c.E ? x : test::random_tensor({B, M, c.kdim}, 6);
  AttentionInputs in;
  in.query = x;
  in.key = kv_in;
  in.value = kv_in;
  if (c.causal) in.mask = Mask::causal();
  MultiHeadAttentionCache gqa_cache, plain_cache;
  const Tensor out = multi_head_attention_forward(gqa, in, gqa_cache).clone();
  const Tensor want = multi_head_attention_forward(plain, in, plain_cache).clone();
  EXPECT_CLOSE(out, want, 1e-5, 1e-6);

  const Tensor dout = test::random_tensor({B, N, c.E}, 7);
  MultiHeadAttention g_gqa = make_multi_head_attention(gqa.config), g_plain = make_multi_head_attention(plain.config);
  const Tensor dx = Tensor::zeros(x.shape()), dx_plain = Tensor::zeros(x.shape());
  const Tensor dkv = c.kdim == c.E ? dx : Tensor::zeros(kv_in.shape());
  const Tensor dkv_plain = c.kdim == c.E ? dx_plain : Tensor::zeros(kv_in.shape());
  multi_head_attention_backward(gqa, in, dout, gqa_cache, g_gqa, {dx, dkv, dkv});
  multi_head_attention_backward(plain, in, dout, plain_cache, g_plain, {dx_plain, dkv_plain, dkv_plain});
  EXPECT_CLOSE(dx, dx_plain, 1e-4, 1e-5);
  if (c.kdim != c.E) {
    EXPECT_CLOSE(dkv, dkv_plain, 1e-4, 1e-5);
  }
  EXPECT_CLOSE(g_gqa.q_proj.weight.contiguous(), g_plain.q_proj.weight.contiguous(), 1e-4, 1e-5);
  EXPECT_CLOSE(g_gqa.out_proj.weight, g_plain.out_proj.weight, 1e-4, 1e-5);
  EXPECT_CLOSE(g_gqa.k_proj.weight.contiguous(), group_sum(g_plain.k_proj.weight, c.H, c.Hkv, d), 1e-4, 1e-5);
  EXPECT_CLOSE(g_gqa.v_proj.weight.contiguous(), group_sum(g_plain.v_proj.weight, c.H, c.Hkv, d), 1e-4, 1e-5);
  EXPECT_CLOSE(g_gqa.k_proj.bias.contiguous(), group_sum_bias(g_plain.k_proj.bias, c.H, c.Hkv, d), 1e-4, 1e-5);
  EXPECT_CLOSE(g_gqa.v_proj.bias.contiguous(), group_sum_bias(g_plain.v_proj.bias, c.H, c.Hkv, d), 1e-4, 1e-5);

  // need_weights takes the reference kernel: the same output, and per-head weights.
  in.need_weights = true;
  in.average_weights = false;
  MultiHeadAttentionCache weights_cache;
  EXPECT_CLOSE(multi_head_attention_forward(gqa, in, weights_cache), want, 1e-5, 1e-6);
  EXPECT_EQ(weights_cache.weights.shape(), (Shape{B, c.H, N, M}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupedQueryAttention,
                         ::testing::Values(Case{16, 4, 2, 16, false}, Case{16, 4, 1, 16, true},   // GQA, MQA
                                           Case{24, 6, 3, 24, true}, Case{24, 6, 2, 10, false},  // cross
                                           Case{16, 4, 4, 16, true}));                          // plain

CausalLMConfig small_lm(int64_t kv_heads, bool rotary = false) {
  CausalLMConfig c;
  if (rotary) {
    c.positional = PositionalKind::kRotary;
    c.rope = {RopeStyle::kNeox, 10000.0f, 0};
  }
  c.vocab_size = 13;
  c.max_seq_len = 9;
  c.d_model = 16;
  c.nhead = 4;
  c.num_kv_heads = kv_heads;
  c.num_layers = 2;
  c.dim_feedforward = 24;
  c.dropout = 0.0f;
  return c;
}

// Rotary models too: decoding rotates the new queries and keys at the cache length.
TEST(GroupedQueryAttentionLM, KVCacheHoldsKeyValueHeadsAndMatchesFullForward) {
  for (int64_t kv_heads : {1, 2, 4})
  for (bool rotary : {false, true})
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE("kv heads " + std::to_string(kv_heads) + (bf16 ? " bf16" : " fp32") + (rotary ? " rotary" : ""));
      CausalLM model = make_causal_lm(small_lm(kv_heads, rotary));
      Rng rng(7);
      init_parameters(model, rng);
      if (bf16) set_precision(model, Precision::kBf16);
      const int64_t B = 2, T = 9;
      Tensor tokens = Tensor::empty({B, T}, DType::I64);
      for (int64_t i = 0; i < B * T; ++i) tokens.data<int64_t>()[i] = (i * 7 + 3) % 13;
      CausalLMCache cache;
      const Tensor full = causal_lm_forward(model, tokens, cache).clone();
      DecodeState state;
      decode_reset(model, B, T, state);
      EXPECT_EQ(state.kv[0].k.shape(), (Shape{B, T, kv_heads * 4}));  // d = 16 / 4
      const double tol = bf16 ? 3e-2 : 1e-4;
      Tensor step = causal_lm_decode(model, tokens.narrow(1, 0, 3).contiguous(), state);
      EXPECT_CLOSE(step, full.narrow(1, 0, 3).contiguous(), tol, tol);
      for (int64_t t = 3; t < T; ++t) {
        step = causal_lm_decode(model, tokens.narrow(1, t, 1).contiguous(), state);
        EXPECT_CLOSE(step, full.narrow(1, t, 1).contiguous(), tol, tol);
      }
    }
}

TEST(GroupedQueryAttentionLM, ParameterShapesAndErrors) {
  const CausalLM model = make_causal_lm(small_lm(2));
  bool found = false;
  for (const NamedTensor& p : named_parameters(model))
    if (p.name == "encoder.layers.0.self_attn.in_proj_weight") {
      EXPECT_EQ(p.tensor.shape(), (Shape{16 + 2 * 2 * 4, 16}));
      found = true;
    }
  EXPECT_TRUE(found);
  EXPECT_NE(test::error_of([] { make_causal_lm(small_lm(3)); }).find("num_kv_heads"), std::string::npos);
  EXPECT_NE(test::error_of([] { make_multi_head_attention({16, 4, 0, 0, true, -1}); }).find("num_kv_heads"),
            std::string::npos);
}

}  // namespace
}  // namespace cabm
