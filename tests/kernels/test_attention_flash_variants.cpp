// Tier 2 of the attention tests for the variants of current models in the fp32 flash kernel:
// grouped-query attention (GQA/MQA), logit soft-capping and ALiBi, forward and backward, against
// the reference kernel (attention/reference.cpp, the oracle), alone and combined with every mask
// kind, dropout, odd sizes, small tiles and thread counts (the vectorised tanh they need:
// test_vector_tanh.cpp).
#include "cabm/kernels/attention/attention.h"
#include "cabm/kernels/attention/flash.h"
#include "cabm/kernels/attention/flash_detail.h"
#include "cabm/kernels/attention/reference.h"
#include "cabm/kernels/simd.h"
#include "cabm/kernels/bf16.h"
#include "util/attention_cases.h"
#include "util/simd_isas.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cabm {
namespace {

using test::max_abs;
using test::Outcome;

// One problem: q [B, N, H, d], k [B, M, Hkv, d], v [B, M, Hkv, dv].
struct GqaDims {
  int64_t B, N, M, H, Hkv, d, dv;
};
std::string describe(const GqaDims& s) {
  return "B=" + std::to_string(s.B) + " N=" + std::to_string(s.N) + " M=" + std::to_string(s.M) +
         " H=" + std::to_string(s.H) + " Hkv=" + std::to_string(s.Hkv) + " d=" + std::to_string(s.d) +
         " dv=" + std::to_string(s.dv);
}
// The dims the mask cases and the error bound of attention_cases.h take: H query heads.
test::Dims query_dims(const GqaDims& s) { return {s.B, s.N, s.M, s.H, s.d, s.dv}; }

struct Case {
  GqaDims s;
  AttentionOptions options;
  FlashConfig config{};
  bool strided = true;  // inputs (and dO) as head views of fused buffers, else contiguous
  uint64_t seed = 1;
  float qk_range = 1.0f;
};
std::string describe(const Case& c) {
  const AttentionOptions& o = c.options;
  return describe(c.s) + " tiles " + std::to_string(c.config.block_q) + "x" + std::to_string(c.config.block_k) +
         " rows " + std::to_string(c.config.backward_rows) + " softcap " + std::to_string(o.softcap) +
         (o.alibi_slopes.empty() ? "" : " alibi") + (o.q_positions.empty() ? "" : " q_positions") +
         (o.k_positions.empty() ? "" : " k_positions") + (o.dropout > 0 ? " dropout" : "") +
         " qk_range " + std::to_string(c.qk_range) + (c.strided ? " strided" : "");
}

test::Inputs make_inputs(const Case& c) {
  const GqaDims& s = c.s;
  const float r = c.qk_range;
  return {test::make_heads(s.B, s.N, s.H, s.d, c.seed, c.strided, -r, r),
          test::make_heads(s.B, s.M, s.Hkv, s.d, c.seed + 1, c.strided, -r, r),
          test::make_heads(s.B, s.M, s.Hkv, s.dv, c.seed + 2, c.strided),
          test::make_heads(s.B, s.N, s.H, s.dv, c.seed + 3, c.strided)};
}

// Result buffers full of NaN (an element the kernel does not write fails the comparison), as nn/
// allocates them: out inside a wider buffer, dq a head view, dk and dv head views of one buffer.
Outcome run_flash(const test::Inputs& in, const AttentionOptions& options, const FlashConfig& config) {
  const int64_t B = in.q.size(0), N = in.q.size(1), H = in.q.size(2), d = in.q.size(3);
  const int64_t M = in.k.size(1), Hkv = in.k.size(2), dv = in.v.size(3);
  Outcome r;
  r.out = Tensor::full({B, N, H, dv + 3}, NAN).narrow(3, 1, dv);
  r.lse = Tensor::full({B, H, N}, NAN);
  attention_flash_forward(in.q, in.k, in.v, options, r.out, &r.lse, config);
  const Tensor kv = Tensor::full({B, M, Hkv, d + dv}, NAN);
  r.grads = {Tensor::full({B, N, H, d + 1}, NAN).narrow(3, 0, d), kv.narrow(3, 0, d), kv.narrow(3, d, dv)};
  attention_flash_backward({in.q, in.k, in.v, r.out, r.lse}, in.g, options, r.grads, config);
  return r;
}

Outcome run_reference(const test::Inputs& in, const AttentionOptions& options) {
  return test::run_reference(in.q, in.k, in.v, in.g, options, true);
}

void check(const Case& c) {
  SCOPED_TRACE(describe(c));
  ASSERT_TRUE(flash_supports_variants(c.s.H, c.s.Hkv, c.options));
  const test::Inputs in = make_inputs(c);
  const Outcome ref = run_reference(in, c.options);
  for (SimdIsa isa : test::flash_isas()) {
    const test::ScopedSimdIsa pin(isa);
    SCOPED_TRACE(std::string("isa ") + flash_isa());
    ASSERT_STREQ(flash_isa(), simd_isa_name(isa));
    test::expect_variant_close(run_flash(in, c.options, c.config), ref, test::variants_relative_bound(in, c.options),
                               test::variant_magnitudes(in, c.options));
  }
}

// Random slopes in [−0.2, 0.8) (negative ones too: only finiteness is required).
std::vector<float> random_slopes(int64_t H, uint64_t seed) {
  return test::random_tensor({H}, seed, -0.2f, 0.8f).to_vector();
}

// Positions: distinct, unsorted, starting far from 0 (offset).
std::vector<int64_t> random_positions(int64_t n, uint64_t seed, int64_t offset, int64_t spread) {
  Rng rng(seed);
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (auto& x : p) x = offset + static_cast<int64_t>(rng.next_uniform() * static_cast<float>(spread));
  return p;
}

// The three variants together, on top of a case's mask: soft-cap c, paper or random slopes.
void all_variants(AttentionOptions& o, int64_t H, float softcap, bool paper_slopes, uint64_t seed) {
  o.softcap = softcap;
  o.alibi_slopes = paper_slopes ? alibi_paper_slopes(H) : random_slopes(H, seed);
}

// --- GQA / MQA ----------------------------------------------------------------------------------

// H = 8 over 8, 4, 2, 1 key/value heads (MQA), and 6 over 3, 3 over 1; B = 1 (a backward with few
// key/value heads splits key tiles between threads) and 2.
TEST(FlashVariants, GroupedQueryRatios) {
  for (const auto& [H, Hkv] : std::vector<std::pair<int64_t, int64_t>>{{8, 8}, {8, 4}, {8, 2}, {8, 1}, {6, 3}, {3, 1}})
    for (int64_t B : {1, 2})
      for (const Mask& mask : {Mask(), Mask::causal(), Mask::causal(CausalAlign::kTopLeft)}) {
        Case c{{B, 45, 70, H, Hkv, 16, 12}, {}, {16, 32}};
        c.options.mask = mask;
        c.seed = static_cast<uint64_t>(H * 10 + Hkv + B);
        check(c);
      }
}

TEST(FlashVariants, GroupedQueryChunksAndDefaultTiles) {
  // backward_rows: the backward walks the query rows of the group in chunks; default tiles.
  for (const FlashConfig& config : {FlashConfig{}, FlashConfig{16, 16, 16}, FlashConfig{5, 7, 12}}) {
    Case c{{2, 100, 90, 4, 1, 24, 20}, {}, config};
    c.options.mask = Mask::causal();
    check(c);
    c.options.dropout = 0.3f;
    c.options.dropout_seed = 9;
    check(c);
  }
}

// --- soft-capping ---------------------------------------------------------------------------------

TEST(FlashVariants, Softcap) {
  for (float cap : {1.0f, 2.0f, 5.0f, 20.0f, 50.0f})
    for (float range : {1.0f, 3.0f})
      for (const Mask& mask : {Mask(), Mask::causal()}) {
        Case c{{2, 50, 61, 4, 2, 32, 16}, {}, {16, 24}};
        c.options.softcap = cap;
        c.options.mask = mask;
        c.qk_range = range;
        c.seed = static_cast<uint64_t>(cap * 10 + range);
        check(c);
      }
}

// Multiplies row j of every head of t ([B, L, H, d] view) by factor(j).
void scale_rows(const Tensor& t, const std::function<float(int64_t)>& factor) {
  for (int64_t b = 0; b < t.size(0); ++b)
    for (int64_t j = 0; j < t.size(1); ++j)
      for (int64_t h = 0; h < t.size(2); ++h) {
        float* row = t.data<float>() + b * t.stride(0) + j * t.stride(1) + h * t.stride(2);
        for (int64_t c = 0; c < t.size(3); ++c) row[c] *= factor(j);
      }
}

TEST(FlashVariants, SoftcapWithLargeLogits) {
  // Scaled scores from ±2 to beyond ±5000 (|q| < 30, d = 64, scale 1/8) saturate tanh for c = 1
  // and 5: exponents stay bounded by c and the derivative 1 − tanh² vanishes there, which a
  // backward that forgot it would miss by far. Built without cancellation (q >= 0, each key row
  // of one sign and a magnitude from 1/30 to 30), so that the float error of u = t/c is γ_d·|u|,
  // which soft-capping damps to c·sech²(u)·γ_d·|u| <= 0.45·γ_d·c: the score bound is c, not |t|.
  for (float cap : {1.0f, 5.0f, 30.0f})
    for (const Mask& mask : {Mask(), Mask::causal()}) {
      Case c{{1, 150, 140, 4, 2, 64, 32}, {}, {32, 32}};
      c.options.softcap = cap;
      c.options.mask = mask;
      c.seed = 7;
      test::Inputs in = make_inputs(c);
      in.q = test::make_heads(1, 150, 4, 64, 70, true, 0.0f, 30.0f);
      in.k = test::make_heads(1, 140, 2, 64, 71, true, 0.0f, 1.0f);
      scale_rows(in.k, [](int64_t j) { return (j % 3 == 0 ? -1.0f : 1.0f) * std::pow(30.0f, (j % 7) / 3.0f - 1.0f); });
      SCOPED_TRACE(describe(c));
      const Outcome ref = run_reference(in, c.options);
      const Outcome flash = run_flash(in, c.options, c.config);
      test::expect_variant_close(flash, ref, test::variants_relative_bound(in, c.options, cap),
                                 test::variant_magnitudes(in, c.options));
    }
}

// --- ALiBi --------------------------------------------------------------------------------------

TEST(FlashVariants, AlibiPaperSlopes) {
  for (int64_t H : {1, 3, 4, 8, 12})
    for (const Mask& mask : {Mask(), Mask::causal(), Mask::causal(CausalAlign::kTopLeft)}) {
      Case c{{2, 40, 57, H, H, 16, 16}, {}, {16, 16}};
      c.options.alibi_slopes = alibi_paper_slopes(H);
      c.options.mask = mask;
      c.seed = static_cast<uint64_t>(H);
      check(c);
    }
}

TEST(FlashVariants, AlibiRandomSlopesAndPositions) {
  for (const auto& [N, M] : std::vector<std::pair<int64_t, int64_t>>{{33, 33}, {20, 70}, {70, 20}, {1, 50}})
    for (const Mask& mask : {Mask(), Mask::causal(), Mask::causal(CausalAlign::kTopLeft)})
      for (int positions = 0; positions < 4; ++positions) {
        Case c{{2, N, M, 4, 2, 8, 8}, {}, {8, 16}};
        c.options.alibi_slopes = random_slopes(4, static_cast<uint64_t>(N + M));
        c.options.mask = mask;
        // Custom query positions, key positions, both; both far from 0 (relative offsets in the
        // kernel: 3·10^9 is no exact float, the differences are).
        if (positions & 1) c.options.q_positions = random_positions(N, 11, positions == 3 ? 3'000'000'000 : 0, 100);
        if (positions & 2) c.options.k_positions = random_positions(M, 12, positions == 3 ? 3'000'000'000 : 5, 100);
        c.seed = static_cast<uint64_t>(N * 3 + positions);
        check(c);
      }
}

TEST(FlashVariants, AlibiZeroSlopesEqualPlainAttentionBitForBit) {
  // Slopes of 0 take the variant tile loop, which must then compute exactly the plain scores, on
  // every set (the portable one failed once: the optimiser fused one tile product and not its twin).
  for (SimdIsa isa : test::flash_isas()) {
    const test::ScopedSimdIsa pin(isa);
    for (const Mask& mask : {Mask(), Mask::causal(), Mask::sliding_window(9, 3)}) {
      Case c{{2, 70, 81, 2, 2, 24, 20}, {}, {16, 32}};
      c.options.mask = mask;
      SCOPED_TRACE(describe(c) + ", isa " + flash_isa());
      const test::Inputs in = make_inputs(c);
      const Outcome plain = run_flash(in, c.options, c.config);
      c.options.alibi_slopes = {0.0f, 0.0f};
      const Outcome zero = run_flash(in, c.options, c.config);
      EXPECT_EQ(plain.out.to_vector(), zero.out.to_vector());
      EXPECT_EQ(plain.lse.to_vector(), zero.lse.to_vector());
      EXPECT_EQ(plain.grads.dq.to_vector(), zero.grads.dq.to_vector());
      EXPECT_EQ(plain.grads.dk.to_vector(), zero.grads.dk.to_vector());
      EXPECT_EQ(plain.grads.dv.to_vector(), zero.grads.dv.to_vector());
    }
  }
}

// --- all three, with every mask kind --------------------------------------------------------------

class FlashVariantsMasks : public ::testing::TestWithParam<size_t> {};

TEST_P(FlashVariantsMasks, MatchesReference) {
  const test::MaskCase mask_case = test::tile_mask_cases()[GetParam()];
  const uint64_t seed = 200 + GetParam();
  for (const GqaDims& s : {GqaDims{3, 65, 129, 4, 2, 32, 24}, GqaDims{2, 129, 65, 2, 1, 16, 16}})
    for (const FlashConfig& config : {FlashConfig{}, FlashConfig{16, 24}, FlashConfig{5, 7, 12}})
      for (int variant = 0; variant < 4; ++variant) {
        Case c{s, {}, config};
        c.options.mask = mask_case.make(query_dims(s));
        c.seed = seed + static_cast<uint64_t>(variant);
        if (variant == 1) c.options.softcap = 3.0f;
        if (variant == 2) c.options.alibi_slopes = alibi_paper_slopes(s.H);
        if (variant == 3) {  // all three, random slopes, custom key positions, dropout
          all_variants(c.options, s.H, 2.0f, false, seed);
          c.options.k_positions = random_positions(s.M, seed, 0, s.M);
          c.options.dropout = 0.25f;
          c.options.dropout_seed = seed;
          c.qk_range = 2.0f;
        }
        check(c);
      }
}
INSTANTIATE_TEST_SUITE_P(All, FlashVariantsMasks, ::testing::Range<size_t>(0, test::tile_mask_cases().size()),
                         [](const auto& info) { return test::tile_mask_cases()[info.param].name; });

TEST(FlashVariants, DropoutWithAllVariants) {
  for (float p : {0.1f, 0.5f})
    for (const Mask& mask : {Mask::causal() & Mask::key_padding({91, 40}), Mask::sliding_window(10, 10)})
      for (const FlashConfig& config : {FlashConfig{32, 16}, FlashConfig{16, 16, 16}}) {
        Case c{{2, 77, 91, 4, 2, 24, 24}, {}, config};
        all_variants(c.options, 4, 4.0f, true, 0);
        c.options.mask = mask;
        c.options.dropout = p;
        c.options.dropout_seed = 5;
        c.options.dropout_offset = 3;
        check(c);
      }
}

// --- odd sizes and tile tails ------------------------------------------------------------------------

TEST(FlashVariants, OddSizesAndTails) {
  // N, M, d, dv from 1 to 70: tails of the vector width (16 or 8), the micro-kernel (6 rows) and
  // the tiles (forced 5×7, 16×32, and the defaults).
  struct Size {
    int64_t N, M, d, dv;
  };
  const std::vector<Size> sizes = {{1, 1, 1, 1},    {2, 3, 5, 7},    {17, 33, 15, 9}, {63, 65, 64, 1},
                                   {70, 1, 3, 70},  {1, 70, 70, 2},  {33, 17, 48, 33}, {65, 64, 16, 17},
                                   {31, 47, 8, 31}, {64, 63, 33, 64}, {7, 70, 1, 5},  {70, 70, 70, 70}};
  size_t index = 0;
  for (const Size& z : sizes)
    for (const FlashConfig& config : {FlashConfig{}, FlashConfig{5, 7}, FlashConfig{16, 32}}) {
      Case c{{2, z.N, z.M, 4, 2, z.d, z.dv}, {}, config};
      all_variants(c.options, 4, 2.5f, index % 2 == 0, index);
      c.options.mask = index % 3 == 0 ? Mask() : index % 3 == 1 ? Mask::causal() : Mask::causal(CausalAlign::kTopLeft);
      if (index % 4 == 0) {
        c.options.dropout = 0.2f;
        c.options.dropout_seed = index;
      }
      c.strided = index % 2 == 1;
      c.seed = 40 + index;
      ++index;
      check(c);
    }
}

TEST(FlashVariants, TileSizes) {
  for (const FlashConfig& config : {FlashConfig{1, 1}, FlashConfig{3, 5}, FlashConfig{8, 8}, FlashConfig{64, 64},
                                    FlashConfig{7, 200}, FlashConfig{200, 7}, FlashConfig{6, 6, 6}}) {
    Case c{{2, 100, 150, 4, 1, 20, 12}, {}, config};
    all_variants(c.options, 4, 5.0f, true, 0);
    c.options.mask = Mask::causal() & Mask::key_padding({150, 77});
    check(c);
  }
}

// --- thread counts --------------------------------------------------------------------------------

TEST(FlashVariants, ThreadCountsAgreeBitForBit) {
  // With 2 threads: B·Hkv = 1 and 3 split the backward's key tiles between threads (dk, dv rows
  // still have one writer each; dq of split heads sums partials in thread order), 2 and 4 hand out
  // whole key/value heads with their groups.
  // backward_rows 64: whole heads (1 thread) are walked in chunks of 64 query rows, split key
  // tiles (2 threads) are not, and dk, dv must still be the same bits.
  for (const auto& [s, config] : std::vector<std::pair<GqaDims, FlashConfig>>{
           {{1, 300, 300, 4, 1, 32, 32}, {32, 32}},
           {{1, 300, 300, 4, 1, 32, 32}, {32, 32, 64}},
           {{1, 130, 200, 6, 3, 16, 8}, {32, 32}},
           {{1, 130, 200, 6, 3, 16, 8}, {16, 32, 48}},
           {{2, 130, 120, 4, 1, 16, 16}, {32, 32}},
           {{2, 90, 100, 8, 2, 8, 8}, {32, 32}}}) {
    Case c{s, {}, config};
    all_variants(c.options, s.H, 3.0f, true, 0);
    c.options.mask = Mask::causal();
    c.options.dropout = 0.1f;
    SCOPED_TRACE(describe(c));
    const test::Inputs in = make_inputs(c);
    Outcome one, two;
    {
      test::ScopedThreads threads(1);
      one = run_flash(in, c.options, c.config);
    }
    {
      test::ScopedThreads threads(2);
      two = run_flash(in, c.options, c.config);
    }
    // Forward tiles and backward key tiles (with the sums over a group) have one owner each.
    EXPECT_EQ(one.out.to_vector(), two.out.to_vector());
    EXPECT_EQ(one.lse.to_vector(), two.lse.to_vector());
    EXPECT_EQ(one.grads.dk.to_vector(), two.grads.dk.to_vector());
    EXPECT_EQ(one.grads.dv.to_vector(), two.grads.dv.to_vector());
    const double rel = test::variants_relative_bound(in, c.options);
    const test::VariantMagnitudes m = test::variant_magnitudes(in, c.options);
    if (s.B * s.Hkv % 2 == 0) {
      EXPECT_EQ(one.grads.dq.to_vector(), two.grads.dq.to_vector()) << "whole heads: dq has one writer";
    } else {  // dq sums per-thread partials: equal up to the order of a few additions
      test::expect_within(two.grads.dq, one.grads.dq, rel * std::max(max_abs(one.grads.dq), m.dq), "dq");
    }
    test::expect_variant_close(two, run_reference(in, c.options), rel, m);
    // The same run again: deterministic for a given thread count.
    test::ScopedThreads threads(2);
    const Outcome again = run_flash(in, c.options, c.config);
    EXPECT_EQ(two.grads.dq.to_vector(), again.grads.dq.to_vector());
    EXPECT_EQ(two.grads.dk.to_vector(), again.grads.dk.to_vector());
  }
}

TEST(FlashVariants, ThreadCountsAgreeForLongMqaHeads) {
  // MQA with 8 query heads and N = 1200 (no reference: its N×M work is too slow): the default
  // backward walks whole heads in chunks (the group's rows exceed 4 MiB), and with 2 threads it
  // splits the one key/value head's key tiles instead. dk and dv must not change.
  Case c{{1, 1200, 1200, 8, 1, 64, 64}, {}, {}};
  c.options.mask = Mask::causal();
  c.options.softcap = 20.0f;
  c.strided = false;
  const test::Inputs in = make_inputs(c);
  Outcome one, two;
  {
    test::ScopedThreads threads(1);
    one = run_flash(in, c.options, c.config);
  }
  {
    test::ScopedThreads threads(2);
    two = run_flash(in, c.options, c.config);
  }
  EXPECT_EQ(one.out.to_vector(), two.out.to_vector());
  EXPECT_EQ(one.grads.dk.to_vector(), two.grads.dk.to_vector());
  EXPECT_EQ(one.grads.dv.to_vector(), two.grads.dv.to_vector());
  const double rel = test::variants_relative_bound(in, c.options);
  test::expect_within(two.grads.dq, one.grads.dq,
                      rel * std::max(max_abs(one.grads.dq), test::variant_magnitudes(in, c.options).dq), "dq");
}

// --- fully masked rows --------------------------------------------------------------------------------

TEST(FlashVariants, FullyMaskedRowsGiveZeros) {
  // Bottom-right causal with N > M: queries 0..29 of item 0 see no key; item 1 has no keys at all.
  // Keys 35..39 of item 0 are padding, so no query sees them. Soft-cap and ALiBi change nothing
  // there: out 0, lse −inf, zero gradients (never NaN).
  const GqaDims s{2, 70, 40, 4, 2, 8, 8};
  const int64_t key_length = 35;
  Case c{s, {}, {16, 16}};
  all_variants(c.options, s.H, 2.0f, true, 0);
  c.options.mask = Mask::causal() & Mask::key_padding({key_length, 0});
  c.options.dropout = 0.2f;
  const test::Inputs in = make_inputs(c);
  const Outcome r = run_flash(in, c.options, c.config);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.N; ++i) {
        if (b == 0 && i >= s.N - s.M) continue;
        EXPECT_EQ(r.lse.at({b, h, i}), -INFINITY);
        for (int64_t e = 0; e < s.dv; ++e) ASSERT_EQ(r.out.at({b, i, h, e}), 0.0f) << b << " " << h << " " << i;
        for (int64_t e = 0; e < s.d; ++e) ASSERT_EQ(r.grads.dq.at({b, i, h, e}), 0.0f) << b << " " << h << " " << i;
      }
    for (int64_t hk = 0; hk < s.Hkv; ++hk)
      for (int64_t j = 0; j < s.M; ++j) {
        if (b == 0 && j < key_length) continue;
        for (int64_t e = 0; e < s.d; ++e) ASSERT_EQ(r.grads.dk.at({b, j, hk, e}), 0.0f) << b << " " << j;
        for (int64_t e = 0; e < s.dv; ++e) ASSERT_EQ(r.grads.dv.at({b, j, hk, e}), 0.0f) << b << " " << j;
      }
  }
  test::expect_variant_close(r, run_reference(in, c.options), test::variants_relative_bound(in, c.options),
                             test::variant_magnitudes(in, c.options));
}

// --- the entry point --------------------------------------------------------------------------------

TEST(FlashVariants, EntryPointRunsTheFlashKernelWithSinks) {
  // attention_forward / attention_backward take the flash kernel for every variant; sinks are
  // folded around it by the entry point, which must still match the reference.
  const GqaDims s{2, 33, 47, 4, 2, 16, 16};
  Case c{s, {}};
  all_variants(c.options, s.H, 4.0f, true, 0);
  c.options.mask = Mask::causal();
  c.options.sinks = test::random_tensor({s.H}, 5, -1.0f, 2.0f);
  const test::Inputs in = make_inputs(c);
  EXPECT_EQ(attention_forward_kernel(in.q, in.k, c.options), AttentionKernel::kFlash);
  Tensor out = Tensor::empty({s.B, s.N, s.H, s.dv}), lse = Tensor::empty({s.B, s.H, s.N});
  attention_forward(in.q, in.k, in.v, c.options, out, &lse);
  const AttentionSaved saved{in.q, in.k, in.v, out, lse};
  EXPECT_EQ(attention_backward_kernel(saved, c.options), AttentionKernel::kFlash);
  Outcome flash{out, lse, {Tensor::empty(in.q.shape()), Tensor::empty(in.k.shape()), Tensor::empty(in.v.shape())}};
  flash.grads.dsinks = Tensor::empty({s.H});
  attention_backward(saved, in.g, c.options, flash.grads);

  Outcome ref = run_reference(in, c.options);
  Tensor dsinks = Tensor::empty({s.H});
  AttentionGrads ref_grads{ref.grads.dq, ref.grads.dk, ref.grads.dv, dsinks};
  attention_reference_backward({in.q, in.k, in.v, ref.out, Tensor()}, in.g, c.options, ref_grads);
  const double rel = test::variants_relative_bound(in, c.options);
  test::expect_variant_close(flash, ref, rel, test::variant_magnitudes(in, c.options));
  // dsinks sums −p_σ·D over B·N rows, each D a dv-long dot of magnitude <= dv·max|dO|·max|O|.
  const double dsink_scale = static_cast<double>(s.B * s.N * s.dv) * max_abs(in.g) * max_abs(ref.out);
  test::expect_within(flash.grads.dsinks, dsinks, rel * dsink_scale, "dsinks");
}

// The bf16 SIMD path runs the same tile loops over bf16 operands (attention/flash_detail.h): with
// GQA and both score variants it must match the fp32 reference on the same (bf16) values up to
// the bf16 rounding of the products' other operands (P, dO, P∘z, dS: 2^-9 relative each; 8·2^-9
// covers the few roundings each result goes through).
TEST(FlashVariants, Bf16SimdPathRunsTheVariants) {
  const GqaDims s{2, 45, 60, 4, 2, 16, 16};
  Case c{s, {}, {16, 32}};
  all_variants(c.options, s.H, 3.0f, true, 0);
  c.options.mask = Mask::causal();
  const test::Inputs in = make_inputs(c);
  const auto to_bf16 = [](const Tensor& t) {
    const Tensor x = t.contiguous();
    Tensor r = Tensor::empty(x.shape(), DType::BF16);
    float_to_bf16(x.data<float>(), r.data<bf16>(), x.numel());
    return r;
  };
  const auto widened = [](const Tensor& t) {
    Tensor r = Tensor::empty(t.shape());
    bf16_to_float(t.data<bf16>(), r.data<float>(), t.numel());
    return r;
  };
  const Tensor q16 = to_bf16(in.q), k16 = to_bf16(in.k), v16 = to_bf16(in.v);
  const test::Inputs wide{widened(q16), widened(k16), widened(v16), in.g};
  const Outcome ref = run_reference(wide, c.options);
  Outcome r{Tensor::empty({s.B, s.N, s.H, s.dv}), Tensor::empty({s.B, s.H, s.N}),
            {Tensor::empty(in.q.shape()), Tensor::empty(in.k.shape()), Tensor::empty(in.v.shape())}};
  detail::attention_flash_bf16_forward_simd(q16, k16, v16, c.options, r.out, &r.lse, c.config);
  detail::attention_flash_bf16_backward_simd({q16, k16, v16, r.out, r.lse}, in.g, c.options, r.grads, c.config);
  test::expect_variant_close(r, ref, test::variants_relative_bound(wide, c.options) + 8.0 * 0x1p-9,
                             test::variant_magnitudes(wide, c.options));
}

TEST(FlashVariants, SupportsEveryCombination) {
  AttentionOptions o;
  EXPECT_TRUE(flash_supports_variants(8, 8, o));
  EXPECT_TRUE(flash_supports_variants(8, 1, o));
  o.softcap = 30.0f;
  o.alibi_slopes = alibi_paper_slopes(8);
  EXPECT_TRUE(flash_supports_variants(8, 2, o));
}

TEST(FlashVariants, RejectsBadVariantOptions) {
  const Tensor q = Tensor::zeros({1, 4, 2, 2}), k = Tensor::zeros({1, 5, 1, 2}), v = Tensor::zeros({1, 5, 1, 3});
  Tensor out = Tensor::zeros({1, 4, 2, 3});
  AttentionOptions o;
  o.alibi_slopes = {0.5f};  // one per query head: 2 expected
  EXPECT_THROW(attention_flash_forward(q, k, v, o, out), Error);
  o.alibi_slopes = {0.5f, 0.25f};
  o.k_positions = {0, 1};  // M = 5 expected
  EXPECT_THROW(attention_flash_forward(q, k, v, o, out), Error);
  o.k_positions.clear();
  o.softcap = -1.0f;
  EXPECT_THROW(attention_flash_forward(q, k, v, o, out), Error);
  // 2 query heads over 3 key/value heads is no group.
  EXPECT_THROW(attention_flash_forward(q, Tensor::zeros({1, 5, 3, 2}), Tensor::zeros({1, 5, 3, 3}), {}, out), Error);
}

}  // namespace
}  // namespace cabm
