// The attention variants of the bf16 flash forward (grouped-query attention, logit soft-capping,
// ALiBi; attention/reference.h defines them) against the fp32 reference run on the same
// bf16-rounded inputs, on each forward path this CPU has (amx_bf16, amx_bf16_emulated: the AMX
// kernel on modelled tiles wherever AVX-512 BF16 exists, avx512_bf16, portable; a
// path the CPU lacks is skipped with the reason): every mask kind, dropout, odd sizes and tile
// tails, forced tile sizes, thread counts, fully masked rows (the vector tanh on its own:
// test_vector_tanh.cpp). The backward with the variants: the portable path, and the automatic
// one where flash_bf16_supports_variants says it runs them (bounds derived with the backward
// tests below).
//
// Tolerances, as in test_attention_flash_bf16.cpp (Higham 2002, §3.1): the output is off by the
// bf16 rounding of P (u_b·keep·max|v|, u_b = 2^-8) plus the fp32 bound rel·keep·max|v| with
// rel = 2·relative_bound(dims, smax) and smax bounding |score|. With the variants smax is the
// bound of the capped scaled product (min(c, |scale|·d·max|q|·max|k|)) plus the ALiBi term
// (max|slope|·max|qpos − kpos|) plus the additive biases, and the variants add their own
// roundings: the vector tanh (2 ulp relative, test_vector_tanh.cpp), the cap's division and
// product, the ALiBi product and subtraction and the base-2 conversion, each at most u·smax
// absolute in a score; a weight a_j = exp(s_j − lse) sees two scores' errors. kVariantRoundings = 8 covers them
// with room (2·8·u·smax added to rel before the doubling). A kernel that skipped a variant,
// applied it in the wrong order with respect to the additive mask, or read the wrong key/value
// head would be off by O(1): VariantsChangeTheResultBeyondTheTolerance checks that on the cases
// here, so the comparisons can fail.
#include "cabm/core/threads.h"
#include "cabm/kernels/attention/attention.h"
#include "cabm/kernels/attention/bf16_variants.h"
#include "cabm/kernels/attention/flash_amx.h"
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/attention/reference.h"
#include "cabm/kernels/bf16.h"
#include "util/attention_cases.h"
#include "util/flash_bf16_cases.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace cabm {
namespace {

using test::Dims;
using test::expect_within;
using test::kU;
using test::MaskCase;
using test::max_abs;
using test::Outcome;

using test::flash_bf16::kUBf16;
using test::flash_bf16::kUWeights;
constexpr double kVariantRoundings = 8.0;

// --- inputs -----------------------------------------------------------------------------------

// A bf16 head view [B, L, H, d] (strided: heads of a [B, L, 2, H, d + 1] buffer) and the fp32
// values it holds.
struct Heads {
  Tensor bf, f32;
};
Heads make_heads(int64_t B, int64_t L, int64_t H, int64_t d, uint64_t seed, bool strided, float range) {
  const Shape shape = test::head_buffer_shape(B, L, H, d, strided);
  Tensor x = test::random_tensor(shape, seed, -range, range);
  Tensor xb = Tensor::empty(shape, DType::BF16);
  float_to_bf16(x.data<float>(), xb.data<bf16>(), x.numel());
  bf16_to_float(xb.data<bf16>(), x.data<float>(), x.numel());
  return {test::head_view(xb, d, strided), test::head_view(x, d, strided)};
}

// One check: q [B, N, H, d], k [B, M, Hkv, d], v [B, M, Hkv, dv].
struct Case {
  Dims s;
  int64_t Hkv;
  AttentionOptions options;
  FlashConfig config{};
  bool strided = true;
  uint64_t seed = 1;
  float qk_range = 1.0f;
};
std::string describe(const Case& c) {
  return test::describe(c.s) + " Hkv " + std::to_string(c.Hkv) + " tiles " + std::to_string(c.config.block_q) + "x" +
         std::to_string(c.config.block_k) + " softcap " + std::to_string(c.options.softcap) + " alibi " +
         (c.options.alibi_slopes.empty() ? "off" : "on") + (c.options.q_positions.empty() ? "" : " qpos") +
         (c.options.k_positions.empty() ? "" : " kpos") + (c.options.dropout > 0 ? " dropout" : "") + " qk_range " +
         std::to_string(c.qk_range);
}

struct Inputs {
  Heads q, k, v;
};
Inputs make_inputs(const Case& c) {
  const Dims& s = c.s;
  return {make_heads(s.B, s.N, s.H, s.d, c.seed, c.strided, c.qk_range),
          make_heads(s.B, s.M, c.Hkv, s.d, c.seed + 1, c.strided, c.qk_range),
          make_heads(s.B, s.M, c.Hkv, s.dv, c.seed + 2, c.strided, 1.0f)};
}

std::vector<float> random_slopes(int64_t H, uint64_t seed) {
  const std::vector<float> x = test::random_tensor({H}, seed, 0.0f, 1.0f).to_vector();
  std::vector<float> slopes(x.begin(), x.end());
  if (H > 1) slopes[1] = -slopes[1] * 0.1f;  // the kernels must not assume a sign
  return slopes;
}
std::vector<int64_t> random_positions(int64_t n, int64_t range, uint64_t seed) {
  std::vector<int64_t> p;
  for (float x : test::random_tensor({n}, seed, 0.0f, static_cast<float>(range)).to_vector())
    p.push_back(static_cast<int64_t>(x));
  return p;
}

// --- bounds -----------------------------------------------------------------------------------

struct Bounds {
  double smax, rel, out, lse, max_a;
};
Bounds derive_bounds(const Case& c, const Inputs& in) {
  Bounds b{};
  const AttentionOptions& o = c.options;
  const double scale = attention_scale(o, c.s.d);
  double bias = test::smax_bound(scale, in.q.f32, in.k.f32, o.mask);
  const double product = std::fabs(scale) * static_cast<double>(c.s.d) * max_abs(in.q.f32) * max_abs(in.k.f32);
  bias -= product;  // smax_bound = product + biases
  b.smax = (o.softcap > 0 ? std::min<double>(o.softcap, product) : product) + test::alibi_bound(o, c.s.N, c.s.M) + bias;
  b.rel = 2.0 * (test::relative_bound(c.s, b.smax) + 2.0 * kVariantRoundings * kU * b.smax);
  const double keep = 1.0 / (1.0 - o.dropout), vmax = max_abs(in.v.f32);
  b.out = (kUWeights + b.rel) * keep * vmax;
  b.lse = b.rel * (1.0 + b.smax);
  return b;
}

// --- paths ------------------------------------------------------------------------------------

struct ScopedIsa {
  explicit ScopedIsa(Bf16Isa isa) { set_bf16_isa_override(isa); }
  ~ScopedIsa() { set_bf16_isa_override(Bf16Isa::kAuto); }
};

// The override that reaches a forward path by name, and why this CPU cannot take it (empty if it can).
struct PathChoice {
  Bf16Isa isa;
  std::string missing;
};
PathChoice choose(const std::string& path) {
  if (path == "portable") return {Bf16Isa::kPortable, ""};
  if (!cpu_has_avx512_bf16()) return {Bf16Isa::kAuto, "this CPU (or OS) has no AVX-512 BF16"};
  if (path == "avx512_bf16" || path == "amx_bf16_emulated") return {Bf16Isa::kAvx512Bf16, ""};
  if (!cpu_has_amx_bf16()) return {Bf16Isa::kAuto, "this CPU (or OS) has no AMX-BF16 tiles"};
  if (!bf16_amx_active()) return {Bf16Isa::kAuto, "CABM_NO_AMX or CABM_FORCE_PORTABLE is set"};
  return {Bf16Isa::kAuto, ""};
}

// Each test runs on one forward path (the parameter), skipped where the CPU lacks it.
class Bf16Variants : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const PathChoice choice = choose(GetParam());
    if (!choice.missing.empty()) GTEST_SKIP() << GetParam() << " path not tested: " << choice.missing;
    set_bf16_isa_override(choice.isa);
    detail::set_amx_emulation(GetParam() == "amx_bf16_emulated");  // the AMX kernel on modelled tiles
    ASSERT_EQ(std::string(attention_flash_bf16_path()), GetParam());
  }
  void TearDown() override {
    detail::set_amx_emulation(false);
    set_bf16_isa_override(Bf16Isa::kAuto);
  }
};

