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
// Tolerances. fp32: test_attention_flash_variants.cpp's bound (Higham's γ_n of each sum, the score
// bound smax = |scale|·d·max|q|·max|k| + ALiBi + the additive biases, the tanh roundings of
// soft-capping; doubled, both kernels carry it) on the same magnitudes. bf16: the reference on the
// bf16 values, and on top of the fp32 bound the roundings the bf16 kernels add (P, dO, P∘z and dS
// to bf16: 2^-9 relative each; 8·2^-9 covers the few each result goes through), as that test's
// Bf16SimdPathRunsTheVariants. A kernel that dropped a mask part, a variant or a key tile, or read
// the wrong key/value head, would be off by a large fraction of the magnitudes; the fp32 bound is
// near 1e-5 of them here. Thread counts: the same bits (the kernels' contract).
#include "cabm/core/rng.h"
#include "cabm/core/threads.h"
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
using test::kU;
using test::max_abs;

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoi(value) : fallback;
}

// Draws from the host stream of cabm's Philox generator: the same cases on every machine.
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  int64_t in(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng_.next_u32() % (hi - lo + 1)); }
  bool chance(double p) { return rng_.next_uniform() < p; }
  uint64_t seed() { return rng_.next_u32(); }

 private:
  Rng rng_;
};

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

struct Results {
  Tensor out, lse, dq, dk, dv, dsinks;
};

// The entry points (or the reference, on F32 copies of the operands) with strided outputs.
Results run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Case& c, bool reference) {
  const AttentionOptions& o = c.options;
  Results r;
  r.out = Tensor::full({c.B, c.N, c.H, c.dv + 3}, NAN).narrow(3, 1, c.dv);
  r.lse = Tensor::full({c.B, c.H, c.N}, NAN);
  r.dq = Tensor::full({c.B, c.N, c.H, c.d + 1}, NAN).narrow(3, 0, c.d);
  const Tensor kv = Tensor::full({c.B, c.M, c.Hkv, c.d + c.dv}, NAN);
  r.dk = kv.narrow(3, 0, c.d);
  r.dv = kv.narrow(3, c.d, c.dv);
  AttentionGrads grads{r.dq, r.dk, r.dv};
  if (o.sinks.defined()) r.dsinks = Tensor::full({c.H}, NAN), grads.dsinks = r.dsinks;
  if (reference) {
    const Tensor q32 = widened_to_f32(q), k32 = widened_to_f32(k), v32 = widened_to_f32(v);
    attention_reference_forward(q32, k32, v32, o, r.out, nullptr, &r.lse);
    attention_reference_backward({q32, k32, v32, r.out, Tensor()}, g, o, grads);
  } else {
    attention_forward(q, k, v, o, r.out, &r.lse);
    attention_backward({q, k, v, r.out, r.lse}, g, o, grads);
  }
  return r;
}

bool same_bits(const Results& a, const Results& b) {
  const auto same = [](const Tensor& x, const Tensor& y) {
    if (!x.defined()) return !y.defined();
    const std::vector<float> u = x.to_vector(), w = y.to_vector();
    return std::equal(u.begin(), u.end(), w.begin(), w.end(),
                      [](float p, float q) { return std::memcmp(&p, &q, sizeof p) == 0; });
  };
  return same(a.out, b.out) && same(a.lse, b.lse) && same(a.dq, b.dq) && same(a.dk, b.dk) && same(a.dv, b.dv) &&
         same(a.dsinks, b.dsinks);
}

// test_attention_flash_variants.cpp's bound: smax with ALiBi's largest term, the query rows of a
// key/value head's group in the sums of dK and dV, the tanh roundings of soft-capping; doubled.
double relative_bound(const Case& c, const Tensor& q, const Tensor& k) {
  const AttentionOptions& o = c.options;
  double alibi = 0;
  if (!o.alibi_slopes.empty()) {
    double slope = 0;
    for (float x : o.alibi_slopes) slope = std::max(slope, std::fabs(static_cast<double>(x)));
    const auto qpos = [&](int64_t i) { return o.q_positions.empty() ? c.M - c.N + i : o.q_positions[i]; };
    const auto kpos = [&](int64_t j) { return o.k_positions.empty() ? j : o.k_positions[j]; };
    const double far =
        static_cast<double>(std::max(std::llabs(qpos(c.N - 1) - kpos(0)), std::llabs(kpos(c.M - 1) - qpos(0))));
    alibi = slope * far;
  }
  const double smax = test::smax_bound(attention_scale(o, c.d), q, k, o.mask) + alibi;
  const Dims s{c.B, c.N * (c.H / c.Hkv), c.M, c.H, c.d, c.dv};
  return 2.0 * (test::relative_bound(s, smax) + 16.0 * kU * o.softcap);
}

