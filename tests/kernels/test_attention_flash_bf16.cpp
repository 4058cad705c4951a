// The bf16 flash kernels (forward and backward) against the fp32 reference attention run on the
// same bf16-rounded inputs, and their paths (portable, fp32 SIMD tiles, AVX-512 BF16) against each
// other: odd sizes and tails, every mask kind, dropout, tile sizes, strided heads, thread counts,
// fully masked rows, very large logits.
//
// Tolerances (Higham 2002, §3.1 for the fp32 parts). u = 2^-24 (fp32), u_b = 2^-8 (bf16's unit
// roundoff: 8 significant bits, half of its epsilon 2^-7). q, k, v hold bf16 values, exact in
// fp32, and bf16·bf16 products are exact in fp32, so the scores carry only fp32 summation error. The fp32 part of every
// bound is the fp32 flash test's: a relative bound rel = 2(2γ_d·smax + 2γ_dv + γ_max(N,M) + 8u)
// applied to each tensor's magnitude (norm-wise), where smax bounds |scale·q·k| + |bias|. On top of
// it, the bf16 roundings, each a relative error of at most u_b on one operand:
//  - forward: P before P·V. o_i = Σ_j a_ij v_j with Σ_j a_ij ≤ keep = 1/(1 − dropout), so o is off
//    by at most u_b·keep·max|v|;
//  - dV_j = Σ_i a_ij dO_i with a and dO both rounded: (2u_b + u_b²)·max|dO|·max_j Σ_i a_ij (the
//    column sums of the dropped-out weights, computed from the reference's weights);
//  - dP_ij = z_ij·dO_i·v_j with dO rounded: u_b·C, C = keep·dv·max|dO|·max|v| (C also bounds |dP|
//    and |D|); D_i = dO_i·O_i uses the bf16 forward's output: dv·max|dO|·(bound on o above);
//    dS = P(dP − D) rounded: a further u_b·|dS| ≤ 2u_b·P·C. So |ΔdS_ij| ≤ P_ij·E with
//    E = (1 + u_b)(u_b·C + dv·max|dO|·err_o) + 2u_b·C;
//  - dQ_i = scale·Σ_j dS_ij k_j with Σ_j P_ij ≤ 1: scale·max|k|·E;
//  - dK_j = scale·Σ_i dS_ij q_i: scale·max|q|·E·max_j Σ_i P_ij (column sums of the weights
//    without dropout).
// Paths against each other: the same roundings at the same points (the forward also with the same
// tiles: P is rounded relative to the running maximum), so they differ by the fp32 parts, except
// that a rounded operand whose two fp32 values straddle a bf16 rounding boundary goes different
// ways: one bf16 ulp (2u_b relative) of one term. Two checks: every element within the fp32 part
// plus one such flip of the largest term of its sum; and, where the fp32 bound is below u_b (not
// for huge logits), the distance between the paths a small fraction of their distance to the fp32
// reference (expect_same_roundings): the norm-wise fp32 bounds are too loose to notice a missing
// rounding of dS, this check is not.
#include "cabm/core/threads.h"
#include "cabm/kernels/attention/flash_amx.h"
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/attention/reference.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/simd.h"
#include "util/attention_cases.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace cabm {
namespace {

using test::Dims;
using test::expect_within;
using test::FlashCase;
using test::kU;
using test::MaskCase;
using test::max_abs;
using test::Outcome;

constexpr double kUBf16 = 0x1p-8;

// A bf16 head view [B, L, H, d] (strided: heads of a [B, L, 2, H, d + 1] buffer) and the same view
// of the fp32 values it holds.
struct Heads {
  Tensor bf, f32;
};
Heads make_heads(int64_t B, int64_t L, int64_t H, int64_t d, uint64_t seed, bool strided, float range = 1.0f) {
  const Shape shape = test::head_buffer_shape(B, L, H, d, strided);
  Tensor x = test::random_tensor(shape, seed, -range, range);
  Tensor xb = Tensor::empty(shape, DType::BF16);
  float_to_bf16(x.data<float>(), xb.data<bf16>(), x.numel());
  bf16_to_float(xb.data<bf16>(), x.data<float>(), x.numel());
  return {test::head_view(xb, d, strided), test::head_view(x, d, strided)};
}

// q, k, v as bf16 (and their fp32 values) and dO (fp32, not bf16-representable: the kernel rounds it).
struct Inputs {
  Dims s;
  Heads q, k, v;
  Tensor g;
};
Inputs make_inputs(const Dims& s, uint64_t seed, bool strided, float qk_range = 1.0f) {
  Tensor g = strided ? test::random_tensor({s.B, s.N, s.H, s.dv + 2}, seed + 3).narrow(3, 1, s.dv)
                     : test::random_tensor({s.B, s.N, s.H, s.dv}, seed + 3);
  return {s, make_heads(s.B, s.N, s.H, s.d, seed, strided, qk_range),
          make_heads(s.B, s.M, s.H, s.d, seed + 1, strided, qk_range),
          make_heads(s.B, s.M, s.H, s.dv, seed + 2, strided), g};
}

// A subset of the fp32 flash test's mask kinds, and two combinations of its own.
std::vector<MaskCase> mask_cases() {
  std::vector<MaskCase> cases =
      test::pick(test::tile_mask_cases(),
                 {"none", "causal", "causal_top_left", "key_padding", "sliding_window", "block_sparse_odd", "allow_nm",
                  "additive_hnm", "additive_transposed", "allow_key_broadcast", "window_padding_tensors"});
  cases.push_back({"causal_and_padding", [](const Dims& s) {
                     return Mask::causal() & Mask::key_padding({s.M, s.M / 2 + 1});
                   }});
  cases.push_back({"window_block_allow_additive", [](const Dims& s) {
                     return Mask::sliding_window(30, 10) & Mask::block_sparse(test::random_layout(s, 8, 8, 27, 0.7f)) &
                            Mask::allow(test::random_bool({s.B, 1, s.N, s.M}, 28, 0.8f)) &
                            Mask::additive(test::random_tensor({s.N, s.M}, 29, -1.0f, 1.0f));
                   }});
  return cases;
}

// --- paths ------------------------------------------------------------------------------------

struct ScopedIsa {
  explicit ScopedIsa(Bf16Isa isa) { set_bf16_isa_override(isa); }
  ~ScopedIsa() { set_bf16_isa_override(Bf16Isa::kAuto); }
};

// One way to reach a path: the override, and whether the AMX forward runs on the scalar model of
// the tiles (attention/amx_tiles.h), which any AVX-512 BF16 CPU runs.
struct PathSetting {
  Bf16Isa isa;
  bool emulated_amx = false;
};
struct ScopedPath {
  explicit ScopedPath(const PathSetting& setting) : isa(setting.isa) {
    detail::set_amx_emulation(setting.emulated_amx);
  }
  ~ScopedPath() { detail::set_amx_emulation(false); }
  ScopedIsa isa;
};

// The settings that reach each distinct path at run time: forced portable, the automatic choice
// (amx_bf16 on a CPU with AMX tiles; avx2_fp32 on a CPU without AVX-512 BF16 built with SIMD;
// unless CABM_FORCE_PORTABLE or CABM_NO_AMX is set), and, where the CPU has AVX-512 BF16, that
// path without AMX and the AMX kernels on emulated tiles (amx_bf16_emulated). `name` picks the
// forward's or the backward's path names.
std::vector<PathSetting> paths(const char* (*name)()) {
  std::vector<PathSetting> out;
  std::vector<std::string> seen;
  std::vector<PathSetting> candidates{{Bf16Isa::kPortable}, {Bf16Isa::kAuto}};
  if (cpu_has_avx512_bf16()) {
    candidates.push_back({Bf16Isa::kAvx512Bf16});
    candidates.push_back({Bf16Isa::kAvx512Bf16, true});
  }
  for (const PathSetting& setting : candidates) {
    ScopedPath scoped(setting);
    if (std::find(seen.begin(), seen.end(), name()) != seen.end()) continue;
    seen.emplace_back(name());
    out.push_back(setting);
  }
  return out;
}
std::vector<PathSetting> forward_paths() {
  return paths(&attention_flash_bf16_path);
}
std::vector<PathSetting> backward_paths() {
  return paths(&attention_flash_bf16_backward_path);
}

// --- running the kernels ----------------------------------------------------------------------

// The fp32 reference on the bf16 values.
Outcome run_reference(const Inputs& in, const AttentionOptions& options, bool backward) {
  return test::run_reference(in.q.f32, in.k.f32, in.v.f32, in.g, options, backward);
}

void run_backward(const Inputs& in, const Outcome& saved, const AttentionOptions& options, const FlashConfig& config,
                  Outcome& r) {
  r.grads = test::strided_grads(in.s);
  attention_flash_bf16_backward({in.q.bf, in.k.bf, in.v.bf, saved.out, saved.lse}, in.g, options, r.grads, config);
}

// The bf16 kernels on the current path; out is a strided view inside a wider buffer.
Outcome run_bf16(const Inputs& in, const AttentionOptions& options, const FlashConfig& config, bool backward) {
  Outcome r = test::strided_outputs(in.s);
  attention_flash_bf16_forward(in.q.bf, in.k.bf, in.v.bf, options, r.out, &r.lse, config);
  if (backward) run_backward(in, r, options, config, r);
  return r;
}

// --- bounds -----------------------------------------------------------------------------------

// What the bounds need from the exact weights (the reference's, as [B, H, N, M]): the largest
// weight and the largest column sum, with dropout (a, the weights that meet V) and without (P).
struct WeightStats {
  double max_a = 0, max_p = 0, col_a = 0, col_p = 0;
};
WeightStats weight_stats(const Inputs& in, const AttentionOptions& options) {
  const Dims& s = in.s;
  WeightStats w;
  for (bool dropped : {true, false}) {
    AttentionOptions o = options;
    if (!dropped) o.dropout = 0.0f;
    Tensor out = Tensor::zeros({s.B, s.N, s.H, s.dv}), weights = Tensor::zeros({s.B, s.H, s.N, s.M});
    attention_reference_forward(in.q.f32, in.k.f32, in.v.f32, o, out, &weights);
    const float* a = weights.data<float>();
    double max_weight = 0, max_col = 0;
    for (int64_t bh = 0; bh < s.B * s.H; ++bh)
      for (int64_t j = 0; j < s.M; ++j) {
        double col = 0;
        for (int64_t i = 0; i < s.N; ++i) {
          const double x = a[(bh * s.N + i) * s.M + j];
          col += x;
          max_weight = std::max(max_weight, x);
        }
        max_col = std::max(max_col, col);
      }
    (dropped ? w.max_a : w.max_p) = max_weight;
    (dropped ? w.col_a : w.col_p) = max_col;
  }
  return w;
}

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