Outcome run_bf16(const Case& c, const Inputs& in) {
  Outcome r = test::strided_outputs(c.s);
  attention_flash_bf16_forward(in.q.bf, in.k.bf, in.v.bf, c.options, r.out, &r.lse, c.config);
  return r;
}

Outcome run_reference(const Case& c, const Inputs& in) {
  return test::run_reference(in.q.f32, in.k.f32, in.v.f32, Tensor(), c.options, false);
}

void check(const Case& c) {
  SCOPED_TRACE(describe(c));
  ASSERT_TRUE(flash_bf16_supports_variants(c.s.H, c.Hkv, c.options, false));
  const Inputs in = make_inputs(c);
  const Outcome ref = run_reference(c, in);
  const Bounds b = derive_bounds(c, in);
  const Outcome r = run_bf16(c, in);
  expect_within(r.out, ref.out, b.out, std::string(attention_flash_bf16_path()) + " out");
  // lse comes from the unrounded fp32 weights: fp32 bounds only, absolute in the scores' units.
  EXPECT_CLOSE(r.lse, ref.lse, 4.0 * kU, b.lse);
}

// The variants of a case's options: GQA 8 over 2, soft-cap 3, random slopes; the mask kept.
Case with_all_variants(Case c) {
  c.options.softcap = 3.0f;
  c.options.alibi_slopes = random_slopes(c.s.H, 40 + c.seed);
  if (c.s.H % 2 == 0) c.Hkv = c.s.H / 2;
  return c;
}

