// Tier 2 of the attention tests: the flash kernels (forward and backward) against the reference
// kernels, over odd sizes and tails, every mask kind, dropout, tile sizes and thread counts.
#include "kernels/attention.h"
#include "kernels/attention_flash.h"
#include "kernels/attention_reference.h"
#include "kernels/attention_simd.h"
#include "kernels/block_sparse.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace cabm {
namespace {

struct Dims {
  int64_t B, N, M, H, d, dv;
};

std::string describe(const Dims& s) {
  return "B=" + std::to_string(s.B) + " N=" + std::to_string(s.N) + " M=" + std::to_string(s.M) +
         " H=" + std::to_string(s.H) + " d=" + std::to_string(s.d) + " dv=" + std::to_string(s.dv);
}

// Tolerances. Each kernel's error against exact math is bounded as in Higham (2002, §3.1): a float
// sum or dot product of L terms is off by at most γ_L = L·u/(1 − L·u) times the sum of the terms'
// magnitudes, u = 2^-24. A score is off by γ_d·smax (smax bounds |scale·q·k| + |bias|), a weight
// exp(s − lse) by a relative 2·γ_d·smax plus a few u (exp's polynomial is within 4u; 8u covers it
// with the division and the maximum), the output o = Σ a v by γ_M more, relative to max|v|.
// Gradients add the dv-long dots dP = dO·V, D = dO·O and the N- or M-long sums of dQ, dK, dV. We
// apply that relative bound to the largest element of each tensor (norm-wise), and twice over,
// because both kernels being compared carry it.
constexpr double kU = 0x1p-24;
double gamma_n(int64_t n) { return static_cast<double>(n) * kU / (1.0 - static_cast<double>(n) * kU); }
double relative_bound(const Dims& s, double smax) {
  return 2.0 * (2.0 * gamma_n(s.d) * smax + 2.0 * gamma_n(s.dv) + gamma_n(std::max(s.N, s.M)) + 8.0 * kU);
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (float x : t.to_vector())
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

double smax_bound(const Tensor& q, const Tensor& k, const AttentionOptions& options) {
  double bias = 0;
  for (const Tensor& t : options.mask.biases()) bias += max_abs(t);
  return attention_scale(options, q.size(3)) * static_cast<double>(q.size(3)) * max_abs(q) * max_abs(k) + bias;
}

// A [B, L, H, d] head view; strided: heads of a [B, L, 2, H, d + 1] buffer.
Tensor make_heads(int64_t B, int64_t L, int64_t H, int64_t d, uint64_t seed, bool strided, float lo = -1.0f,
                  float hi = 1.0f) {
  if (!strided) return test::random_tensor({B, L, H, d}, seed, lo, hi);
  return test::random_tensor({B, L, 2, H, d + 1}, seed, lo, hi).select(2, 1).narrow(3, 0, d);
}

Tensor random_bool(const Shape& shape, uint64_t seed, float p_true) {
  Tensor t = Tensor::empty(shape, DType::BOOL);
  Rng rng(seed);
  uint8_t* p = t.data<uint8_t>();
  for (int64_t n = 0; n < t.numel(); ++n) p[n] = rng.next_uniform() < p_true;
  return t;
}

// ---------------------------------------------------------------------------------------------

struct Outcome {
  Tensor out, lse;
  AttentionGrads grads;
};

Outcome run_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const AttentionOptions& options,
                  bool backward) {
  Outcome r;
  r.out = Tensor::empty({q.size(0), q.size(1), q.size(2), v.size(3)});
  r.lse = Tensor::empty({q.size(0), q.size(2), q.size(1)});
  attention_reference_forward(q, k, v, options, r.out, nullptr, &r.lse);
  if (backward) {
    r.grads = {Tensor::full(q.shape(), NAN), Tensor::full(k.shape(), NAN), Tensor::full(v.shape(), NAN)};
    attention_reference_backward({q, k, v, r.out, Tensor()}, g, options, r.grads);
  }
  return r;
}

// Flash with strided outputs: out inside a wider buffer, gradients as head views of one buffer.
Outcome run_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const AttentionOptions& options,
              const FlashConfig& config, bool backward) {
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2), d = q.size(3), M = k.size(1), dv = v.size(3);
  Outcome r;
  r.out = Tensor::full({B, N, H, dv + 3}, NAN).narrow(3, 1, dv);
  r.lse = Tensor::full({B, H, N}, NAN);
  attention_flash_forward(q, k, v, options, r.out, &r.lse, config);
  if (backward) {
    const Tensor kv_grads = Tensor::full({B, M, H, d + dv}, NAN);
    r.grads = {Tensor::full({B, N, H, d + 1}, NAN).narrow(3, 0, d), kv_grads.narrow(3, 0, d),
               kv_grads.narrow(3, d, dv)};
    attention_flash_backward({q, k, v, r.out, r.lse}, g, options, r.grads, config);
  }
  return r;
}