void expect_close(const Results& got, const Results& ref, const Case& c, const Tensor& q, const Tensor& k,
                  const Tensor& v, const Tensor& g, double rel) {
  // The magnitudes of test_attention_flash_variants.cpp: out averages rows of v; dS is relative to
  // dv·max|dO|·max|v|; dQ sums it with Σ_j P = 1, dK over the group's query rows (column sums of
  // P, at least 1); dsinks sums B·N terms −p_σ·D, each D a dv-long dot.
  const double scale = attention_scale(c.options, c.d), group = static_cast<double>(c.H / c.Hkv);
  const double out = max_abs(v) / (1.0 - c.options.dropout);
  const double ds = static_cast<double>(c.dv) * max_abs(g) * max_abs(v);
  const double columns = std::max(1.0, std::ceil(group * static_cast<double>(c.N) / static_cast<double>(c.M)));
  test::expect_within(got.out, ref.out, rel * out, "out");
  test::expect_within(got.lse, ref.lse, rel * (1.0 + max_abs(ref.lse)), "lse");
  test::expect_within(got.dq, ref.dq, rel * std::max(max_abs(ref.dq), scale * max_abs(k) * ds), "dq");
  test::expect_within(got.dk, ref.dk, rel * std::max(max_abs(ref.dk), scale * max_abs(q) * ds * columns), "dk");
  test::expect_within(got.dv, ref.dv, rel * std::max(max_abs(ref.dv), out), "dv");
  if (ref.dsinks.defined()) {
    const double terms = static_cast<double>(c.B * c.N * c.dv) * max_abs(g) * max_abs(ref.out);
    test::expect_within(got.dsinks, ref.dsinks, rel * terms, "dsinks");
  }
}

// Runs the entry points on 2 threads and on 1 (the same bits) and checks them against ref.
void check_path(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Case& c, const Results& ref,
                double rel) {
  set_num_threads(2);
  const Results two = run(q, k, v, g, c, false);
  set_num_threads(1);
  const Results one = run(q, k, v, g, c, false);
  set_num_threads(2);
  EXPECT_TRUE(same_bits(one, two)) << "1 and 2 threads differ";
  expect_close(two, ref, c, q, k, v, g, rel);
}

TEST(AttentionRandom, EveryPathMatchesTheReference) {
  const int cases = env_int("CABM_RANDOM_CASES", 60);
  const int seed = env_int("CABM_RANDOM_SEED", 1);
  ASSERT_GE(cases, 1) << "CABM_RANDOM_CASES must be a positive number of cases";
  std::printf("%d random cases from seed %d (CABM_RANDOM_CASES, CABM_RANDOM_SEED)\n", cases, seed);
  const int threads = num_threads();
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
    const Tensor q = test::head_view(qb, c.d, c.strided), k = test::head_view(kb, c.d, c.strided),
                 v = test::head_view(vb, c.dv, c.strided);

    set_num_threads(2);
    const Results ref = run(q, k, v, g, c, true);
    const double rel = relative_bound(c, q, k);
    for (SimdIsa isa : test::flash_isas()) {
      const test::ScopedSimdIsa pin(isa);
      SCOPED_TRACE(std::string("fp32 on ") + simd_isa_name(isa));
      check_path(q, k, v, g, c, ref, rel);
    }

    const Tensor q16 = test::head_view(rounded_to_bf16(qb), c.d, c.strided);
    const Tensor k16 = test::head_view(rounded_to_bf16(kb), c.d, c.strided);
    const Tensor v16 = test::head_view(rounded_to_bf16(vb), c.dv, c.strided);
    const Results ref16 = run(q16, k16, v16, g, c, true);
    const double rel16 = relative_bound(c, widened_to_f32(q16), widened_to_f32(k16)) + 8.0 * 0x1p-9;
    for (const test::flash_bf16::PathSetting& setting : bf16_paths) {
      const test::flash_bf16::ScopedPath path(setting);
      SCOPED_TRACE(std::string("bf16 on ") + attention_flash_bf16_path() + " / " +
                   attention_flash_bf16_backward_path());
      check_path(q16, k16, v16, g, c, ref16, rel16);
    }
    if (::testing::Test::HasFailure()) break;  // the first failing case says enough
  }
  set_num_threads(threads);
}

}  // namespace
}  // namespace cabm