  b.out = u * keep * vmax + fp32_out;
  const double c = keep * dv * gmax * vmax;
  const double e = (1.0 + u) * (u * c + dv * gmax * b.out) + 2.0 * u * c;
  b.dv = (2.0 * u + u * u) * gmax * w.col_a + fp32_dv;
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
    expect_within(r.out, portable.out, b.p_out, path + " out vs portable");
    Outcome same_saved;
    run_backward(in, portable, c.options, c.config, same_saved);
    expect_within(same_saved.grads.dq, portable.grads.dq, b.p_dq, path + " dq vs portable");
    expect_within(same_saved.grads.dk, portable.grads.dk, b.p_dk, path + " dk vs portable");
    expect_within(same_saved.grads.dv, portable.grads.dv, b.p_dv, path + " dv vs portable");
    if (b.rel < kUBf16) {  // else fp32 errors (huge logits) may outweigh the bf16 roundings
      expect_same_roundings(r.out, portable.out, ref.out, path + " out");
      expect_same_roundings(same_saved.grads.dq, portable.grads.dq, ref.grads.dq, path + " dq");
      expect_same_roundings(same_saved.grads.dk, portable.grads.dk, ref.grads.dk, path + " dk");
      expect_same_roundings(same_saved.grads.dv, portable.grads.dv, ref.grads.dv, path + " dv");
    }
  }
}