void expect_close(const Tensor& actual, const Tensor& expected, double rel, double magnitude, const char* what) {
  const auto cmp = test::compare(actual, expected, 0.0, rel * magnitude);
  EXPECT_TRUE(cmp.ok) << what << ": max |diff| " << cmp.max_abs_diff << " > tolerance " << rel * magnitude
                      << "; first mismatch " << cmp.first_bad;
}

// The magnitudes the relative bound applies to. The output is an average of rows of v. dS =
// P∘(dP − D) is computed from dot products of length dv bounded by dv·max|dO|·max|v|, so its error
// is relative to that, not to dS itself (which can be exactly 0: with one key, softmax is
// constant); dQ = scale·Σ_j dS K sums it with weights P (Σ_j P = 1), dK = scale·Σ_i dSᵀ Q with the
// column sums of P, N/M on average: we use max(1, ⌈N/M⌉).
struct Magnitudes {
  double out, ds, dq, dk;
};
Magnitudes magnitudes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                      const AttentionOptions& options) {
  const double scale = attention_scale(options, q.size(3));
  const double ds = static_cast<double>(v.size(3)) * max_abs(g) * max_abs(v);
  const double column_sum = std::max<double>(1.0, std::ceil(static_cast<double>(q.size(1)) / k.size(1)));
  return {max_abs(v) / (1.0 - options.dropout), ds, scale * max_abs(k) * ds, scale * max_abs(q) * ds * column_sum};
}

void compare_runs(const Outcome& flash, const Outcome& ref, double rel, const Magnitudes& m, bool backward) {
  expect_close(flash.out, ref.out, rel, m.out, "out");
  expect_close(flash.lse, ref.lse, rel, 1.0 + max_abs(ref.lse), "lse");
  if (!backward) return;
  expect_close(flash.grads.dq, ref.grads.dq, rel, std::max(max_abs(ref.grads.dq), m.dq), "dq");
  expect_close(flash.grads.dk, ref.grads.dk, rel, std::max(max_abs(ref.grads.dk), m.dk), "dk");
  expect_close(flash.grads.dv, ref.grads.dv, rel, max_abs(ref.grads.dv), "dv");
}

struct Check {
  Dims s;
  AttentionOptions options;
  FlashConfig config{};
  bool backward = true;
  bool strided = true;
  uint64_t seed = 1;
  float lo = -1.0f, hi = 1.0f;  // range of q and k
};

void check(const Check& c) {
  SCOPED_TRACE(describe(c.s) + " tiles " + std::to_string(c.config.block_q) + "x" + std::to_string(c.config.block_k) +
               " backward rows " + std::to_string(c.config.backward_rows));
  const Dims& s = c.s;
  const Tensor q = make_heads(s.B, s.N, s.H, s.d, c.seed, c.strided, c.lo, c.hi);
  const Tensor k = make_heads(s.B, s.M, s.H, s.d, c.seed + 1, c.strided, c.lo, c.hi);
  const Tensor v = make_heads(s.B, s.M, s.H, s.dv, c.seed + 2, c.strided);
  const Tensor g = make_heads(s.B, s.N, s.H, s.dv, c.seed + 3, c.strided);
  const Outcome ref = run_reference(q, k, v, g, c.options, c.backward);
  const Outcome flash = run_flash(q, k, v, g, c.options, c.config, c.backward);
  const double rel = relative_bound(s, smax_bound(q, k, c.options));
  compare_runs(flash, ref, rel, magnitudes(q, k, v, g, c.options), c.backward);
}