// --- grouped-query attention ------------------------------------------------------------------

TEST_P(Bf16Variants, GroupedQueryHeads) {
  for (int64_t Hkv : {8, 4, 2, 1})  // H / Hkv = 1, 2, 4, 8 (MQA)
    for (const Mask& mask : {Mask(), Mask::causal(), Mask::causal(CausalAlign::kTopLeft)})
      for (const FlashConfig& config : {FlashConfig{}, FlashConfig{9, 16}}) {
        Case c{{2, 37, 53, 8, 24, 20}, Hkv, {}, config};
        c.options.mask = mask;
        check(c);
      }
  Case mqa{{1, 70, 45, 4, 64, 64}, 1, {}, {}, false, 3};  // contiguous heads
  check(mqa);
}

// --- soft-capping -----------------------------------------------------------------------------

TEST_P(Bf16Variants, SoftCap) {
  for (float cap : {0.05f, 0.5f, 5.0f, 30.0f})
    for (float range : {1.0f, 4.0f})
      for (const Mask& mask : {Mask(), Mask::causal()}) {
        Case c{{2, 41, 67, 2, 32, 24}, 2, {}, {16, 32}, true, 5, range};
        c.options.softcap = cap;
        c.options.mask = mask;
        check(c);
      }
}

// Scaled scores up to ±7200 (|q|, |k| <= 30, d = 64): tanh saturates at ±1 for most of them.
TEST_P(Bf16Variants, SoftCapLargeLogits) {
  for (float cap : {1.0f, 20.0f, 50.0f})
    for (const Mask& mask : {Mask(), Mask::causal()}) {
      Case c{{1, 150, 140, 2, 64, 32}, 2, {}, {32, 32}, true, 7, 30.0f};
      c.options.softcap = cap;
      c.options.mask = mask;
      check(c);
    }
}

// --- ALiBi ------------------------------------------------------------------------------------