// --- forward ----------------------------------------------------------------------------------

// The forward alone (as before the backward existed), on every forward path.
void check_forward(const FlashCase& c) {
  SCOPED_TRACE(describe(c));
  const Inputs in = make_inputs(c.s, c.seed, c.strided, c.qk_range);
  const Outcome ref = run_reference(in, c.options, false);
  const WeightStats w = weight_stats(in, c.options);
  const double keep = 1.0 / (1.0 - c.options.dropout), vmax = max_abs(in.v.f32);
  const double smax = test::smax_bound(attention_scale(c.options, c.s.d), in.q.f32, in.k.f32, c.options.mask);
  const double rel = 2.0 * test::relative_bound(c.s, smax);
  Outcome portable;
  for (const PathSetting& setting : forward_paths()) {
    ScopedPath scoped(setting);
    const std::string path = attention_flash_bf16_path();
    const Outcome r = run_bf16(in, c.options, c.config, false);
    expect_within(r.out, ref.out, (kUBf16 + rel) * keep * vmax, path + " out");
    // lse is computed from the unrounded fp32 weights: fp32 bounds only, absolute in the scores' units.
    EXPECT_CLOSE(r.lse, ref.lse, 4.0 * kU, rel * (1.0 + smax));
    if (setting.isa == Bf16Isa::kPortable) {
      portable = r;
    } else {
      expect_within(r.out, portable.out, rel * keep * vmax + 2.0 * kUBf16 * w.max_a * vmax, path + " out vs portable");
      EXPECT_CLOSE(r.lse, portable.lse, 4.0 * kU, rel * (1.0 + smax));
    }
  }
}