// --- sizes and tails --------------------------------------------------------------------------

// A sample of N, M ∈ {1, 2, 17, 63, 64, 65, 127, 128, 129, 257, 1000} × d ∈ {1, 8, 32, 64, 80, 128}
// in which every value of each appears, with and without a causal mask; the full cross product
// would take minutes in the (scalar, N×M) reference.
struct SizeCase {
  int64_t N, M, d;
};
const std::vector<SizeCase>& size_cases() {
  static const std::vector<SizeCase> cases = {
      {1, 1, 1},     {2, 1, 8},     {1, 17, 32},    {17, 2, 64},     {63, 64, 80},   {64, 63, 128},
      {65, 65, 8},   {127, 129, 32}, {128, 127, 64}, {129, 128, 1},  {257, 65, 80},  {65, 257, 128},
      {1000, 17, 64}, {17, 1000, 32}, {257, 257, 128}, {128, 1000, 8}, {1000, 128, 80}, {63, 63, 1},
      {2, 2, 80},    {1000, 1000, 64}, {129, 127, 128}, {64, 64, 64},
  };
  return cases;
}

class FlashSizes : public ::testing::TestWithParam<size_t> {};

TEST_P(FlashSizes, MatchesReference) {
  const SizeCase sc = size_cases()[GetParam()];
  // Keep each case's reference work (B·H·N·M·d) near 10^7 multiply-adds.
  const int64_t heads = sc.N * sc.M * sc.d > 4'000'000 ? 1 : 2;
  const Dims s{heads, sc.N, sc.M, heads, sc.d, sc.d == 80 ? 48 : sc.d};
  for (int variant = 0; variant < 2; ++variant) {
    Check c{s, {}};
    c.seed = 10 + GetParam();
    if (variant == 1) {
      c.options.mask = Mask::causal();
      c.config = {16, 32};
      c.strided = false;
    }
    if (GetParam() % 3 == 0) {
      c.options.dropout = 0.2f;
      c.options.dropout_seed = GetParam();
    }
    check(c);
  }
}
INSTANTIATE_TEST_SUITE_P(Sample, FlashSizes, ::testing::Range<size_t>(0, size_cases().size()), [](const auto& info) {
  const SizeCase c = size_cases()[info.param];
  return "N" + std::to_string(c.N) + "_M" + std::to_string(c.M) + "_d" + std::to_string(c.d);
});

// --- every mask kind ---------------------------------------------------------------------------

struct MaskCase {
  std::string name;
  std::function<Mask(const Dims&)> make;
};

BlockSparseLayout random_layout(const Dims& s, int64_t bq, int64_t bk, uint64_t seed) {
  return {bq, bk, random_bool({s.H, (s.N + bq - 1) / bq, (s.M + bk - 1) / bk}, seed, 0.4f)};
}