TEST_P(Bf16Variants, AlibiSlopesAlignmentsAndPositions) {
  const std::vector<Dims> sizes = {{2, 37, 53, 8, 16, 16}, {2, 70, 33, 6, 16, 24}, {1, 50, 50, 8, 40, 8}};
  for (const Dims& s : sizes)
    for (bool paper : {true, false})
      for (const Mask& mask : {Mask(), Mask::causal(), Mask::causal(CausalAlign::kTopLeft)}) {
        Case c{s, s.H, {}, {13, 16}, true, 11};
        c.options.alibi_slopes = paper ? alibi_paper_slopes(s.H) : random_slopes(s.H, 12);
        c.options.mask = mask;
        check(c);
        // Positions of their own: not monotone, not aligned with the indices.
        c.options.q_positions = random_positions(s.N, 300, 13);
        c.options.k_positions = random_positions(s.M, 300, 14);
        check(c);
        c.options.q_positions.clear();  // keys only: queries stay bottom-right aligned
        check(c);
      }
}

// --- combinations -----------------------------------------------------------------------------

// GQA, soft-capping and ALiBi together under every mask kind, on two tilings.
TEST_P(Bf16Variants, AllVariantsEveryMaskKind) {
  for (const MaskCase& mc : test::tile_mask_cases()) {
    SCOPED_TRACE("mask " + mc.name);
    for (const FlashConfig& config : {FlashConfig{}, FlashConfig{9, 16}}) {
      Case c = with_all_variants({{3, 41, 67, 4, 24, 24}, 4, {}, config});
      c.options.mask = mc.make(c.s);
      check(c);
    }
  }
}

// The dropout decisions are the reference's, indexed by the query head.
TEST_P(Bf16Variants, AllVariantsWithDropout) {
  for (const Mask& mask : {Mask(), Mask::causal(), Mask::sliding_window(20, 5)})
    for (float p : {0.1f, 0.5f}) {
      Case c = with_all_variants({{2, 33, 40, 4, 16, 16}, 4, {}, {8, 16}});
      c.options.mask = mask;
      c.options.dropout = p;
      c.options.dropout_seed = 99;
      c.options.dropout_offset = 4;
      check(c);
    }
}

// N, M, d, dv from 1 to 130 (tails of every tile width: 16 keys, 32 head-dim elements on AMX),
// forced small and odd tiles.
TEST_P(Bf16Variants, AllVariantsOddSizesAndTiles) {
  const std::vector<Dims> sizes = {{2, 1, 1, 2, 1, 1},       {2, 17, 33, 4, 1, 3},     {2, 40, 31, 2, 17, 40},
                                   {1, 33, 50, 4, 40, 17},   {1, 50, 47, 2, 80, 96},   {1, 31, 70, 2, 96, 80},
                                   {1, 47, 45, 2, 128, 128}, {1, 20, 37, 2, 130, 130}, {1, 129, 127, 2, 8, 5}};
  for (const Dims& s : sizes)
    for (const Mask& mask :
         {Mask(), Mask::causal(), Mask::causal() & Mask::key_padding(std::vector<int64_t>(s.B, s.M / 2 + 1))})
      for (const FlashConfig& config : {FlashConfig{}, FlashConfig{1, 1}, FlashConfig{5, 16}, FlashConfig{16, 48}}) {
        Case c = with_all_variants({s, s.H, {}, config, true, 17});
        c.options.mask = mask;
        c.options.softcap = 1.5f;
        check(c);
      }
}

TEST_P(Bf16Variants, BitIdenticalAcrossThreadCounts) {
  for (const Dims& s : {Dims{1, 300, 300, 2, 32, 32}, Dims{2, 130, 200, 6, 16, 8}}) {
    Case c = with_all_variants({s, s.H, {}, {32, 32}, true, 3});
    c.options.mask = Mask::causal();
    c.options.k_positions = random_positions(s.M, 1000, 31);
    SCOPED_TRACE(describe(c));
    const Inputs in = make_inputs(c);
    Outcome runs[2];
    for (int threads : {1, 2}) {
      test::ScopedThreads scoped(threads);
      runs[threads - 1] = run_bf16(c, in);
    }
    EXPECT_EQ(runs[0].out.to_vector(), runs[1].out.to_vector());
    EXPECT_EQ(runs[0].lse.to_vector(), runs[1].lse.to_vector());
    check(c);
  }
}