TEST(AttentionFlashBf16, ForwardOddSizesTilesAndThreads) {
  const std::vector<Dims> sizes = {
      {1, 1, 1, 1, 8, 8}, {2, 37, 53, 3, 17, 19}, {1, 70, 45, 2, 64, 64}, {2, 16, 100, 2, 32, 48}};
  for (int threads : {1, 2}) {
    test::ScopedThreads scoped(threads);
    for (const Dims& s : sizes)
      for (const FlashConfig& config : {FlashConfig{}, FlashConfig{7, 16}, FlashConfig{13, 20}})
        for (bool strided : {false, true}) {
          SCOPED_TRACE("threads " + std::to_string(threads));
          check_forward({s, {}, config, strided});
        }
  }
}

TEST(AttentionFlashBf16, ForwardEveryMaskKind) {
  for (const MaskCase& mc : mask_cases()) {
    SCOPED_TRACE("mask " + mc.name);
    for (const FlashCase& c :
         test::mask_sweep(mc, {Dims{2, 41, 67, 2, 24, 24}}, {FlashConfig{}, FlashConfig{9, 16}}, 1))
      check_forward(c);
  }
}

TEST(AttentionFlashBf16, ForwardDropoutMatchesReferenceDecisions) {
  FlashCase c{{1, 33, 40, 2, 16, 16}, {}, {}, false};
  c.options.dropout = 0.3f;
  c.options.dropout_seed = 99;
  c.options.dropout_offset = 4;
  check_forward(c);
  c.options.mask = Mask::causal();
  c.config = {8, 16};
  c.strided = true;
  check_forward(c);
}

TEST(AttentionFlashBf16, ForwardFullyMaskedRowsGiveZeroAndMinusInfLse) {
  const Dims s{2, 9, 11, 1, 8, 8};
  AttentionOptions options;
  options.mask = Mask::key_padding({11, 0});
  const Inputs in = make_inputs(s, 5, false);
  for (const PathSetting& setting : forward_paths()) {
    ScopedPath scoped(setting);
    SCOPED_TRACE(attention_flash_bf16_path());
    const Outcome r = run_bf16(in, options, {}, false);
    for (int64_t i = 0; i < s.N; ++i) {
      EXPECT_EQ(r.lse.at({1, 0, i}), -INFINITY);
      for (int64_t c = 0; c < s.dv; ++c) EXPECT_EQ(r.out.at({1, i, 0, c}), 0.0f);
    }
  }
}