std::vector<MaskCase> mask_cases() {
  return {
      {"none", [](const Dims&) { return Mask(); }},
      {"causal", [](const Dims&) { return Mask::causal(); }},
      {"causal_top_left", [](const Dims&) { return Mask::causal(CausalAlign::kTopLeft); }},
      {"key_padding",
       [](const Dims& s) {
         std::vector<int64_t> lengths;
         for (int64_t b = 0; b < s.B; ++b) lengths.push_back(b == 0 ? s.M : 0);  // item 1: no keys at all
         if (s.B > 2) lengths[2] = s.M / 3 + 1;
         return Mask::key_padding(lengths);
       }},
      {"sliding_window", [](const Dims&) { return Mask::sliding_window(20, 5); }},
      {"window_narrow", [](const Dims&) { return Mask::sliding_window(0, 1); }},
      {"window_left_causal", [](const Dims&) { return Mask::causal() & Mask::sliding_window(33, Mask::kUnbounded); }},
      {"block_sparse_aligned", [](const Dims& s) { return Mask::block_sparse(random_layout(s, 16, 16, 21)); }},
      {"block_sparse_odd", [](const Dims& s) { return Mask::block_sparse(random_layout(s, 5, 7, 22)); }},
      {"bigbird",
       [](const Dims& s) {
         return Mask::block_sparse(bigbird_layout(
             s.N, s.M, {.block = 16, .local_blocks = 1, .global_blocks = 1, .random_blocks = 1, .heads = s.H, .seed = 4}));
       }},
      {"allow_nm",
       [](const Dims& s) {
         Tensor allowed = random_bool({s.N, s.M}, 23, 0.7f);
         for (int64_t j = 0; j < s.M; ++j) allowed.data<uint8_t>()[3 * s.M + j] = 0;  // row 3 fully blocked
         return Mask::allow(allowed);
       }},
      {"allow_bhnm_blocky",
       [](const Dims& s) {
         // Whole 32×32 regions blocked, so that some tiles are skipped after the per-element scan.
         Tensor allowed = Tensor::empty({s.B, s.H, s.N, s.M}, DType::BOOL);
         uint8_t* p = allowed.data<uint8_t>();
         for (int64_t n = 0; n < allowed.numel(); ++n) {
           const int64_t j = n % s.M, i = n / s.M % s.N;
           p[n] = ((i / 32 + j / 32) % 3) != 1;
         }
         return Mask::allow(allowed);
       }},
      {"additive_hnm",
       [](const Dims& s) {
         Tensor bias = test::random_tensor({s.H, s.N, s.M}, 24, -3.0f, 3.0f);
         for (int64_t n = 0; n < bias.numel(); n += 7) bias.data<float>()[n] = -INFINITY;
         return Mask::additive(bias);
       }},
      {"additive_broadcast_m", [](const Dims& s) { return Mask::additive(test::random_tensor({s.M}, 25, -1.0f, 1.0f)); }},
      {"causal_padding_additive",
       [](const Dims& s) {
         std::vector<int64_t> lengths(static_cast<size_t>(s.B), s.M - 3);
         return Mask::causal() & Mask::key_padding(lengths) &
                Mask::additive(test::random_tensor({s.N, s.M}, 26, -1.0f, 1.0f));
       }},
      {"window_block_allow",
       [](const Dims& s) {
         return Mask::sliding_window(40, 10) & Mask::block_sparse(random_layout(s, 8, 8, 27)) &
                Mask::allow(random_bool({s.B, 1, s.N, s.M}, 28, 0.8f));
       }},
  };
}

class FlashMasks : public ::testing::TestWithParam<size_t> {};

TEST_P(FlashMasks, MatchesReference) {
  const MaskCase mask_case = mask_cases()[GetParam()];
  for (const Dims& s : {Dims{3, 65, 129, 2, 32, 24}, Dims{2, 129, 65, 1, 16, 16}}) {
    // {16, 24, 32} and {5, 7, 12}: the backward walks the query rows in chunks of 32 and 15.
    for (const FlashConfig& config :
         {FlashConfig{}, FlashConfig{16, 24}, FlashConfig{5, 7}, FlashConfig{16, 24, 32}, FlashConfig{5, 7, 12}}) {
      Check c{s, {}, config};
      c.options.mask = mask_case.make(s);
      c.seed = 100 + GetParam();
      check(c);
    }
  }
}
INSTANTIATE_TEST_SUITE_P(All, FlashMasks, ::testing::Range<size_t>(0, mask_cases().size()),
                         [](const auto& info) { return mask_cases()[info.param].name; });

TEST(Flash, DropoutWithMasks) {
  for (float p : {0.1f, 0.5f}) {
    Check c{{2, 77, 91, 2, 24, 24}, {}, {32, 16}};
    c.options.dropout = p;
    c.options.dropout_seed = 5;
    c.options.dropout_offset = 3;
    c.options.mask = Mask::causal() & Mask::key_padding({91, 40});
    check(c);
    c.options.mask = Mask::sliding_window(10, 10);
    c.config = {};
    check(c);
    c.config = {16, 16, 16};  // backward in chunks of 16 query rows
    check(c);
  }
}