// Item 1 has no keys, and bottom-right causal with N > M leaves queries 0 … N − M − 1 of item 0
// without keys: output exactly 0 and lse −inf, whatever the variants add to the scores.
TEST_P(Bf16Variants, FullyMaskedRowsGiveZeroAndMinusInfLse) {
  Case c = with_all_variants({{2, 70, 40, 4, 8, 8}, 4, {}, {16, 16}});
  c.options.mask = Mask::causal() & Mask::key_padding({35, 0});
  const Inputs in = make_inputs(c);
  const Outcome r = run_bf16(c, in);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < c.s.H; ++h)
      for (int64_t i = 0; i < (b == 0 ? c.s.N - c.s.M : c.s.N); ++i) {
        EXPECT_EQ(r.lse.at({b, h, i}), -INFINITY) << b << " " << h << " " << i;
        for (int64_t e = 0; e < c.s.dv; ++e) ASSERT_EQ(r.out.at({b, i, h, e}), 0.0f) << b << " " << h << " " << i;
      }
  check(c);
}

// The entry point keeps bf16 operands with these variants on this path's tiled kernel.
TEST_P(Bf16Variants, EntryPointTakesTheTiledKernel) {
  Case c = with_all_variants({{2, 20, 30, 4, 16, 16}, 4, {}});
  c.options.mask = Mask::causal();
  const Inputs in = make_inputs(c);
  EXPECT_EQ(attention_forward_kernel(in.q.bf, in.k.bf, c.options), AttentionKernel::kFlashBf16);
  Outcome r = test::strided_outputs(c.s);
  attention_forward(in.q.bf, in.k.bf, in.v.bf, c.options, r.out, &r.lse);
  const Outcome ref = run_reference(c, in);
  expect_within(r.out, ref.out, derive_bounds(c, in).out, "attention_forward out");
  // The backward runs them where the fp32 SIMD path (which the process may also take) does.
  EXPECT_EQ(flash_bf16_supports_variants(c.s.H, c.Hkv, c.options, true),
            flash_supports_variants(c.s.H, c.Hkv, c.options));
  EXPECT_TRUE(flash_bf16_supports_variants(4, 4, {}, true));
}

// --- backward, portable path -------------------------------------------------------------------
//
// The bounds of test_attention_flash_bf16.cpp (derived there): with C = keep·dv·max|dO|·max|v|
// and E = (1 + u_b)(u_b·C + dv·max|dO|·err_o) + 2u_b·C bounding |ΔdS|/P, dQ is off by
// scale·max|k|·E, dK by scale·max|q|·E·(column sum of P), dV by (2u_b + u_b²)·max|dO|·(column sum
// of the dropped-out weights), plus the fp32 parts. With GQA a column sum runs over the query
// heads of the key/value head too. Soft-capping multiplies dS by g = 1 − tanh²(t/c) ≤ 1, which the
// kernel computes from its own t: |Δg| ≤ 0.77·Δt/c (|g'| = 2|tanh|·g/c), Δt the fp32 error of the
// scaled product, so E grows by 2C·min(1, 0.77·Δt/c).

struct WeightStats {
  double col_a = 0, col_p = 0;  // largest column sums, with dropout (a) and without (P)
};
WeightStats weight_stats(const Case& c, const Inputs& in) {
  const Dims& s = c.s;
  const int64_t group = s.H / c.Hkv;
  WeightStats w;
  for (bool dropped : {true, false}) {
    AttentionOptions o = c.options;
    if (!dropped) o.dropout = 0.0f;
    Tensor out = Tensor::zeros({s.B, s.N, s.H, s.dv}), weights = Tensor::zeros({s.B, s.H, s.N, s.M});
    attention_reference_forward(in.q.f32, in.k.f32, in.v.f32, o, out, &weights);
    const float* a = weights.data<float>();
    double max_col = 0;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t hk = 0; hk < c.Hkv; ++hk)
        for (int64_t j = 0; j < s.M; ++j) {
          double col = 0;
          for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
            for (int64_t i = 0; i < s.N; ++i) col += a[((b * s.H + h) * s.N + i) * s.M + j];
          max_col = std::max(max_col, col);
        }
    (dropped ? w.col_a : w.col_p) = max_col;
  }
  return w;
}