// Head dims and value dims that are not multiples of the AMX tile widths (32 along d, 16 along
// dv), N and M not multiples of 16, key blocks of 16, 32 and 48 keys (the AMX path reads P·V 32
// keys at a time), and the masks whose key ranges the paths bound. Every forward path.
TEST(AttentionFlashBf16, ForwardHeadDimsAndTails) {
  const std::vector<Dims> sizes = {{2, 17, 33, 2, 1, 1},    {2, 40, 31, 1, 17, 40}, {2, 33, 50, 2, 40, 17},
                                   {2, 50, 47, 1, 80, 96},  {2, 31, 70, 1, 96, 80}, {2, 47, 45, 1, 128, 128},
                                   {2, 20, 37, 1, 130, 130}};
  const std::vector<MaskCase> masks = test::pick(
      mask_cases(), {"none", "causal", "causal_top_left", "key_padding", "sliding_window", "causal_and_padding"});
  for (const Dims& s : sizes)
    for (const MaskCase& mc : masks)
      for (const FlashConfig& config : {FlashConfig{}, FlashConfig{5, 16}, FlashConfig{16, 48}}) {
        SCOPED_TRACE("mask " + mc.name);
        FlashCase c{s, {}, config, true, 7};
        c.options.mask = mc.make(s);
        check_forward(c);
      }
}

// Every forward path gives the same bits for 1 and 2 threads (each row is one thread's work).
TEST(AttentionFlashBf16, ForwardBitIdenticalAcrossThreadCounts) {
  std::vector<FlashCase> cases = test::thread_count_cases();
  FlashCase wide{{2, 77, 90, 3, 40, 24}, {}, {}, true, 3};
  wide.options.mask = Mask::sliding_window(40, 5);
  cases.push_back(wide);
  for (const FlashCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const Inputs in = make_inputs(c.s, c.seed, c.strided);
    for (const PathSetting& setting : forward_paths()) {
      ScopedPath scoped(setting);
      SCOPED_TRACE(attention_flash_bf16_path());
      Outcome runs[2];
      for (int threads : {1, 2}) {
        test::ScopedThreads scoped_threads(threads);
        runs[threads - 1] = run_bf16(in, c.options, c.config, false);
      }
      EXPECT_EQ(runs[0].out.to_vector(), runs[1].out.to_vector());
      EXPECT_EQ(runs[0].lse.to_vector(), runs[1].lse.to_vector());
    }
  }
}

// A query row's output and lse do not depend on the rows that share its tile: dropping the last
// 1–3 queries (no mask, so nothing else changes for the others) moves rows between the kernels'
// 4-, 2- and 1-row groups, and every kept row must keep its bits. Fused scores + softmax (default
// tiles), the separate softmax pass (block_k 128, and soft-capping), on every path.
TEST(AttentionFlashBf16, ForwardRowBitsIndependentOfTileNeighbours) {
  const Dims s{2, 71, 150, 2, 40, 24};
  const Inputs in = make_inputs(s, 91, true);
  AttentionOptions capped;
  capped.softcap = 5.0f;
  const std::vector<std::pair<AttentionOptions, FlashConfig>> runs = {
      {{}, {}}, {{}, {32, 128, 0}}, {capped, {}}, {capped, {16, 48, 0}}};
  for (const PathSetting& setting : forward_paths()) {
    ScopedPath scoped(setting);
    SCOPED_TRACE(attention_flash_bf16_path());
    for (const auto& [options, config] : runs) {
      SCOPED_TRACE(fmt::format("softcap {} block_q {} block_k {}", options.softcap, config.block_q, config.block_k));
      if (options.softcap > 0 && !flash_bf16_supports_variants(s.H, s.H, options, false)) continue;
      Tensor full = Tensor::empty({s.B, s.N, s.H, s.dv}), full_lse = Tensor::empty({s.B, s.H, s.N});
      attention_flash_bf16_forward(in.q.bf, in.k.bf, in.v.bf, options, full, &full_lse, config);
      for (int64_t drop = 1; drop <= 3; ++drop) {
        const int64_t n = s.N - drop;
        Tensor part = Tensor::empty({s.B, n, s.H, s.dv}), part_lse = Tensor::empty({s.B, s.H, n});
        attention_flash_bf16_forward(in.q.bf.narrow(1, 0, n), in.k.bf, in.v.bf, options, part, &part_lse, config);
        EXPECT_EQ(full.narrow(1, 0, n).contiguous().to_vector(), part.to_vector()) << "without the last " << drop;
        EXPECT_EQ(full_lse.narrow(2, 0, n).contiguous().to_vector(), part_lse.to_vector())
            << "without the last " << drop;
      }
    }
  }
}

