// Tier 2 of the attention tests: the flash kernels (forward and backward) against the reference
// kernels, over odd sizes and tails, every mask kind, dropout, tile sizes and thread counts.
#include "cabm/kernels/attention/attention.h"
#include "cabm/kernels/attention/flash.h"
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/attention/flash_detail.h"
#include "cabm/kernels/attention/reference.h"
#include "cabm/kernels/simd.h"
#include "cabm/kernels/bf16.h"
#include "util/attention_cases.h"
#include "util/simd_isas.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace cabm {
namespace {

using test::Dims;
using test::FlashCase;
using test::kU;
using test::max_abs;
using test::Outcome;

// Tolerances: the bound of one float kernel against exact math (test::relative_bound), applied to
// the largest element of each tensor (norm-wise), and twice over, because both kernels being
// compared carry it.
double relative_bound(const Dims& s, const Tensor& q, const Tensor& k, const AttentionOptions& options) {
  return 2.0 * test::relative_bound(s, test::smax_bound(attention_scale(options, s.d), q, k, options.mask));
}

// ---------------------------------------------------------------------------------------------

Outcome run_reference(const test::Inputs& in, const AttentionOptions& options) {
  return test::run_reference(in.q, in.k, in.v, in.g, options, true);
}

// Flash forward and backward with strided outputs: out inside a wider buffer, gradients as head
// views of one buffer.
Outcome run_flash(const test::Inputs& in, const AttentionOptions& options, const FlashConfig& config) {
  const Dims s = test::dims_of(in.q, in.k, in.v);
  Outcome r = test::strided_outputs(s);
  attention_flash_forward(in.q, in.k, in.v, options, r.out, &r.lse, config);
  r.grads = test::strided_grads(s);
  attention_flash_backward({in.q, in.k, in.v, r.out, r.lse}, in.g, options, r.grads, config);
  return r;
}

// The magnitudes the relative bound applies to. The output is an average of rows of v. dS =
// P∘(dP − D) is computed from dot products of length dv bounded by dv·max|dO|·max|v|, so its error
// is relative to that, not to dS itself (which can be exactly 0: with one key, softmax is
// constant); dQ = scale·Σ_j dS K sums it with weights P (Σ_j P = 1), dK = scale·Σ_i dSᵀ Q with the
// column sums of P, N/M on average: we use max(1, ⌈N/M⌉).
struct Magnitudes {
  double out, ds, dq, dk;
};
Magnitudes magnitudes(const test::Inputs& in, const AttentionOptions& options) {
  const double scale = attention_scale(options, in.q.size(3));
  const double ds = static_cast<double>(in.v.size(3)) * max_abs(in.g) * max_abs(in.v);
  const double column_sum = std::max<double>(1.0, std::ceil(static_cast<double>(in.q.size(1)) / in.k.size(1)));
  return {max_abs(in.v) / (1.0 - options.dropout), ds, scale * max_abs(in.k) * ds,
          scale * max_abs(in.q) * ds * column_sum};
}

void compare_runs(const Outcome& flash, const Outcome& ref, double rel, const Magnitudes& m) {
  test::expect_within(flash.out, ref.out, rel * m.out, "out");
  test::expect_within(flash.lse, ref.lse, rel * (1.0 + max_abs(ref.lse)), "lse");
  test::expect_within(flash.grads.dq, ref.grads.dq, rel * std::max(max_abs(ref.grads.dq), m.dq), "dq");
  test::expect_within(flash.grads.dk, ref.grads.dk, rel * std::max(max_abs(ref.grads.dk), m.dk), "dk");
  test::expect_within(flash.grads.dv, ref.grads.dv, rel * max_abs(ref.grads.dv), "dv");
}

void check(const FlashCase& c) {
  SCOPED_TRACE(describe(c));
  const test::Inputs in = test::random_inputs(c.s, c.seed, c.strided, c.qk_range);
  const Outcome ref = run_reference(in, c.options);
  for (SimdIsa isa : test::flash_isas()) {
    const test::ScopedSimdIsa pin(isa);
    SCOPED_TRACE(std::string("isa ") + flash_isa());
    ASSERT_STREQ(flash_isa(), simd_isa_name(isa));
    compare_runs(run_flash(in, c.options, c.config), ref, relative_bound(c.s, in.q, in.k, c.options),
                 magnitudes(in, c.options));
  }
}

// --- sizes and tails --------------------------------------------------------------------------

// A sample of N, M ∈ {1, 2, 17, 63, 64, 65, 127, 128, 129, 257, 1000} × d ∈ {1, 8, 32, 64, 80, 128}
// in which every value of each appears, with and without a causal mask; the full cross product
// would take minutes in the (scalar, N×M) reference. dv = d, but 48 for d = 80.
const std::vector<test::SizeCase>& size_cases() {
  static const std::vector<test::SizeCase> cases = {
      {1, 1, 1},     {2, 1, 8},     {1, 17, 32},    {17, 2, 64},     {63, 64, 80},   {64, 63, 128},
      {65, 65, 8},   {127, 129, 32}, {128, 127, 64}, {129, 128, 1},  {257, 65, 80},  {65, 257, 128},
      {1000, 17, 64}, {17, 1000, 32}, {257, 257, 128}, {128, 1000, 8}, {1000, 128, 80}, {63, 63, 1},
      {2, 2, 80},    {1000, 1000, 64}, {129, 127, 128}, {64, 64, 64},
  };
  return cases;
}

class FlashSizes : public ::testing::TestWithParam<size_t> {};

TEST_P(FlashSizes, MatchesReference) {
  test::SizeCase sc = size_cases()[GetParam()];
  sc.dv = sc.d == 80 ? 48 : sc.d;
  // Keep each case's reference work (B·H·N·M·d) near 10^7 multiply-adds.
  check(test::size_case(sc, 4'000'000, GetParam(), std::nullopt));
  check(test::size_case(sc, 4'000'000, GetParam(), FlashConfig{16, 32}));
}
INSTANTIATE_TEST_SUITE_P(Sample, FlashSizes, ::testing::Range<size_t>(0, size_cases().size()),
                         [](const auto& info) { return test::size_case_name(size_cases()[info.param]); });

// --- every mask kind ---------------------------------------------------------------------------

class FlashMasks : public ::testing::TestWithParam<size_t> {};

TEST_P(FlashMasks, MatchesReference) {
  // {16, 24, 32} and {5, 7, 12}: the backward walks the query rows in chunks of 32 and 15.
  for (const FlashCase& c : test::mask_sweep(
           test::tile_mask_cases()[GetParam()], {Dims{3, 65, 129, 2, 32, 24}, Dims{2, 129, 65, 1, 16, 16}},
           {FlashConfig{}, FlashConfig{16, 24}, FlashConfig{5, 7}, FlashConfig{16, 24, 32}, FlashConfig{5, 7, 12}},
           100 + GetParam()))
    check(c);
}
INSTANTIATE_TEST_SUITE_P(All, FlashMasks, ::testing::Range<size_t>(0, test::tile_mask_cases().size()),
                         [](const auto& info) { return test::tile_mask_cases()[info.param].name; });

TEST(Flash, DropoutWithMasks) {
  // {16, 16, 16}: the backward in chunks of 16 query rows.
  for (const FlashCase& c : test::dropout_with_masks_cases(24, {FlashConfig{}, FlashConfig{16, 16, 16}})) check(c);
}

// --- tile sizes and thread counts --------------------------------------------------------------

TEST(Flash, TileSizes) {
  for (const FlashCase& c : test::tile_size_cases({2, 100, 150, 2, 20, 12}, 77,
                                                  {FlashConfig{1, 1}, FlashConfig{3, 5}, FlashConfig{8, 8},
                                                   FlashConfig{16, 32}, FlashConfig{64, 64}, FlashConfig{128, 32},
                                                   FlashConfig{7, 200}, FlashConfig{200, 7}}))
    check(c);
}

// flash_resolved_config's defaults: fp32 inputs on the avx512 set of a CPU with two 512-bit FMA
// pipes and a 48 KiB L1d take 64 × 64 tiles, forward and backward; bf16 inputs there, the other
// sets and other CPUs keep the older rules; short causal sequences 32 × 32 everywhere; explicit
// sizes are kept.
TEST(Flash, DefaultTiles) {
  AttentionOptions none, causal;
  causal.mask = Mask::causal();
  const auto tiles = [](const AttentionOptions& o, int64_t d, int64_t n, bool backward, DType dtype) {
    const FlashConfig c = flash_resolved_config({}, o, d, n, backward, dtype);
    return std::vector<int64_t>{c.block_q, c.block_k};
  };
  for (SimdIsa isa : test::runnable_isas("tiled attention")) {
    const test::ScopedSimdIsa pin(isa);
    const bool square_fp32 = isa == SimdIsa::kAvx512 && cpu_l1d_bytes() >= kFlashSquareTilesMinL1dBytes &&
                             avx512_fmas_per_cycle() >= kFlashSquareTilesMinFmasPerCycle;
    for (const AttentionOptions* o : {&none, &causal}) {
      for (int64_t d : {32, 64, 128}) {
        const std::vector<int64_t> forward = {d > 64 ? 32 : 64, 192}, backward = {96, 96}, square = {64, 64};
        EXPECT_EQ(tiles(*o, d, 4096, false, DType::F32), square_fp32 ? square : forward) << simd_isa_name(isa);
        EXPECT_EQ(tiles(*o, d, 4096, true, DType::F32), square_fp32 ? square : backward) << simd_isa_name(isa);
        EXPECT_EQ(tiles(*o, d, 4096, false, DType::BF16), forward) << simd_isa_name(isa);
        EXPECT_EQ(tiles(*o, d, 4096, true, DType::BF16), backward) << simd_isa_name(isa);
      }
    }
    for (bool backward : {false, true})
      for (DType dtype : {DType::F32, DType::BF16})
        EXPECT_EQ(tiles(causal, 64, 128, backward, dtype), (std::vector<int64_t>{32, 32})) << simd_isa_name(isa);
    const FlashConfig given = flash_resolved_config(FlashConfig{16, 48}, none, 64, 4096, false, DType::F32);
    EXPECT_EQ(given.block_q, 16);
    EXPECT_EQ(given.block_k, 48);
  }
  std::printf("L1d %lld KiB, %.2f 512-bit FMAs per cycle: %s\n", static_cast<long long>(cpu_l1d_bytes() >> 10),
              avx512_fmas_per_cycle(),
              flash_square_fp32_tiles() ? "64 x 64 fp32 tiles on avx512" : "skipped: the 64 x 64 fp32 defaults");
  // Every CPU measured: the Xeons two FMA pipes, the Zen 4 one (AVX-512 CPUs only), in every build
  // (the loops are assembly: unit_loops.cpp).
  if (cpu_supports(SimdIsa::kAvx512)) {
    EXPECT_GT(avx512_fmas_per_cycle(), 0.6);
    EXPECT_LT(avx512_fmas_per_cycle(), 2.6);
  } else {
    EXPECT_EQ(avx512_fmas_per_cycle(), 0.0);
  }
}

TEST(Flash, ThreadCountsAgree) {
  // One head (split across threads in the backward), three (an odd number), and one walked in
  // chunks of query rows.
  for (const FlashCase& c : test::thread_count_cases()) {
    SCOPED_TRACE(describe(c));
    const AttentionOptions& options = c.options;
    const test::Inputs in = test::random_inputs(c.s, c.seed, c.strided);
    for (SimdIsa isa : test::flash_isas()) {
    const test::ScopedSimdIsa pin(isa);
    SCOPED_TRACE(std::string("isa ") + flash_isa());
    Outcome one, two;
    {
      test::ScopedThreads threads(1);
      one = run_flash(in, options, c.config);
    }
    {
      test::ScopedThreads threads(2);
      two = run_flash(in, options, c.config);
    }
    for (int count : {3, 5}) {  // more threads than this machine may have processors
      test::ScopedThreads threads(count);
      const Outcome more = run_flash(in, options, c.config);
      EXPECT_EQ(one.grads.dq.to_vector(), more.grads.dq.to_vector()) << count << " threads";
      EXPECT_EQ(one.grads.dk.to_vector(), more.grads.dk.to_vector()) << count << " threads";
    }
    // Forward tiles and backward key tiles have one owner each, and dq sums the partials of runs
    // that do not depend on the thread count in a fixed order: identical bits for any count.
    EXPECT_EQ(one.out.to_vector(), two.out.to_vector());
    EXPECT_EQ(one.lse.to_vector(), two.lse.to_vector());
    EXPECT_EQ(one.grads.dq.to_vector(), two.grads.dq.to_vector());
    EXPECT_EQ(one.grads.dk.to_vector(), two.grads.dk.to_vector());
    EXPECT_EQ(one.grads.dv.to_vector(), two.grads.dv.to_vector());
    const double rel = relative_bound(c.s, in.q, in.k, options);
    compare_runs(two, run_reference(in, options), rel, magnitudes(in, options));
    }
  }
}

// The backward's runs for few heads pinned above and below the thread counts (this machine's own
// count is its processors): a thread then takes several runs, and a head begun in one thread's
// runs continues in several runs of the next. Every thread count gives the bits of one thread.
TEST(Flash, SplitRunsGiveTheSameBitsForAnyThreadCount) {
  EXPECT_THROW(detail::set_backward_split_runs(detail::kMaxSplitRuns + 1), Error);
  EXPECT_GE(detail::backward_split_runs(), 1);
  // Read by scripts/imitated_cpu_check.sh (many-cores) to see that the processor count it set took.
  std::printf("backward split runs: %d (unpinned)\n", detail::backward_split_runs());
  for (const FlashCase& c : test::thread_count_cases()) {
    SCOPED_TRACE(describe(c));
    const test::Inputs in = test::random_inputs(c.s, c.seed, c.strided);
    const Outcome ref = run_reference(in, c.options);
    const double rel = relative_bound(c.s, in.q, in.k, c.options);
    for (int runs : {3, 5, detail::kMaxSplitRuns}) {
      const test::PinnedSplitRuns pin(runs);
      Outcome one;
      {
        test::ScopedThreads threads(1);
        one = run_flash(in, c.options, c.config);
      }
      compare_runs(one, ref, rel, magnitudes(in, c.options));
      for (int count : {2, 3, 4}) {
        test::ScopedThreads threads(count);
        const Outcome more = run_flash(in, c.options, c.config);
        EXPECT_EQ(one.grads.dq.to_vector(), more.grads.dq.to_vector()) << runs << " runs, " << count << " threads";
        EXPECT_EQ(one.grads.dk.to_vector(), more.grads.dk.to_vector()) << runs << " runs, " << count << " threads";
        EXPECT_EQ(one.grads.dv.to_vector(), more.grads.dv.to_vector()) << runs << " runs, " << count << " threads";
      }
    }
  }
}

// --- edge cases -----------------------------------------------------------------------------------

TEST(Flash, FullyMaskedRowsAndKeysGiveZeros) {
  const Dims s{2, 70, 40, 2, 8, 8};
  AttentionOptions options;
  // Bottom-right causal with N > M: queries 0..29 see no key; item 1 has no keys at all. Keys
  // 35..39 of item 0 are padding, so no query sees them.
  options.mask = Mask::causal() & Mask::key_padding({35, 0});
  const test::Inputs in = test::random_inputs(s, 1, true);
  const Outcome r = run_flash(in, options, {16, 16});
  test::expect_zeros_where_fully_masked(r, s, 35);
  compare_runs(r, run_reference(in, options), relative_bound(s, in.q, in.k, options), magnitudes(in, options));
}

// No queries (N = 0) and keys: nothing reaches K and V, so dk and dv are zero (they were left
// unwritten until session 36), through the kernel and through attention_backward, on every set.
TEST(Flash, NoQueriesGiveZeroKeyGradients) {
  const Dims s{2, 0, 37, 2, 8, 6};
  const test::Inputs in = test::random_inputs(s, 3, true);
  for (SimdIsa isa : test::flash_isas()) {
    const test::ScopedSimdIsa pin(isa);
    for (bool entry : {false, true}) {
      Outcome r = run_flash(in, AttentionOptions{}, {16, 16});
      if (entry) {
        r.grads = test::strided_grads(s);
        attention_backward({in.q, in.k, in.v, r.out, r.lse}, in.g, AttentionOptions{}, r.grads);
      }
      for (const Tensor* t : {&r.grads.dk, &r.grads.dv})
        for (float x : t->to_vector()) ASSERT_EQ(x, 0.0f) << simd_isa_name(isa) << (entry ? " attention_backward" : "");
    }
  }
}

TEST(Flash, SingleKey) {
  for (const FlashCase& c : test::single_key_cases()) check(c);
}

TEST(Flash, VeryLargeLogits) {
  for (const FlashCase& c : test::large_logits_cases()) check(c);
  // Exactly known: scores ±10^4 around one winner per row.
  const Tensor q = Tensor::full({1, 40, 1, 1}, 100.0f);
  Tensor k = test::random_tensor({1, 50, 1, 1}, 9, -100.0f, 99.0f);
  k.data<float>()[17] = 100.0f;  // the largest score of every row: 10^4
  const Tensor v = test::make_heads(1, 50, 1, 4, 10, false);
  AttentionOptions options;
  options.scale = 1.0f;
  Tensor out = Tensor::empty({1, 40, 1, 4}), lse = Tensor::empty({1, 1, 40});
  attention_flash_forward(q, k, v, options, out, &lse, {16, 16});
  for (int64_t i = 0; i < 40; ++i) {
    EXPECT_NEAR(lse.at({0, 0, i}), 1e4, 1e4 * 4 * kU);
    for (int64_t c = 0; c < 4; ++c) EXPECT_NEAR(out.at({0, i, 0, c}), v.at({0, 17, 0, c}), 1e-6);
  }
}

TEST(Flash, HeadDimAndValueDimDiffer) {
  for (const Dims& s : {Dims{1, 33, 47, 2, 3, 17}, Dims{2, 20, 20, 1, 70, 5}}) {
    FlashCase c{s, {}, {8, 16}};
    c.options.mask = Mask::sliding_window(6, 6);
    check(c);
  }
}

TEST(Flash, ExplicitScale) {
  FlashCase c{{1, 50, 60, 2, 16, 16}, {}};
  c.options.scale = 0.9f;
  check(c);
}

TEST(Flash, WorkIsSkippedOutsideTheMask) {
  // A window of 2 keys over 4096 queries with 16-key tiles: forward and backward visit O(N) tiles.
  // Outputs far from the window must be exactly what a 3-key problem gives.
  FlashCase c{{1, 4096, 4096, 1, 8, 8}, {}, {16, 16}};
  c.options.mask = Mask::sliding_window(1, 0);
  c.strided = false;
  check(c);
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
  AttentionOptions options;
  options.mask = Mask::causal();
  const test::Inputs in = test::random_inputs({1, 20, 30, 2, 8, 8}, 1, false);
  const auto& [q, k, v, g] = in;
  Tensor out = Tensor::empty({1, 20, 2, 8}), lse = Tensor::empty({1, 2, 20});
  attention_forward(q, k, v, options, out, &lse);
  const Outcome flash = run_flash(in, options, {});
  EXPECT_EQ(out.to_vector(), flash.out.to_vector());
  EXPECT_EQ(attention_forward_kernel(q, k, options), AttentionKernel::kFlash);

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

// BF16 operands go to the bf16 kernel family, through the same entry points.
TEST(FlashDispatch, Bf16OperandsTakeTheBf16Kernels) {
  AttentionOptions options;
  options.mask = Mask::key_padding({17});
  const test::Inputs in = test::random_inputs({1, 20, 17, 2, 8, 8}, 3, false);
  const auto& [q, k, v, g] = in;
  const auto to_bf16 = [](const Tensor& t) {
    Tensor r = Tensor::empty(t.shape(), DType::BF16);
    const Tensor c = t.contiguous();
    float_to_bf16(c.data<float>(), r.data<bf16>(), c.numel());
    return r;
  };
  const Tensor q16 = to_bf16(q), k16 = to_bf16(k), v16 = to_bf16(v);
  Tensor out = Tensor::empty({1, 20, 2, 8}), lse = Tensor::empty({1, 2, 20});
  Tensor want = Tensor::empty({1, 20, 2, 8}), want_lse = Tensor::empty({1, 2, 20});
  EXPECT_EQ(attention_forward_kernel(q16, k16, options), AttentionKernel::kFlashBf16);
  attention_forward(q16, k16, v16, options, out, &lse);
  attention_flash_bf16_forward(q16, k16, v16, options, want, &want_lse);
  EXPECT_EQ(out.to_vector(), want.to_vector());
  EXPECT_EQ(lse.to_vector(), want_lse.to_vector());

  const AttentionSaved saved{q16, k16, v16, out, lse};
  EXPECT_EQ(attention_backward_kernel(saved, options), AttentionKernel::kFlashBf16);
  AttentionGrads grads{Tensor::empty(q.shape()), Tensor::empty(k.shape()), Tensor::empty(v.shape())};
  AttentionGrads ref{Tensor::empty(q.shape()), Tensor::empty(k.shape()), Tensor::empty(v.shape())};
  attention_backward(saved, g, options, grads);
  attention_flash_bf16_backward(saved, g, options, ref);
  EXPECT_EQ(grads.dq.to_vector(), ref.dq.to_vector());
  EXPECT_EQ(grads.dk.to_vector(), ref.dk.to_vector());
  EXPECT_EQ(grads.dv.to_vector(), ref.dv.to_vector());

  EXPECT_THROW(attention_forward(q16, k, v16, options, out, &lse), Error) << "mixed dtypes";
  EXPECT_THROW(attention_backward({q16, k16, v16, out, Tensor()}, g, options, grads), Error) << "bf16 needs lse";
}

// One shape check for both precisions (check_attention_shapes): the message names the tensor and
// the dtype it must have, and a backward that needs the lse says so.
TEST(FlashValidation, ShapeErrorsNameTheTensor) {
  const auto expect_message = [](const auto& call, const std::string& part) {
    std::string what = "no error";
    try {
      call();
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_NE(what.find(part), std::string::npos) << "message: " << what << "\nexpected to contain: " << part;
  };
  const Tensor q = Tensor::zeros({1, 4, 2, 8}), k = Tensor::zeros({1, 5, 2, 8}), v = Tensor::zeros({1, 5, 2, 8});
  const Tensor q16 = Tensor::zeros({1, 4, 2, 8}, DType::BF16), k16 = Tensor::zeros({1, 5, 2, 8}, DType::BF16),
               v16 = Tensor::zeros({1, 5, 2, 8}, DType::BF16);
  const Tensor k16_strided = Tensor::zeros({1, 5, 2, 16}, DType::BF16).as_strided({1, 5, 2, 8}, {160, 32, 16, 2});
  Tensor out = Tensor::zeros({1, 4, 2, 8});
  expect_message([&] { attention_flash_forward(q, k16, v, {}, out); }, "k must be a rank-4 F32 tensor");
  expect_message([&] { attention_flash_bf16_forward(q16, k16, v, {}, out); }, "v must be a rank-4 BF16 tensor");
  expect_message([&] { attention_flash_bf16_forward(q16, k16, v16, {}, Tensor::zeros({1, 4, 2, 8}, DType::BF16)); },
                 "out must be a rank-4 F32 tensor");
  expect_message([&] { attention_flash_bf16_forward(q16, k16_strided, v16, {}, out); },
                 "head-dim) axis of k must have stride 1");
  expect_message([&] { attention_flash_bf16_forward(q16, Tensor::zeros({1, 5, 2, 6}, DType::BF16), v16, {}, out); },
                 "k has shape [1, 5, 2, 6]");
  const AttentionGrads grads{Tensor::zeros(q.shape()), Tensor::zeros(k.shape()), Tensor::zeros(v.shape())};
  expect_message([&] { attention_flash_backward({q, k, v, out, Tensor()}, out, {}, grads); },
                 "needs the forward's lse");
  expect_message([&] { attention_flash_bf16_backward({q16, k16, v16, out, Tensor()}, out, {}, grads); },
                 "needs the forward's lse");
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