// --- tile sizes and thread counts --------------------------------------------------------------

TEST(Flash, TileSizes) {
  for (const FlashConfig& config :
       {FlashConfig{1, 1}, FlashConfig{3, 5}, FlashConfig{8, 8}, FlashConfig{16, 32}, FlashConfig{64, 64},
        FlashConfig{128, 32}, FlashConfig{7, 200}, FlashConfig{200, 7}}) {
    Check c{{2, 100, 150, 2, 20, 12}, {}, config};
    c.options.mask = Mask::causal() & Mask::key_padding({150, 77});
    check(c);
  }
}

TEST(Flash, ThreadCountsAgree) {
  // One head (split across threads in the backward), and three (an odd number).
  for (const Dims& s : {Dims{1, 300, 300, 1, 32, 32}, Dims{1, 130, 200, 3, 16, 8}}) {
    SCOPED_TRACE(describe(s));
    AttentionOptions options;
    options.mask = Mask::causal();
    const Tensor q = make_heads(s.B, s.N, s.H, s.d, 1, true), k = make_heads(s.B, s.M, s.H, s.d, 2, true);
    const Tensor v = make_heads(s.B, s.M, s.H, s.dv, 3, true), g = make_heads(s.B, s.N, s.H, s.dv, 4, true);
    Outcome one, two;
    {
      test::ScopedThreads threads(1);
      one = run_flash(q, k, v, g, options, {32, 32}, true);
    }
    {
      test::ScopedThreads threads(2);
      two = run_flash(q, k, v, g, options, {32, 32}, true);
    }
    // Forward tiles and backward key tiles have one owner each: identical bits for any thread count.
    EXPECT_EQ(one.out.to_vector(), two.out.to_vector());
    EXPECT_EQ(one.lse.to_vector(), two.lse.to_vector());
    EXPECT_EQ(one.grads.dk.to_vector(), two.grads.dk.to_vector());
    EXPECT_EQ(one.grads.dv.to_vector(), two.grads.dv.to_vector());
    // dq sums per-thread partials: equal up to the order of a few additions.
    const double rel = relative_bound(s, smax_bound(q, k, options));
    const Magnitudes m = magnitudes(q, k, v, g, options);
    expect_close(two.grads.dq, one.grads.dq, rel, std::max(max_abs(one.grads.dq), m.dq), "dq");
    const Outcome ref = run_reference(q, k, v, g, options, true);
    compare_runs(two, ref, rel, m, true);
  }
}

// --- edge cases -----------------------------------------------------------------------------------

TEST(Flash, FullyMaskedRowsAndKeysGiveZeros) {
  const Dims s{2, 70, 40, 2, 8, 8};
  AttentionOptions options;
  // Bottom-right causal with N > M: queries 0..29 see no key; item 1 has no keys at all. Keys
  // 35..39 of item 0 are padding, so no query sees them.
  options.mask = Mask::causal() & Mask::key_padding({35, 0});
  const Tensor q = make_heads(s.B, s.N, s.H, s.d, 1, true), k = make_heads(s.B, s.M, s.H, s.d, 2, true);
  const Tensor v = make_heads(s.B, s.M, s.H, s.dv, 3, true), g = make_heads(s.B, s.N, s.H, s.dv, 4, true);
  const Outcome r = run_flash(q, k, v, g, options, {16, 16}, true);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t i = 0; i < s.N; ++i) {
        if (b == 0 && i >= 30) continue;
        EXPECT_EQ(r.lse.at({b, h, i}), -INFINITY);
        for (int64_t c = 0; c < s.dv; ++c) ASSERT_EQ(r.out.at({b, i, h, c}), 0.0f) << b << " " << i;
        for (int64_t c = 0; c < s.d; ++c) ASSERT_EQ(r.grads.dq.at({b, i, h, c}), 0.0f) << b << " " << i;
      }
      for (int64_t j = 0; j < s.M; ++j) {
        if (b == 0 && j < 35) continue;
        for (int64_t c = 0; c < s.d; ++c) ASSERT_EQ(r.grads.dk.at({b, j, h, c}), 0.0f);
        for (int64_t c = 0; c < s.dv; ++c) ASSERT_EQ(r.grads.dv.at({b, j, h, c}), 0.0f);
      }
    }
  const Outcome ref = run_reference(q, k, v, g, options, true);
  compare_runs(r, ref, relative_bound(s, smax_bound(q, k, options)), magnitudes(q, k, v, g, options), true);
}