// With all keys in one tile, the fused scores + softmax step (tiles of at most 96 keys) and the
// separate softmax pass (block_k 128) see the same tile: the same bits, with and without a mask.
TEST(AttentionFlashBf16, ForwardFusedAndSeparateSoftmaxAgreeBitwise) {
  for (const int64_t M : {5, 16, 40, 81, 96}) {
    const Dims s{2, 37, M, 3, 24, 16};
    const Inputs in = make_inputs(s, 40 + M, true);
    for (const bool masked : {false, true}) {
      AttentionOptions options;
      if (masked) options.mask = Mask::causal() & Mask::additive(test::random_tensor({s.N, s.M}, 7, -2.0f, 2.0f));
      for (const PathSetting& setting : forward_paths()) {
        ScopedPath scoped(setting);
        SCOPED_TRACE(fmt::format("{} M {} masked {}", attention_flash_bf16_path(), M, masked));
        Outcome runs[2];
        for (int i = 0; i < 2; ++i) runs[i] = run_bf16(in, options, {16, i == 0 ? 96 : 128, 0}, false);
        EXPECT_EQ(runs[0].out.to_vector(), runs[1].out.to_vector());
        EXPECT_EQ(runs[0].lse.to_vector(), runs[1].lse.to_vector());
      }
    }
  }
}

TEST(AttentionFlashBf16, ForwardVeryLargeLogits) {
  for (const FlashCase& c : test::large_logits_cases()) check_forward(c);
}