void check_backward(const Case& c) {
  SCOPED_TRACE(describe(c));
  const Inputs in = make_inputs(c);
  const Dims& s = c.s;
  const Tensor g = test::random_tensor({s.B, s.N, s.H, s.dv + 2}, c.seed + 3).narrow(3, 1, s.dv);
  const Outcome ref = test::run_reference(in.q.f32, in.k.f32, in.v.f32, g, c.options, true);
  const Bounds fb = derive_bounds(c, in);
  const WeightStats w = weight_stats(c, in);
  const double u = kUBf16, keep = 1.0 / (1.0 - c.options.dropout), scale = attention_scale(c.options, s.d);
  const double qmax = max_abs(in.q.f32), kmax = max_abs(in.k.f32), vmax = max_abs(in.v.f32), gmax = max_abs(g);
  const double dv = static_cast<double>(s.dv), rel = fb.rel, ds_mag = dv * gmax * vmax;
  const double C = keep * dv * gmax * vmax;
  const double eps = detail::kExp2PRelError;  // P's polynomial (util/flash_bf16_cases.h)
  double E = (1.0 + u) * (u * C + dv * gmax * fb.out) + 2.0 * (u + eps) * C;
  if (c.options.softcap > 0) {
    const double dt = 2.0 * (test::gamma_n(s.d) + 2.0 * kU) * std::fabs(scale) * s.d * qmax * kmax;
    E += 2.0 * C * std::min(1.0, 0.77 * dt / c.options.softcap);
  }
  const double tol_dq = scale * kmax * E + rel * std::max(max_abs(ref.grads.dq), scale * kmax * ds_mag);
  const double tol_dk = scale * qmax * E * w.col_p +
                        rel * std::max(max_abs(ref.grads.dk), scale * qmax * ds_mag * std::max(1.0, w.col_p));
  const double tol_dv =
      (2.0 * u + u * u + eps) * gmax * w.col_a + rel * std::max(max_abs(ref.grads.dv), gmax * std::max(1.0, w.col_a));

  Outcome r = run_bf16(c, in);
  expect_within(r.out, ref.out, fb.out, "out");
  const Tensor kv = Tensor::full({s.B, s.M, c.Hkv, s.d + s.dv}, NAN);
  r.grads = {Tensor::full({s.B, s.N, s.H, s.d + 1}, NAN).narrow(3, 0, s.d), kv.narrow(3, 0, s.d),
             kv.narrow(3, s.d, s.dv)};
  attention_flash_bf16_backward({in.q.bf, in.k.bf, in.v.bf, r.out, r.lse}, g, c.options, r.grads, c.config);
  expect_within(r.grads.dq, ref.grads.dq, tol_dq, "dq");
  expect_within(r.grads.dk, ref.grads.dk, tol_dk, "dk");
  expect_within(r.grads.dv, ref.grads.dv, tol_dv, "dv");
}

