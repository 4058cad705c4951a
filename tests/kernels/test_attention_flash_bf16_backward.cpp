// The bf16 flash backward (after the bf16 forward) against the fp32 reference attention on the
// same bf16-rounded inputs, and its paths against the portable one from the same saved output
// and lse: sizes and tails, every mask kind, dropout with masks, tile sizes, thread counts, fully
// masked rows and keys, very large logits, explicit scales, bad arguments. The forward:
// test_attention_flash_bf16.cpp; shared helpers and the
// tolerances, with their derivation: util/flash_bf16_cases.h.
#include "cabm/core/threads.h"
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/attention/reference.h"
#include "util/attention_cases.h"
#include "util/flash_bf16_cases.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

// Inside the helpers' namespace: test::'s names (Dims, FlashCase, Outcome, expect_within, ...) and
// util/flash_bf16_cases.h's without using-declarations.
namespace cabm::test::flash_bf16 {
namespace {

struct Bounds {
  double rel;                      // fp32 relative bound
  double smax;                     // bound on |scores|
  double out, dq, dk, dv;          // against the reference (absolute)
  double p_out, p_dq, p_dk, p_dv;  // path against path (absolute)
};

Bounds derive_bounds(const Inputs& in, const AttentionOptions& options, const Outcome& ref) {
  const Dims& s = in.s;
  const WeightStats w = weight_stats(in, options);
  const double u = kUBf16, keep = 1.0 / (1.0 - options.dropout), scale = attention_scale(options, s.d);
  const double qmax = max_abs(in.q.f32), kmax = max_abs(in.k.f32), vmax = max_abs(in.v.f32), gmax = max_abs(in.g);
  const double dv = static_cast<double>(s.dv);
  Bounds b{};
  b.smax = test::smax_bound(scale, in.q.f32, in.k.f32, options.mask);
  b.rel = 2.0 * test::relative_bound(s, b.smax);
  // fp32 magnitudes as in test_attention_flash.cpp (dS from dv-long dots; dK with column sums).
  const double ds_mag = dv * gmax * vmax;
  const double fp32_out = b.rel * keep * vmax;
  const double fp32_dq = b.rel * std::max(max_abs(ref.grads.dq), scale * kmax * ds_mag);
  const double fp32_dk = b.rel * std::max(max_abs(ref.grads.dk), scale * qmax * ds_mag * std::max(1.0, w.col_p));
  const double fp32_dv = b.rel * std::max(max_abs(ref.grads.dv), gmax * std::max(1.0, w.col_a));

  b.out = kUWeights * keep * vmax + fp32_out;
  const double c = keep * dv * gmax * vmax;
  // P, recomputed with the forward's polynomial, is off by eps more in dV's and dS's terms.
  const double eps = detail::kExp2PRelError;
  const double e = (1.0 + u) * (u * c + dv * gmax * b.out) + 2.0 * (u + eps) * c;
  b.dv = (2.0 * u + u * u + eps) * gmax * w.col_a + fp32_dv;
  b.dq = scale * kmax * e + fp32_dq;
  b.dk = scale * qmax * e * w.col_p + fp32_dk;

  // One flip (2u relative) of the largest term: a·v, a·dO, scale·dS·k, scale·dS·q with |dS| ≤ 2·P·C.
  b.p_out = fp32_out + 2.0 * u * w.max_a * vmax;
  b.p_dv = fp32_dv + 2.0 * u * w.max_a * gmax;
  b.p_dq = fp32_dq + 2.0 * u * scale * 2.0 * w.max_p * c * kmax;
  b.p_dk = fp32_dk + 2.0 * u * scale * 2.0 * w.max_p * c * qmax;
  return b;
}

// ‖a − b‖₂ over the finite elements.
double distance(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  double sum = 0;
  for (size_t n = 0; n < x.size(); ++n)
    if (std::isfinite(x[n]) && std::isfinite(y[n])) sum += (static_cast<double>(x[n]) - y[n]) * (x[n] - y[n]);
  return std::sqrt(sum);
}

// The paths round the same operands at the same points, so the bf16 rounding error (what separates
// them from the fp32 reference) must cancel between them: their distance, fp32 noise and rare
// flips, must be a small fraction of their distance to the reference. A path that skipped or added
// one rounding would differ from the other by that rounding's share of the error, typically a third
// or more of it with three roundings per gradient; we require less than kShare of it.
constexpr double kShare = 0.1;
void expect_same_roundings(const Tensor& path, const Tensor& portable, const Tensor& ref, const std::string& what) {
  const double between = distance(path, portable), to_ref = distance(portable, ref);
  EXPECT_LE(between, kShare * to_ref) << what;
}

// Forward and backward on every path against the reference; every fast path against portable
// (forward from the same inputs; backward from the same saved output and lse).
void check_backward(const FlashCase& c) {
  SCOPED_TRACE(describe(c));
  const Inputs in = make_inputs(c.s, c.seed, c.strided, c.qk_range);
  const Outcome ref = run_reference(in, c.options, true);
  const Bounds b = derive_bounds(in, c.options, ref);
  Outcome portable;
  for (const PathSetting& setting : backward_paths()) {
    const Outcome base = setting.isa == Bf16Isa::kPortable
                             ? portable
                             : portable_on_tiles_of(setting, in, c.options, c.config, true, portable);
    ScopedPath scoped(setting);
    const std::string path = std::string(attention_flash_bf16_path()) + "/" + attention_flash_bf16_backward_path();
    const Outcome r = run_bf16(in, c.options, c.config, true);
    expect_within(r.out, ref.out, b.out, path + " out");
    EXPECT_CLOSE(r.lse, ref.lse, 4.0 * kU, b.rel * (1.0 + b.smax));
    expect_within(r.grads.dq, ref.grads.dq, b.dq, path + " dq");
    expect_within(r.grads.dk, ref.grads.dk, b.dk, path + " dk");
    expect_within(r.grads.dv, ref.grads.dv, b.dv, path + " dv");
    if (setting.isa == Bf16Isa::kPortable) {
      portable = r;
      continue;
    }
    expect_within(r.out, base.out, b.p_out, path + " out vs portable");
    Outcome same_saved;
    run_backward(in, base, c.options, c.config, same_saved);
    expect_within(same_saved.grads.dq, base.grads.dq, b.p_dq, path + " dq vs portable");
    expect_within(same_saved.grads.dk, base.grads.dk, b.p_dk, path + " dk vs portable");
    expect_within(same_saved.grads.dv, base.grads.dv, b.p_dv, path + " dv vs portable");
    if (b.rel < kUBf16) {  // else fp32 errors (huge logits) may outweigh the bf16 roundings
      expect_same_roundings(r.out, base.out, ref.out, path + " out");
      expect_same_roundings(same_saved.grads.dq, base.grads.dq, ref.grads.dq, path + " dq");
      expect_same_roundings(same_saved.grads.dk, base.grads.dk, ref.grads.dk, path + " dk");
      expect_same_roundings(same_saved.grads.dv, base.grads.dv, ref.grads.dv, path + " dv");
    }
  }
}

// --- backward ---------------------------------------------------------------------------------

// A sample of N, M ∈ {1, 2, 17, 63, 64, 65, 127, 129, 257} × d ∈ {1, 8, 32, 64, 80, 128} in which
// every value of each appears; dv ≠ d in most. Even cases add a causal mask and odd tiles, every
// third dropout; the reference (scalar, N×M) is what limits the sizes.
const std::vector<test::SizeCase>& size_cases() {
  static const std::vector<test::SizeCase> cases = {
      {1, 1, 1, 3},       {2, 1, 8, 8},    {1, 17, 32, 16},    {17, 2, 64, 40},    {63, 64, 80, 48},
      {64, 63, 128, 64},  {65, 65, 8, 24}, {127, 129, 32, 32}, {129, 127, 1, 5},   {257, 65, 80, 64},
      {65, 257, 128, 96}, {2, 2, 80, 80},  {63, 63, 64, 1},    {257, 257, 64, 64},
  };
  return cases;
}

class BackwardSizes : public ::testing::TestWithParam<size_t> {};

TEST_P(BackwardSizes, MatchesReferenceOnEveryPath) {
  const std::optional<FlashConfig> causal_tiles =
      GetParam() % 2 == 0 ? std::optional<FlashConfig>({13, 20}) : std::nullopt;
  check_backward(test::size_case(size_cases()[GetParam()], 2'000'000, GetParam(), causal_tiles));
}
INSTANTIATE_TEST_SUITE_P(Sample, BackwardSizes, ::testing::Range<size_t>(0, size_cases().size()),
                         [](const auto& info) { return test::size_case_name(size_cases()[info.param]); });

class BackwardMasks : public ::testing::TestWithParam<size_t> {};

TEST_P(BackwardMasks, MatchesReferenceOnEveryPath) {
  for (const FlashCase& c : test::mask_sweep(mask_cases()[GetParam()], {Dims{2, 41, 67, 2, 24, 16}},
                                             {FlashConfig{}, FlashConfig{9, 13}}, 100 + GetParam()))
    check_backward(c);
}
INSTANTIATE_TEST_SUITE_P(All, BackwardMasks, ::testing::Range<size_t>(0, mask_cases().size()),
                         [](const auto& info) { return mask_cases()[info.param].name; });

TEST(AttentionFlashBf16Backward, DropoutWithMasks) {
  for (const FlashCase& c : test::dropout_with_masks_cases(32, {FlashConfig{}})) check_backward(c);
}

// The last two tile sets walk the query rows in chunks (FlashConfig::backward_rows: 26 and 7 rows).
TEST(AttentionFlashBf16Backward, TileSizes) {
  for (const FlashCase& c : test::tile_size_cases({2, 100, 90, 2, 20, 12}, 47,
                                                  {FlashConfig{1, 1}, FlashConfig{3, 5}, FlashConfig{7, 16},
                                                   FlashConfig{13, 20}, FlashConfig{200, 7}, FlashConfig{7, 200},
                                                   FlashConfig{13, 20, 26}, FlashConfig{7, 16, 1}}))
    check_backward(c);
}

TEST(AttentionFlashBf16Backward, ThreadCounts) {
  // One head (the fp32 SIMD path splits its key tiles into runs and sums their dq partials in run
  // order), three, and one in chunks of query rows. Every path gives the same bits for any thread
  // count: one writer per key tile for dk and dv, runs that do not depend on the thread count.
  for (const FlashCase& c : test::thread_count_cases()) {
    SCOPED_TRACE(describe(c));
    const AttentionOptions& options = c.options;
    const Inputs in = make_inputs(c.s, c.seed, c.strided);
    const Outcome ref = run_reference(in, options, true);
    const Bounds b = derive_bounds(in, options, ref);
    for (const PathSetting& setting : backward_paths()) {
      ScopedPath scoped(setting);
      SCOPED_TRACE(attention_flash_bf16_backward_path());
      Outcome runs[2][2];
      for (int threads : {1, 2}) {
        test::ScopedThreads scoped_threads(threads);
        for (Outcome& r : runs[threads - 1]) r = run_bf16(in, options, c.config, true);
      }
      for (const auto& pair : runs) {
        EXPECT_EQ(pair[0].out.to_vector(), pair[1].out.to_vector());
        EXPECT_EQ(pair[0].grads.dq.to_vector(), pair[1].grads.dq.to_vector());
        EXPECT_EQ(pair[0].grads.dk.to_vector(), pair[1].grads.dk.to_vector());
        EXPECT_EQ(pair[0].grads.dv.to_vector(), pair[1].grads.dv.to_vector());
      }
      const Outcome &one = runs[0][0], &two = runs[1][0];
      EXPECT_EQ(one.out.to_vector(), two.out.to_vector());
      EXPECT_EQ(one.grads.dq.to_vector(), two.grads.dq.to_vector());
      EXPECT_EQ(one.grads.dk.to_vector(), two.grads.dk.to_vector());
      EXPECT_EQ(one.grads.dv.to_vector(), two.grads.dv.to_vector());
      expect_within(two.grads.dq, ref.grads.dq, b.dq, "dq vs reference");
    }
  }
}

// The split of few heads into runs of key tiles (attention/backward_split.h: the fp32 SIMD path,
// vdpbf16ps and AMX) with the run count pinned above and below the thread counts: a thread then
// takes several runs, and a head begun in one thread's runs continues in several of the next.
// Every thread count gives the bits of one thread, within the bounds of the reference.
TEST(AttentionFlashBf16Backward, SplitRunsGiveTheSameBitsForAnyThreadCount) {
  for (const FlashCase& c : test::thread_count_cases()) {
    SCOPED_TRACE(describe(c));
    const Inputs in = make_inputs(c.s, c.seed, c.strided);
    const Outcome ref = run_reference(in, c.options, true);
    const Bounds b = derive_bounds(in, c.options, ref);
    for (const PathSetting& setting : backward_paths()) {
      ScopedPath scoped(setting);
      SCOPED_TRACE(attention_flash_bf16_backward_path());
      for (int runs : {3, 5, detail::kMaxSplitRuns}) {
        const test::PinnedSplitRuns pin(runs);
        Outcome one;
        {
          test::ScopedThreads threads(1);
          one = run_bf16(in, c.options, c.config, true);
        }
        expect_within(one.grads.dq, ref.grads.dq, b.dq, "dq vs reference");
        expect_within(one.grads.dk, ref.grads.dk, b.dk, "dk vs reference");
        expect_within(one.grads.dv, ref.grads.dv, b.dv, "dv vs reference");
        for (int count : {2, 3, 4}) {
          test::ScopedThreads threads(count);
          Outcome more;
          run_backward(in, one, c.options, c.config, more);
          EXPECT_EQ(one.grads.dq.to_vector(), more.grads.dq.to_vector()) << runs << " runs, " << count << " threads";
          EXPECT_EQ(one.grads.dk.to_vector(), more.grads.dk.to_vector()) << runs << " runs, " << count << " threads";
          EXPECT_EQ(one.grads.dv.to_vector(), more.grads.dv.to_vector()) << runs << " runs, " << count << " threads";
        }
      }
    }
  }
}

// No queries (N = 0) and keys: dk and dv are zero on every path (left unwritten by the fast paths
// until session 36).
TEST(AttentionFlashBf16Backward, NoQueriesGiveZeroKeyGradients) {
  const Inputs in = make_inputs({2, 0, 37, 2, 8, 6}, 3, true);
  for (const PathSetting& setting : backward_paths()) {
    ScopedPath scoped(setting);
    const Outcome r = run_bf16(in, AttentionOptions{}, {16, 16}, true);
    for (const Tensor* t : {&r.grads.dk, &r.grads.dv})
      for (float x : t->to_vector()) ASSERT_EQ(x, 0.0f) << attention_flash_bf16_backward_path();
  }
}

TEST(AttentionFlashBf16Backward, FullyMaskedRowsAndKeysGiveZeros) {
  // Bottom-right causal with N > M: queries 0..29 see no key; item 1 has no keys at all. Keys
  // 35..39 of item 0 are padding, so no query sees them.
  const Dims s{2, 70, 40, 2, 8, 8};
  AttentionOptions options;
  options.mask = Mask::causal() & Mask::key_padding({35, 0});
  const Inputs in = make_inputs(s, 1, true);
  for (const PathSetting& setting : backward_paths()) {
    ScopedPath scoped(setting);
    SCOPED_TRACE(attention_flash_bf16_backward_path());
    test::expect_zeros_where_fully_masked(run_bf16(in, options, {16, 16}, true), s, 35);
  }
  check_backward({s, options, {16, 16}});
}

TEST(AttentionFlashBf16Backward, VeryLargeLogits) {
  // Nearly one-hot softmax, where the bf16 rounding of P ≈ 1 matters most.
  for (const FlashCase& c : test::large_logits_cases()) check_backward(c);
}

TEST(AttentionFlashBf16Backward, ExplicitScaleAndSingleKey) {
  FlashCase c{{1, 50, 60, 2, 16, 16}, {}};
  c.options.scale = 0.9f;
  check_backward(c);
  for (const FlashCase& one : test::single_key_cases()) check_backward(one);
}

TEST(AttentionFlashBf16Backward, RejectsBadArguments) {
  const Inputs in = make_inputs({1, 4, 5, 1, 8, 8}, 1, false);
  Tensor out = Tensor::zeros({1, 4, 1, 8}), lse = Tensor::zeros({1, 1, 4});
  AttentionGrads grads{Tensor::zeros({1, 4, 1, 8}), Tensor::zeros({1, 5, 1, 8}), Tensor::zeros({1, 5, 1, 8})};
  // No lse; F32 inputs; BF16 gradients; wrong dout shape.
  EXPECT_THROW(attention_flash_bf16_backward({in.q.bf, in.k.bf, in.v.bf, out, Tensor()}, out, {}, grads), Error);
  EXPECT_THROW(attention_flash_bf16_backward({in.q.f32, in.k.f32, in.v.f32, out, lse}, out, {}, grads), Error);
  const AttentionGrads bf16_grads{in.q.bf, in.k.bf, in.v.bf};
  EXPECT_THROW(attention_flash_bf16_backward({in.q.bf, in.k.bf, in.v.bf, out, lse}, out, {}, bf16_grads), Error);
  EXPECT_THROW(
      attention_flash_bf16_backward({in.q.bf, in.k.bf, in.v.bf, out, lse}, Tensor::zeros({1, 4, 1, 7}), {}, grads),
      Error);
}

}  // namespace
}  // namespace cabm::test::flash_bf16