// The AMX forward and backward are among the paths the tests here run: on emulated tiles
// wherever the CPU has AVX-512 BF16, and on the tiles themselves wherever it has AMX.
std::vector<std::string> path_names(const std::vector<PathSetting>& settings, const char* (*name)()) {
  std::vector<std::string> names;
  for (const PathSetting& setting : settings) {
    ScopedPath scoped(setting);
    names.emplace_back(name());
  }
  return names;
}
bool has(const std::vector<std::string>& names, const char* name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}
TEST(AttentionFlashBf16, AmxEmulatedPathIsTested) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU (or OS) has no AVX-512 BF16: amx_bf16_emulated not tested";
  const std::vector<std::string> forward = path_names(forward_paths(), &attention_flash_bf16_path);
  const std::vector<std::string> backward = path_names(backward_paths(), &attention_flash_bf16_backward_path);
  EXPECT_TRUE(has(forward, "amx_bf16_emulated"));
  EXPECT_TRUE(has(forward, "avx512_bf16"));
  EXPECT_TRUE(has(backward, "amx_bf16_emulated"));
  EXPECT_TRUE(has(backward, "avx512_bf16"));
}
TEST(AttentionFlashBf16, AmxPathIsTested) {
  if (!cpu_has_amx_bf16()) GTEST_SKIP() << "this CPU (or OS) has no AMX-BF16 tiles: amx_bf16 tested only emulated";
  if (!bf16_amx_active()) GTEST_SKIP() << "CABM_NO_AMX or CABM_FORCE_PORTABLE set: amx_bf16 tested only emulated";
  EXPECT_TRUE(has(path_names(forward_paths(), &attention_flash_bf16_path), "amx_bf16"));
  EXPECT_TRUE(has(path_names(backward_paths(), &attention_flash_bf16_backward_path), "amx_bf16"));
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

TEST(AttentionFlashBf16Backward, TileSizes) {
  for (const FlashCase& c : test::tile_size_cases({2, 100, 90, 2, 20, 12}, 47,
                                                  {FlashConfig{1, 1}, FlashConfig{3, 5}, FlashConfig{7, 16},
                                                   FlashConfig{13, 20}, FlashConfig{200, 7}, FlashConfig{7, 200}}))
    check_backward(c);
}

TEST(AttentionFlashBf16Backward, ThreadCounts) {
  // One head (the fp32 SIMD path splits its key tiles between threads and sums dq partials) and
  // three (whole heads per thread). Equal thread counts give equal bits; the portable path and
  // dk, dv (one writer per key tile) are bitwise independent of the thread count; dq of the SIMD
  // path may differ between 1 and 2 threads by the order of a few fp32 additions.
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
      EXPECT_EQ(one.grads.dk.to_vector(), two.grads.dk.to_vector());
      EXPECT_EQ(one.grads.dv.to_vector(), two.grads.dv.to_vector());
      if (setting.isa == Bf16Isa::kPortable) {
        EXPECT_EQ(one.grads.dq.to_vector(), two.grads.dq.to_vector());
      }
      expect_within(two.grads.dq, one.grads.dq, b.p_dq, "dq 2 threads vs 1");
      expect_within(two.grads.dq, ref.grads.dq, b.dq, "dq vs reference");
    }
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

// --- pieces -----------------------------------------------------------------------------------

TEST(AttentionFlashBf16, RejectsF32Inputs) {
  Tensor q = Tensor::zeros({1, 4, 1, 8}), out = Tensor::zeros({1, 4, 1, 8});
  EXPECT_THROW(attention_flash_bf16_forward(q, q, q, {}, out), Error);
}

TEST(AttentionFlashBf16, PathNames) {
  {
    ScopedIsa scoped(Bf16Isa::kPortable);
    EXPECT_STREQ(attention_flash_bf16_path(), "portable");
    EXPECT_STREQ(attention_flash_bf16_backward_path(), "portable");
  }
  const std::string simd = std::string(flash_isa()) + "_fp32";
  if (cpu_has_avx512_bf16()) {
    ScopedIsa scoped(Bf16Isa::kAvx512Bf16);
    EXPECT_STREQ(attention_flash_bf16_path(), "avx512_bf16");
  } else if (!bf16_portable_forced() && std::string(flash_isa()) != "portable") {
    EXPECT_EQ(attention_flash_bf16_path(), simd);
    EXPECT_EQ(attention_flash_bf16_backward_path(), simd);
  }
}

// simd::round_to_bf16 is float_to_bf16 then back, bit for bit: special values and random bits.
TEST(AttentionFlashBf16, SimdRoundToBf16MatchesScalar) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                0xff812345u, 0x7f7fffffu, 0x7f7f8000u, 0x00000001u, 0x00008000u, 0x00018000u,
                                0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f80ffffu, 0x807fffffu};
  uint64_t x = 0x9e3779b97f4a7c15ull;
  while (bits.size() < 4096) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    bits.push_back(static_cast<uint32_t>(x >> 32));
  }
  std::vector<float> in(bits.size()), out(bits.size());
  std::memcpy(in.data(), bits.data(), bits.size() * 4);
  for (size_t n = 0; n + simd::kWidth <= in.size(); n += simd::kWidth)
    simd::store(&out[n], simd::round_to_bf16(simd::load(&in[n])));
  for (size_t n = 0; n < in.size(); ++n) {
    const float expected = bf16_to_float(float_to_bf16(in[n]));
    uint32_t a, e;
    std::memcpy(&a, &out[n], 4);
    std::memcpy(&e, &expected, 4);
    ASSERT_EQ(a, e) << std::hex << bits[n];
  }
}

}  // namespace
}  // namespace cabm