// On the portable backward (attention/flash_bf16_portable_backward.cpp), on the automatic backward path (the fp32 SIMD
// tiles of attention/flash.cpp on most CPUs) where flash_bf16_supports_variants says it runs them, and, for calls
// without soft-capping or ALiBi (GQA), on the vdpbf16ps and emulated AMX backwards where the CPU has AVX-512 BF16.
void check_backward_paths(const Case& c) {
  struct Setting {
    Bf16Isa isa;
    bool emulated_amx;
  };
  std::vector<Setting> settings{{Bf16Isa::kPortable, false}, {Bf16Isa::kAuto, false}};
  const bool score_variants = c.options.softcap > 0.0f || !c.options.alibi_slopes.empty();
  if (cpu_has_avx512_bf16() && !score_variants) {
    settings.push_back({Bf16Isa::kAvx512Bf16, false});
    settings.push_back({Bf16Isa::kAvx512Bf16, true});
  }
  std::vector<std::string> seen;
  for (const Setting& setting : settings) {
    ScopedIsa scoped(setting.isa);
    detail::set_amx_emulation(setting.emulated_amx);
    const std::string path = attention_flash_bf16_backward_path();
    // The packed paths run GQA; calls with score variants leave them for the fp32 SIMD tiles.
    const bool packed = path == "avx512_bf16" || path == "amx_bf16" || path == "amx_bf16_emulated";
    const bool runs = setting.isa == Bf16Isa::kPortable || (packed && !score_variants) ||
                      flash_bf16_supports_variants(c.s.H, c.Hkv, c.options, true);
    const bool skip = !runs || std::find(seen.begin(), seen.end(), path) != seen.end() ||
                      (setting.isa == Bf16Isa::kAuto && path == "portable");
    seen.push_back(path);
    if (!skip) {
      SCOPED_TRACE("backward path " + path);
      check_backward(c);
    }
    detail::set_amx_emulation(false);
  }
}

TEST(Bf16VariantsBackward, MatchesReference) {
  for (int64_t Hkv : {4, 2, 1})
    for (const Mask& mask : {Mask(), Mask::causal()}) {
      Case c{{2, 37, 53, 4, 24, 20}, Hkv, {}, {9, 16}};
      c.options.mask = mask;
      check_backward_paths(c);
      c.options.softcap = 2.0f;
      check_backward_paths(c);
      c.options.softcap = 0.0f;
      c.options.alibi_slopes = alibi_paper_slopes(4);
      check_backward_paths(c);
      c.options.k_positions = random_positions(c.s.M, 100, 51);
      check_backward_paths(c);
    }
  // Few key/value heads: their key tiles cut into 5 runs (attention/backward_split.h) over 3 threads.
  for (int64_t Hkv : {2, 1}) {
    const test::PinnedSplitRuns pin(5);
    test::ScopedThreads threads(3);
    Case c{{1, 90, 75, 4, 24, 20}, Hkv, {}, {9, 16}};
    c.options.mask = Mask::causal();
    check_backward_paths(c);
  }
  for (float cap : {0.05f, 30.0f}) {
    Case c{{1, 50, 40, 2, 32, 16}, 1, {}, {16, 16}, true, 5, 4.0f};
    c.options.softcap = cap;
    check_backward_paths(c);
  }
}

TEST(Bf16VariantsBackward, AllVariantsMasksDropoutAndTiles) {
  for (const MaskCase& mc :
       test::pick(test::tile_mask_cases(),
                  {"none", "causal_top_left", "key_padding", "sliding_window", "block_sparse_odd", "additive_hnm"})) {
    SCOPED_TRACE("mask " + mc.name);
    Case c = with_all_variants({{2, 41, 67, 4, 24, 16}, 4, {}, {9, 13}});
    c.options.mask = mc.make(c.s);
    check_backward_paths(c);
  }
  for (float p : {0.1f, 0.5f}) {
    Case c = with_all_variants({{2, 33, 40, 4, 16, 16}, 4, {}, {8, 16}});
    c.options.mask = Mask::causal();
    c.options.dropout = p;
    c.options.dropout_seed = 7;
    check_backward_paths(c);
  }
  for (const FlashConfig& config : {FlashConfig{1, 1}, FlashConfig{7, 200}, FlashConfig{200, 7}}) {
    Case c = with_all_variants({{1, 65, 63, 2, 17, 5}, 2, {}, config});
    check_backward_paths(c);
  }
}