TEST(Flash, SingleKey) {
  for (int64_t N : {1, 9, 70}) {
    Check c{{2, N, 1, 2, 16, 16}, {}};
    check(c);
    c.options.mask = Mask::key_padding({1, 0});
    check(c);
  }
}

TEST(Flash, VeryLargeLogits) {
  // Scaled scores up to ±1.5·10^4 (|q|, |k| <= 30, d = 64, scale 1/8): exp overflows unless every
  // exponent is taken relative to the running maximum. Softmax then is nearly one-hot.
  for (const AttentionOptions& options : {AttentionOptions{}, AttentionOptions{.mask = Mask::causal(), .scale = {}}}) {
    Check c{{1, 150, 140, 2, 64, 32}, options, {32, 32}};
    c.lo = -30.0f;
    c.hi = 30.0f;
    c.seed = 7;
    check(c);
  }
  // Exactly known: scores ±10^4 around one winner per row.
  const Dims s{1, 40, 50, 1, 1, 4};
  const Tensor q = Tensor::full({1, 40, 1, 1}, 100.0f);
  Tensor k = test::random_tensor({1, 50, 1, 1}, 9, -100.0f, 99.0f);
  k.data<float>()[17] = 100.0f;  // the largest score of every row: 10^4
  const Tensor v = make_heads(1, 50, 1, 4, 10, false);
  AttentionOptions options;
  options.scale = 1.0f;
  Tensor out = Tensor::empty({1, 40, 1, 4}), lse = Tensor::empty({1, 1, 40});
  attention_flash_forward(q, k, v, options, out, &lse, {16, 16});
  for (int64_t i = 0; i < 40; ++i) {
    EXPECT_NEAR(lse.at({0, 0, i}), 1e4, 1e4 * 4 * kU);
    for (int64_t c = 0; c < 4; ++c) EXPECT_NEAR(out.at({0, i, 0, c}), v.at({0, 17, 0, c}), 1e-6);
  }
  (void)s;
}

TEST(Flash, HeadDimAndValueDimDiffer) {
  for (const Dims& s : {Dims{1, 33, 47, 2, 3, 17}, Dims{2, 20, 20, 1, 70, 5}}) {
    Check c{s, {}, {8, 16}};
    c.options.mask = Mask::sliding_window(6, 6);
    check(c);
  }
}

TEST(Flash, ExplicitScale) {
  Check c{{1, 50, 60, 2, 16, 16}, {}};
  c.options.scale = 0.9f;
  check(c);
}

TEST(Flash, WorkIsSkippedOutsideTheMask) {
  // A window of 2 keys over 4096 queries with 16-key tiles: forward and backward visit O(N) tiles.
  // Outputs far from the window must be exactly what a 3-key problem gives.
  const Dims s{1, 4096, 4096, 1, 8, 8};
  AttentionOptions options;
  options.mask = Mask::sliding_window(1, 0);
  const Tensor q = make_heads(s.B, s.N, s.H, s.d, 1, false), k = make_heads(s.B, s.M, s.H, s.d, 2, false);
  const Tensor v = make_heads(s.B, s.M, s.H, s.dv, 3, false), g = make_heads(s.B, s.N, s.H, s.dv, 4, false);
  const Outcome r = run_flash(q, k, v, g, options, {16, 16}, true);
  const Outcome ref = run_reference(q, k, v, g, options, true);
  compare_runs(r, ref, relative_bound(s, smax_bound(q, k, options)), magnitudes(q, k, v, g, options), true);
}

// --- pieces: exp2, dispatch, validation -----------------------------------------------------------

