// Random combinations through the attention entry points (attention_forward / attention_backward):
// the other attention tests walk fixed case lists, one option at a time or in chosen pairs; here
// each case draws every option at once (sizes from 1 to a few hundred, odd head dims, GQA, every
// mask part, dropout, scale, soft-capping, ALiBi with and without positions, sinks, strided heads,
// large logits) and runs on every fp32 SIMD set and every bf16 path this CPU reaches, with 1 and 2
// threads, against the fp32 reference.
//
// CABM_RANDOM_CASES (default 60) and CABM_RANDOM_SEED (default 1) widen the run: on a new CPU,
// `CABM_RANDOM_CASES=3000 build/release/tests/test_attention_random` takes a few minutes and
// exercises the paths only that CPU has (AMX tiles, AVX2-only caches) with thousands of cases.
//
// Tolerances. fp32: test_attention_flash_variants.cpp's bound (util/attention_cases.h: Higham's γ_n
// of each sum, the score bound smax = |scale|·d·max|q|·max|k| + ALiBi + the additive biases, the
// tanh roundings of soft-capping; doubled, both kernels carry it) on the same magnitudes. bf16: the reference on the
// bf16 values, and on top of the fp32 bound the roundings the bf16 kernels add (P, dO, P∘z and dS
// to bf16: 2^-9 relative each; 8·2^-9 covers the few each result goes through), as that test's
// Bf16SimdPathRunsTheVariants. A kernel that dropped a mask part, a variant or a key tile, or read
// the wrong key/value head, would be off by a large fraction of the magnitudes; the fp32 bound is
// near 1e-5 of them here. Thread counts: the same bits (the kernels' contract).
#include "cabm/core/rng.h"
#include "cabm/kernels/attention/attention.h"
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/bf16.h"
#include "util/attention_cases.h"
#include "util/flash_bf16_cases.h"
#include "util/simd_isas.h"
#include "util/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace cabm {
namespace {

using test::Dims;
using test::max_abs;
using test::Outcome;

using test::Draw;
using test::env_int;

struct Case {
  int64_t B, N, M, H, Hkv, d, dv;
  bool strided;
  float qk_range;
  AttentionOptions options;
  std::string text;
};

Case draw_case(Draw& r) {
  Case c{};
  static const int64_t kDims[] = {1, 3, 8, 16, 31, 32, 33, 48, 64, 80, 96, 100, 128, 160, 256};
  c.B = r.in(1, 3);
  c.N = r.chance(0.15) ? r.in(1, 4) : r.in(1, 300);  // a few query rows: the decode kernel
  c.M = r.chance(0.4) ? c.N : r.in(1, 300);
  c.Hkv = r.in(1, 3);
  c.H = c.Hkv * r.in(1, 3);
  c.d = r.chance(0.7) ? kDims[r.in(0, 14)] : r.in(1, 200);
  c.dv = r.chance(0.6) ? c.d : kDims[r.in(0, 14)];
  // The scalar N×M reference bounds the work per case.
  while (c.B * c.H * c.N * c.M * (c.d + c.dv) > 12'000'000)
    c.N = std::max<int64_t>(1, c.N / 2), c.M = std::max<int64_t>(1, c.M / 2);
  c.strided = r.chance(0.5);
  c.qk_range = r.chance(0.1) ? 8.0f : 1.0f;
  c.text = "B " + std::to_string(c.B) + " N " + std::to_string(c.N) + " M " + std::to_string(c.M) + " H " +
           std::to_string(c.H) + "/" + std::to_string(c.Hkv) + " d " + std::to_string(c.d) + " dv " +
           std::to_string(c.dv) + (c.strided ? " strided" : "") + (c.qk_range > 1 ? " large-logits" : "");
  AttentionOptions& o = c.options;
  const Dims s{c.B, c.N, c.M, c.H, c.d, c.dv};
  if (r.chance(0.3))
    o.mask = o.mask & Mask::causal(), c.text += " causal";
  else if (r.chance(0.15))
    o.mask = o.mask & Mask::causal(CausalAlign::kTopLeft), c.text += " causal-top-left";
  if (r.chance(0.25)) {
    std::vector<int64_t> lengths(static_cast<size_t>(c.B));
    for (int64_t& l : lengths) l = r.chance(0.2) ? 0 : r.in(1, c.M);
    o.mask = o.mask & Mask::key_padding(lengths), c.text += " padding";
  }
  if (r.chance(0.2)) {
    const int64_t left = r.chance(0.3) ? Mask::kUnbounded : r.in(0, c.M);
    const int64_t right = r.chance(0.5) ? Mask::kUnbounded : r.in(0, c.M);
    o.mask = o.mask & Mask::sliding_window(left, right), c.text += " window";
  }
  if (r.chance(0.15)) {
    o.mask = o.mask & Mask::block_sparse(test::random_layout(s, r.in(1, 70), r.in(1, 70), r.seed(), 0.6f));
    c.text += " blocks";
  }
  if (r.chance(0.15)) {
    const Shape shape{r.chance(0.5) ? c.B : 1, r.chance(0.5) ? c.H : 1, c.N, c.M};
    o.mask = o.mask & Mask::allow(test::random_bool(shape, r.seed(), 0.8f)), c.text += " allow";
  }
  if (r.chance(0.15)) {
    const Shape shape{r.chance(0.5) ? c.B : 1, r.chance(0.5) ? c.H : 1, c.N, c.M};
    Tensor bias = test::random_tensor(shape, r.seed(), -2.0f, 2.0f);
    float* p = bias.data<float>();
    for (int64_t i = 0; i < bias.numel(); ++i)
      if (r.chance(0.05)) p[i] = -INFINITY;
    o.mask = o.mask & Mask::additive(bias), c.text += " bias";
  }
  if (r.chance(0.25)) {
    o.dropout = r.chance(0.5) ? 0.1f : 0.5f;
    o.dropout_seed = r.seed();
    o.dropout_offset = static_cast<uint64_t>(r.in(0, 5));
    c.text += " dropout";
  }
  if (r.chance(0.2)) o.scale = static_cast<float>(r.in(1, 500)) / 1000.0f, c.text += " scale";
  if (r.chance(0.15)) o.softcap = static_cast<float>(r.in(1, 30)), c.text += " softcap";
  if (r.chance(0.15)) {
    o.alibi_slopes = alibi_paper_slopes(c.H), c.text += " alibi";
    if (r.chance(0.3)) {
      const int64_t base = r.in(0, 50);
      for (int64_t i = 0; i < c.N; ++i) o.q_positions.push_back(base + i);
      for (int64_t j = 0; j < c.M; ++j) o.k_positions.push_back(j);
      c.text += " positions";
    }
  }
  if (r.chance(0.15)) o.sinks = test::random_tensor({c.H}, r.seed(), -2.0f, 2.0f), c.text += " sinks";
  return c;
}

// The entry points (or the reference, on F32 copies of the operands) into NaN-filled strided
// outputs, as nn/ allocates them; dsinks when the case has sinks.
Outcome run(const test::Inputs& in, const Case& c, bool reference) {
  const AttentionOptions& o = c.options;
  Outcome r;
  r.out = Tensor::full({c.B, c.N, c.H, c.dv + 3}, NAN).narrow(3, 1, c.dv);
  r.lse = Tensor::full({c.B, c.H, c.N}, NAN);
  const Tensor kv = Tensor::full({c.B, c.M, c.Hkv, c.d + c.dv}, NAN);
  r.grads = {Tensor::full({c.B, c.N, c.H, c.d + 1}, NAN).narrow(3, 0, c.d), kv.narrow(3, 0, c.d),
             kv.narrow(3, c.d, c.dv)};
  if (o.sinks.defined()) r.grads.dsinks = Tensor::full({c.H}, NAN);
  if (reference) {
    const Tensor q = widened_to_f32(in.q), k = widened_to_f32(in.k), v = widened_to_f32(in.v);
    attention_reference_forward(q, k, v, o, r.out, nullptr, &r.lse);
    attention_reference_backward({q, k, v, r.out, Tensor()}, in.g, o, r.grads);
  } else {
    attention_forward(in.q, in.k, in.v, o, r.out, &r.lse);
    attention_backward({in.q, in.k, in.v, r.out, r.lse}, in.g, o, r.grads);
  }
  return r;
}

bool same_bits(const Outcome& a, const Outcome& b) {
  const auto same = [](const Tensor& x, const Tensor& y) {
    if (!x.defined()) return !y.defined();
    const std::vector<float> u = x.to_vector(), w = y.to_vector();
    return std::equal(u.begin(), u.end(), w.begin(), w.end(),
                      [](float p, float q) { return std::memcmp(&p, &q, sizeof p) == 0; });
  };
  return same(a.out, b.out) && same(a.lse, b.lse) && same(a.grads.dq, b.grads.dq) && same(a.grads.dk, b.grads.dk) &&
         same(a.grads.dv, b.grads.dv) && same(a.grads.dsinks, b.grads.dsinks);
}

// Runs the entry points on 2 threads and on 1 (the same bits) and checks them against ref within
// rel of test_attention_flash_variants' magnitudes (util/attention_cases.h); dsinks sums B·N
// terms −p_σ·D, each D a dv-long dot (as that test's EntryPointRunsTheFlashKernelWithSinks).
void check_path(const test::Inputs& in, const Case& c, const Outcome& ref, double rel) {
  Outcome one, two;
  {
    const test::ScopedThreads threads(1);
    one = run(in, c, false);
  }
  {
    const test::ScopedThreads threads(2);
    two = run(in, c, false);
  }
  EXPECT_TRUE(same_bits(one, two)) << "1 and 2 threads differ";
  test::expect_variant_close(two, ref, rel, test::variant_magnitudes(in, c.options));
  if (ref.grads.dsinks.defined()) {
    const double terms = static_cast<double>(c.B * c.N * c.dv) * max_abs(in.g) * max_abs(ref.out);
    test::expect_within(two.grads.dsinks, ref.grads.dsinks, rel * terms, "dsinks");
  }
}

TEST(AttentionRandom, EveryPathMatchesTheReference) {
  const int cases = env_int("CABM_RANDOM_CASES", 60);
  const int seed = env_int("CABM_RANDOM_SEED", 1);
  ASSERT_GE(cases, 1) << "CABM_RANDOM_CASES must be a positive number of cases";
  std::printf("%d random cases from seed %d (CABM_RANDOM_CASES, CABM_RANDOM_SEED)\n", cases, seed);
  std::vector<test::flash_bf16::PathSetting> bf16_paths{{Bf16Isa::kPortable}, {Bf16Isa::kAuto}};
  if (cpu_has_avx512_bf16()) {
    bf16_paths.push_back({Bf16Isa::kAvx512Bf16});
    bf16_paths.push_back({Bf16Isa::kAvx512Bf16, true});
    bf16_paths.push_back({Bf16Isa::kAvx512Bf16, false, Bf16Products::kFp32});
  } else {
    std::printf("skipped: the avx512_bf16, amx_bf16_emulated and widened-products bf16 paths (no AVX-512 BF16)\n");
  }
  for (int i = 0; i < cases; ++i) {
    Draw draw(static_cast<uint64_t>(seed) * 1'000'003u + static_cast<uint64_t>(i));
    const Case c = draw_case(draw);
    SCOPED_TRACE("case " + std::to_string(i) + ": " + c.text);
    const uint64_t data = draw.seed();
    const Shape qs = test::head_buffer_shape(c.B, c.N, c.H, c.d, c.strided);
    const Shape ks = test::head_buffer_shape(c.B, c.M, c.Hkv, c.d, c.strided);
    const Shape vs = test::head_buffer_shape(c.B, c.M, c.Hkv, c.dv, c.strided);
    const Tensor qb = test::random_tensor(qs, data, -c.qk_range, c.qk_range);
    const Tensor kb = test::random_tensor(ks, data + 1, -c.qk_range, c.qk_range);
    const Tensor vb = test::random_tensor(vs, data + 2);
    const Tensor g = test::head_view(
        test::random_tensor(test::head_buffer_shape(c.B, c.N, c.H, c.dv, c.strided), data + 3), c.dv, c.strided);
    const test::Inputs in{test::head_view(qb, c.d, c.strided), test::head_view(kb, c.d, c.strided),
                          test::head_view(vb, c.dv, c.strided), g};

    const test::ScopedThreads threads(2);
    const Outcome ref = run(in, c, true);
    const double rel = test::variants_relative_bound(in, c.options);
    for (SimdIsa isa : test::flash_isas()) {
      const test::ScopedSimdIsa pin(isa);
      SCOPED_TRACE(std::string("fp32 on ") + simd_isa_name(isa));
      check_path(in, c, ref, rel);
    }

    // bf16 operands; the reference and the bounds on their fp32 values.
    const test::Inputs in16{test::head_view(rounded_to_bf16(qb), c.d, c.strided),
                            test::head_view(rounded_to_bf16(kb), c.d, c.strided),
                            test::head_view(rounded_to_bf16(vb), c.dv, c.strided), g};
    const test::Inputs wide{widened_to_f32(in16.q), widened_to_f32(in16.k), widened_to_f32(in16.v), g};
    const Outcome ref16 = run(in16, c, true);
    const double rel16 = test::variants_relative_bound(wide, c.options) + 8.0 * 0x1p-9;
    for (const test::flash_bf16::PathSetting& setting : bf16_paths) {
      const test::flash_bf16::ScopedPath path(setting);
      SCOPED_TRACE(std::string("bf16 on ") + attention_flash_bf16_path() + " / " +
                   attention_flash_bf16_backward_path());
      check_path(in16, c, ref16, rel16);
    }
    if (::testing::Test::HasFailure()) break;  // the first failing case says enough
  }
}

}  // namespace
}  // namespace cabm