// Keys no query sees (padding) and queries that see no key get exactly zero gradients; and the
// portable backward gives the same bits for 1 and 2 threads.
TEST(Bf16VariantsBackward, PortableFullyMaskedAndThreadCounts) {
  ScopedIsa scoped(Bf16Isa::kPortable);
  Case c = with_all_variants({{2, 70, 40, 4, 8, 8}, 4, {}, {16, 16}});
  c.options.mask = Mask::causal() & Mask::key_padding({35, 0});
  const Inputs in = make_inputs(c);
  const Tensor g = test::random_tensor({2, 70, 4, 8}, 9);
  AttentionGrads grads[2];
  for (int threads : {1, 2}) {
    test::ScopedThreads scoped_threads(threads);
    const Outcome r = run_bf16(c, in);
    AttentionGrads& gr = grads[threads - 1];
    gr = {Tensor::full({2, 70, 4, 8}, NAN), Tensor::full({2, 40, 2, 8}, NAN), Tensor::full({2, 40, 2, 8}, NAN)};
    attention_flash_bf16_backward({in.q.bf, in.k.bf, in.v.bf, r.out, r.lse}, g, c.options, gr, c.config);
  }
  EXPECT_EQ(grads[0].dq.to_vector(), grads[1].dq.to_vector());
  EXPECT_EQ(grads[0].dk.to_vector(), grads[1].dk.to_vector());
  EXPECT_EQ(grads[0].dv.to_vector(), grads[1].dv.to_vector());
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < 70; ++i)
      for (int64_t e = 0; e < 8; ++e) {
        ASSERT_EQ(grads[0].dq.at({1, i, h, e}), 0.0f) << i;
        if (i < 30) {
          ASSERT_EQ(grads[0].dq.at({0, i, h, e}), 0.0f) << i;
        }
      }
  for (int64_t hk = 0; hk < 2; ++hk)
    for (int64_t j = 0; j < 40; ++j)
      for (int64_t e = 0; e < 8; ++e) {
        ASSERT_EQ(grads[0].dv.at({1, j, hk, e}), 0.0f);
        if (j >= 35) {
          ASSERT_EQ(grads[0].dk.at({0, j, hk, e}), 0.0f) << j;
        }
      }
  check_backward_paths(c);
}

INSTANTIATE_TEST_SUITE_P(Paths, Bf16Variants,
                         ::testing::Values("amx_bf16", "amx_bf16_emulated", "avx512_bf16", "portable"),
                         [](const auto& info) { return info.param; });

// --- the tests' power -------------------------------------------------------------------------

// Each variant moves the reference's output by far more than the tolerance on the cases above:
// a kernel that ignored one (or, for GQA, read key/value head 0 for every query head) fails.
TEST(Bf16VariantsTolerance, VariantsChangeTheResultBeyondTheTolerance) {
  Case base{{2, 41, 67, 4, 24, 24}, 2, {}};
  base.options.mask = Mask::additive(test::random_tensor({41, 67}, 3, -3.0f, 3.0f));
  base.qk_range = 3.0f;
  const Inputs in = make_inputs(base);
  const auto out_of = [&](const Case& c, const Inputs& x) { return run_reference(c, x).out; };
  Case cap = base, alibi = base;
  cap.options.softcap = 0.5f;
  alibi.options.alibi_slopes = alibi_paper_slopes(4);
  const double tol = derive_bounds(cap, in).out;
  const auto distance = [](const Tensor& a, const Tensor& b) { return test::compare(a, b, 0.0, 0.0).max_abs_diff; };
  EXPECT_GT(distance(out_of(cap, in), out_of(base, in)), 10 * tol);
  EXPECT_GT(distance(out_of(alibi, in), out_of(base, in)), 10 * derive_bounds(alibi, in).out);
  // GQA: every query head on key/value head 0 instead of h / 2.
  Inputs first = in;
  first.k.f32 = in.k.f32.narrow(2, 0, 1).contiguous();
  first.v.f32 = in.v.f32.narrow(2, 0, 1).contiguous();
  Case mqa = base;
  mqa.Hkv = 1;
  EXPECT_GT(distance(out_of(mqa, first), out_of(base, in)), 10 * derive_bounds(base, in).out);
}

}  // namespace
}  // namespace cabm