TEST(FlashSimd, Exp2NonPositive) {
  std::vector<float> x;
  for (float t = -130.0f; t <= 0.0f; t += 0.0137f) x.push_back(t);
  x.insert(x.end(), {-INFINITY, -126.0f, -125.99f, -0.5f, 0.5e-7f, -1e-30f, 0.0f, 1e-6f});
  while (x.size() % simd::kWidth) x.push_back(0.0f);
  std::vector<float> y(x.size());
  for (size_t n = 0; n < x.size(); n += simd::kWidth)
    simd::store(&y[n], simd::exp2_nonpositive(simd::load(&x[n])));
  for (size_t n = 0; n < x.size(); ++n) {
    if (x[n] < -126.0f) {
      EXPECT_EQ(y[n], 0.0f) << x[n];
    } else {
      // Polynomial error < 2e-7 plus a few roundings of the evaluation; tiny positive arguments
      // (rounding residues) work too.
      const double expected = std::exp2(static_cast<double>(x[n]));
      EXPECT_NEAR(y[n] / expected, 1.0, 8 * kU) << x[n];
    }
  }
}

TEST(FlashDispatch, PicksFlashUnlessLseIsMissing) {
  const Dims s{1, 20, 30, 2, 8, 8};
  AttentionOptions options;
  options.mask = Mask::causal();
  const Tensor q = make_heads(s.B, s.N, s.H, s.d, 1, false), k = make_heads(s.B, s.M, s.H, s.d, 2, false);
  const Tensor v = make_heads(s.B, s.M, s.H, s.dv, 3, false), g = make_heads(s.B, s.N, s.H, s.dv, 4, false);
  Tensor out = Tensor::empty({1, 20, 2, 8}), lse = Tensor::empty({1, 2, 20});
  attention_forward(q, k, v, options, out, &lse);
  const Outcome flash = run_flash(q, k, v, g, options, {}, true);
  EXPECT_EQ(out.to_vector(), flash.out.to_vector());
  EXPECT_EQ(attention_forward_kernel(options), AttentionKernel::kFlash);

  AttentionGrads grads{Tensor::empty(q.shape()), Tensor::empty(k.shape()), Tensor::empty(v.shape())};
  attention_backward({q, k, v, out, lse}, g, options, grads);
  EXPECT_EQ(grads.dq.to_vector(), flash.grads.dq.to_vector());
  EXPECT_EQ(grads.dv.to_vector(), flash.grads.dv.to_vector());

  const AttentionSaved without_lse{q, k, v, out, Tensor()};
  EXPECT_EQ(attention_backward_kernel(without_lse, options), AttentionKernel::kReference);
  attention_backward(without_lse, g, options, grads);
  const AttentionGrads ref{Tensor::empty(q.shape()), Tensor::empty(k.shape()), Tensor::empty(v.shape())};
  attention_reference_backward(without_lse, g, options, ref);
  EXPECT_EQ(grads.dk.to_vector(), ref.dk.to_vector());
}

TEST(FlashValidation, RejectsBadArguments) {
  const Tensor q = Tensor::zeros({1, 4, 1, 2}), k = Tensor::zeros({1, 5, 1, 2}), v = Tensor::zeros({1, 5, 1, 3});
  Tensor out = Tensor::zeros({1, 4, 1, 3});
  Tensor bad_lse = Tensor::zeros({1, 4, 1});
  EXPECT_THROW(attention_flash_forward(q, k, v, {}, out, &bad_lse), Error);
  EXPECT_THROW(attention_flash_forward(q, k, Tensor::zeros({1, 4, 1, 3}), {}, out), Error);
  const AttentionGrads grads{Tensor::zeros(q.shape()), Tensor::zeros(k.shape()), Tensor::zeros(v.shape())};
  EXPECT_THROW(attention_flash_backward({q, k, v, out, Tensor()}, out, {}, grads), Error);
  AttentionOptions options;
  options.mask = Mask::key_padding({6});  // longer than M
  EXPECT_THROW(attention_flash_forward(q, k, v, options, out), Error);
  EXPECT_THROW(attention_flash_forward(q, k, v, {}, out, nullptr, {-1, 4}), Error);
}

}  // namespace
}  // namespace cabm
