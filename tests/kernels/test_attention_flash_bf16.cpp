// The bf16 flash forward against the fp32 reference attention run on the same bf16-rounded
// inputs, and its paths (portable, fp32 SIMD tiles, AVX-512 BF16, AMX, emulated AMX) against each
// other: odd sizes and tails, every mask kind, dropout, tile sizes, strided heads, thread counts,
// fully masked rows, very large logits; the path names and the vector bf16 rounding. The
// backward: test_attention_flash_bf16_backward.cpp; shared helpers and the
// tolerances, with their derivation: util/flash_bf16_cases.h.
#include "cabm/core/threads.h"
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/attention/reference.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/simd.h"
#include "util/attention_cases.h"
#include "util/flash_bf16_cases.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

// Inside the helpers' namespace: test::'s names (Dims, FlashCase, Outcome, expect_within, ...) and
// util/flash_bf16_cases.h's without using-declarations.
namespace cabm::test::flash_bf16 {
namespace {

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
    const Outcome base = setting.isa == Bf16Isa::kPortable
                             ? portable
                             : portable_on_tiles_of(setting, in, c.options, c.config, false, portable);
    ScopedPath scoped(setting);
    const std::string path = attention_flash_bf16_path();
    const Outcome r = run_bf16(in, c.options, c.config, false);
    expect_within(r.out, ref.out, (kUWeights + rel) * keep * vmax, path + " out");
    // lse is computed from the unrounded fp32 weights: fp32 bounds only, absolute in the scores' units.
    EXPECT_CLOSE(r.lse, ref.lse, 4.0 * kU, rel * (1.0 + smax));
    if (setting.isa == Bf16Isa::kPortable) {
      portable = r;
    } else {
      expect_within(r.out, base.out, rel * keep * vmax + 2.0 * kUBf16 * w.max_a * vmax, path + " out vs portable");
      EXPECT_CLOSE(r.lse, base.lse, 4.0 * kU, rel * (1.0 + smax));
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

// Negative, zero and positive scales (PyTorch's `scale` takes any float): without a mask the row
// pass takes the maximum of the raw scores where the scale is >= 0 and of the scaled ones where it
// is negative (attention/bf16_avx512.h). Scores spread over hundreds of units, so that a wrong
// maximum overflows P; key tiles of 48 (the fused avx512_bf16 step), 200 and the wide defaults
// (the separate row pass), with and without a mask; every forward path.
TEST(AttentionFlashBf16, ForwardAnySignOfScale) {
  const Dims s{1, 260, 300, 2, 24, 16};
  for (float scale : {-0.7f, 0.0f, 0.45f})
    for (const MaskCase& mc : test::pick(mask_cases(), {"none", "causal", "key_padding"}))
      for (const FlashConfig& config : {FlashConfig{}, FlashConfig{16, 48}, FlashConfig{13, 200}}) {
        SCOPED_TRACE("scale " + std::to_string(scale) + " mask " + mc.name);
        FlashCase c{s, {}, config, false, 21, 6.0f};
        c.options.scale = scale;
        c.options.mask = mc.make(s);
        check_forward(c);
      }
}

// Sequences long enough for the packed paths' wide default tiles (ForwardTilesPerPath): key tiles
// clipped at the causal diagonal and at padding, a tail tile, dropout; every forward path.
TEST(AttentionFlashBf16, ForwardWideTilesOfLongSequences) {
  const Dims s{2, 290, 900, 1, 40, 24};
  for (const MaskCase& mc : test::pick(mask_cases(), {"none", "causal", "causal_top_left", "causal_and_padding"}))
    for (float dropout : {0.0f, 0.2f}) {
      SCOPED_TRACE("mask " + mc.name + " dropout " + std::to_string(dropout));
      FlashCase c{s, {}, {}, false, 11};
      c.options.mask = mc.make(s);
      c.options.dropout = dropout;
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
// The widened fp32 tiles run here whatever the automatic choice is (they once broke on causal
// tiles with N ≠ M while every CPU measured took vdpbf16ps or AMX; kernels/bf16.h).
TEST(AttentionFlashBf16, WidenedFp32PathIsTested) {
  if (bf16_portable_forced() || std::string(flash_isa()) == "portable")
    GTEST_SKIP() << "the SIMD set is portable or portable is forced: no widened fp32 tiles";
  const std::string simd = std::string(flash_isa()) + "_fp32";
  EXPECT_TRUE(has(path_names(forward_paths(), &attention_flash_bf16_path), simd.c_str()));
  EXPECT_TRUE(has(path_names(backward_paths(), &attention_flash_bf16_backward_path), simd.c_str()));
}
TEST(AttentionFlashBf16, AmxPathIsTested) {
  if (!cpu_has_amx_bf16()) GTEST_SKIP() << "this CPU (or OS) has no AMX-BF16 tiles: amx_bf16 tested only emulated";
  if (!bf16_amx_active()) GTEST_SKIP() << "CABM_NO_AMX or CABM_FORCE_PORTABLE set: amx_bf16 tested only emulated";
  EXPECT_TRUE(has(path_names(forward_paths(), &attention_flash_bf16_path), "amx_bf16"));
  EXPECT_TRUE(has(path_names(backward_paths(), &attention_flash_bf16_backward_path), "amx_bf16"));
}

// The packed paths' default tiles are wider (768 keys; AMX: 32 × 768) except where a narrow band or
// blocks, or a short sequence, keep flash_resolved_config's; the other paths take those (the fp32
// SIMD tiles its fp32 rules); explicit sizes win on every path.
TEST(AttentionFlashBf16, ForwardTilesPerPath) {
  const Tensor q = Tensor::empty({1, 1024, 2, 64}, DType::BF16), short_q = Tensor::empty({1, 200, 2, 64}, DType::BF16);
  AttentionOptions none, causal, window;
  causal.mask = Mask::causal();
  window.mask = Mask::sliding_window(64, 0);
  for (const PathSetting& setting : forward_paths()) {
    ScopedPath scoped(setting);
    const std::string path = attention_flash_bf16_path();
    SCOPED_TRACE(path);
    const bool amx = path.rfind("amx_bf16", 0) == 0, packed = amx || path == "avx512_bf16";
    const DType rules = path == std::string(flash_isa()) + "_fp32" ? DType::F32 : DType::BF16;
    const auto tiles = [](const Tensor& x, const AttentionOptions& o, FlashConfig c = {}) {
      const FlashConfig t = attention_flash_bf16_forward_tiles(x, o, c);
      return std::vector<int64_t>{t.block_q, t.block_k};
    };
    const auto resolved = [&](const Tensor& x, const AttentionOptions& o) {
      const FlashConfig t = flash_resolved_config({}, o, x.size(3), x.size(1), false, rules);
      return std::vector<int64_t>{t.block_q, (t.block_k + 15) / 16 * 16};
    };
    const auto wide = [&](const AttentionOptions& o) {
      return std::vector<int64_t>{amx ? 32 : resolved(q, o)[0], 768};
    };
    EXPECT_EQ(tiles(q, none), packed ? wide(none) : resolved(q, none));
    EXPECT_EQ(tiles(q, causal), packed ? wide(causal) : resolved(q, causal));
    EXPECT_EQ(tiles(short_q, none), resolved(short_q, none));
    EXPECT_EQ(tiles(short_q, causal), resolved(short_q, causal));
    EXPECT_EQ(tiles(q, window), resolved(q, window));
    EXPECT_EQ(tiles(q, none, {24, 40}), (std::vector<int64_t>{24, 48}));
    EXPECT_EQ(tiles(q, causal, {0, 200}), (std::vector<int64_t>{amx ? 32 : resolved(q, causal)[0], 208}));
  }
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
    {
      ScopedIsa scoped(Bf16Isa::kAvx512Bf16);
      EXPECT_STREQ(attention_flash_bf16_path(), "avx512_bf16");
    }
    // The automatic choice without AMX: vdpbf16ps where it outruns fp32 FMAs, else the widened
    // tiles on the SIMD set (bf16.h).
    if (!bf16_amx_active() && !bf16_portable_forced() && std::string(flash_isa()) != "portable") {
      const std::string want = bf16_vdpbf16ps_active() ? "avx512_bf16" : simd;
      EXPECT_EQ(attention_flash_bf16_path(), want) << bf16_products_summary();
      EXPECT_EQ(attention_flash_bf16_backward_path(), want) << bf16_products_summary();
    }
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
}  // namespace cabm::test::flash_bf16
