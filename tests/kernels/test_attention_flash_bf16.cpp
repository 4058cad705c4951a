// The bf16 flash forward against the fp32 reference attention run on the same bf16-rounded inputs:
// odd sizes and tails, every mask kind, dropout, tile sizes, thread counts 1 and 2, both paths.
//
// Tolerance. The inputs are exact in fp32 and bf16·bf16 products are exact in fp32, so the scores
// carry only fp32 summation error, as in the fp32 kernel (Higham 2002, §3.1: γ_d·smax, smax bounding
// |scale·q·k| + |bias|). The one bf16 rounding is P's before P·V: each weight is off by at most
// u_bf16 = 2^-9 (half of bf16's epsilon 2^-8) relative, so an output row is off by at most
// u_bf16 · Σ_j a_j |v_j| ≤ u_bf16 · keep · max|v| (keep = 1/(1 − dropout) bounds Σ_j a_j).
// Added to that: the fp32 terms of the fp32 kernel's bound (scores, exp, sums over d, dv, M).
#include "core/threads.h"
#include "kernels/attention_flash_bf16.h"
#include "kernels/attention_reference.h"
#include "kernels/bf16.h"
#include "util/test_util.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace cabm {
namespace {

constexpr double kU = 0x1p-24;
constexpr double kUBf16 = 0x1p-9;
double gamma_n(int64_t n) { return static_cast<double>(n) * kU / (1.0 - static_cast<double>(n) * kU); }

struct Dims {
  int64_t B, N, M, H, d, dv;
};

double max_abs(const Tensor& t) {
  double m = 0;
  for (float x : t.to_vector())
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// A bf16 head view [B, L, H, d] (strided: heads of a [B, L, 2, H, d + 1] buffer) and the same view
// of the fp32 values it holds.
struct Heads {
  Tensor bf, f32;
};
Heads make_heads(int64_t B, int64_t L, int64_t H, int64_t d, uint64_t seed, bool strided) {
  const Shape shape = strided ? Shape{B, L, 2, H, d + 1} : Shape{B, L, H, d};
  Tensor x = test::random_tensor(shape, seed, -1.0f, 1.0f);
  Tensor xb = Tensor::empty(shape, DType::BF16);
  float_to_bf16(x.data<float>(), xb.data<bf16>(), x.numel());
  bf16_to_float(xb.data<bf16>(), x.data<float>(), x.numel());
  if (!strided) return {xb, x};
  auto view = [&](const Tensor& t) { return t.select(2, 1).narrow(3, 0, d); };
  return {view(xb), view(x)};
}

Tensor random_bool(const Shape& shape, uint64_t seed, float p_true) {
  Tensor u = test::random_tensor(shape, seed, 0.0f, 1.0f);
  Tensor t = Tensor::empty(shape, DType::BOOL);
  for (int64_t n = 0; n < t.numel(); ++n) t.data<uint8_t>()[n] = u.data<float>()[n] < p_true;
  return t;
}

struct MaskCase {
  std::string name;
  std::function<Mask(const Dims&)> make;
};

std::vector<MaskCase> mask_cases() {
  return {
      {"none", [](const Dims&) { return Mask(); }},
      {"causal", [](const Dims&) { return Mask::causal(); }},
      {"causal_top_left", [](const Dims&) { return Mask::causal(CausalAlign::kTopLeft); }},
      {"key_padding",
       [](const Dims& s) {
         std::vector<int64_t> lengths;
         for (int64_t b = 0; b < s.B; ++b) lengths.push_back(b == 0 ? s.M : 0);  // item 1: no keys at all
         return Mask::key_padding(lengths);
       }},
      {"sliding_window", [](const Dims&) { return Mask::sliding_window(20, 5); }},
      {"block_sparse_odd",
       [](const Dims& s) {
         return Mask::block_sparse({5, 7, random_bool({s.H, (s.N + 4) / 5, (s.M + 6) / 7}, 22, 0.4f)});
       }},
      {"allow_nm",
       [](const Dims& s) {
         Tensor allowed = random_bool({s.N, s.M}, 23, 0.7f);
         for (int64_t j = 0; j < s.M; ++j) allowed.data<uint8_t>()[3 * s.M + j] = 0;  // row 3 fully blocked
         return Mask::allow(allowed);
       }},
      {"additive_hnm",
       [](const Dims& s) {
         Tensor bias = test::random_tensor({s.H, s.N, s.M}, 24, -3.0f, 3.0f);
         for (int64_t n = 0; n < bias.numel(); n += 7) bias.data<float>()[n] = -INFINITY;
         return Mask::additive(bias);
       }},
      {"causal_and_padding", [](const Dims& s) { return Mask::causal() & Mask::key_padding({s.M, s.M / 2 + 1}); }},
  };
}

// Runs the bf16 kernel and the fp32 reference; checks out and lse against the bounds above.
void check_case(const Dims& s, const AttentionOptions& options, const FlashConfig& config, bool strided,
                const std::string& what) {
  const Heads q = make_heads(s.B, s.N, s.H, s.d, 1, strided), k = make_heads(s.B, s.M, s.H, s.d, 2, strided);
  const Heads v = make_heads(s.B, s.M, s.H, s.dv, 3, strided);
  Tensor out = Tensor::full({s.B, s.N, s.H, s.dv}, NAN), ref = Tensor::zeros({s.B, s.N, s.H, s.dv});
  Tensor lse = Tensor::full({s.B, s.H, s.N}, NAN), ref_lse = Tensor::zeros({s.B, s.H, s.N});
  attention_flash_bf16_forward(q.bf, k.bf, v.bf, options, out, &lse, config);
  attention_reference_forward(q.f32, k.f32, v.f32, options, ref, nullptr, &ref_lse);

  double bias = 0;
  for (const Tensor& t : options.mask.biases()) bias += max_abs(t);
  const double smax = attention_scale(options, s.d) * static_cast<double>(s.d) * max_abs(q.f32) * max_abs(k.f32) + bias;
  const double keep = 1.0 / (1.0 - options.dropout);
  const double fp32_rel = 2.0 * (2.0 * gamma_n(s.d) * smax + 2.0 * gamma_n(s.dv) + gamma_n(std::max(s.N, s.M)) + 8.0 * kU);
  const double out_tol = (kUBf16 * keep + fp32_rel * keep) * max_abs(v.f32);
  SCOPED_TRACE(what);
  EXPECT_CLOSE(out, ref, 0.0, out_tol);
  // lse is computed from the unrounded fp32 weights: fp32 bounds only, absolute in the scores' units.
  EXPECT_CLOSE(lse, ref_lse, 4.0 * kU, fp32_rel * (1.0 + smax));
}

std::string describe(const Dims& s) {
  return "B=" + std::to_string(s.B) + " N=" + std::to_string(s.N) + " M=" + std::to_string(s.M) +
         " H=" + std::to_string(s.H) + " d=" + std::to_string(s.d) + " dv=" + std::to_string(s.dv);
}

// Every test runs on the active path and, where the fast path exists, on the forced portable one.
std::vector<Bf16Isa> paths() {
  std::vector<Bf16Isa> out{Bf16Isa::kPortable};
  if (cpu_has_avx512_bf16()) out.push_back(Bf16Isa::kAvx512Bf16);
  return out;
}
struct ScopedIsa {
  explicit ScopedIsa(Bf16Isa isa) { set_bf16_isa_override(isa); }
  ~ScopedIsa() { set_bf16_isa_override(Bf16Isa::kAuto); }
};

TEST(AttentionFlashBf16, OddSizesTilesAndThreads) {
  const std::vector<Dims> sizes = {{1, 1, 1, 1, 8, 8}, {2, 37, 53, 3, 17, 19}, {1, 70, 45, 2, 64, 64},
                                   {2, 16, 100, 2, 32, 48}};
  const std::vector<FlashConfig> configs = {{}, {7, 16}, {13, 20}};
  for (Bf16Isa isa : paths()) {
    ScopedIsa scoped_isa(isa);
    for (int threads : {1, 2}) {
      test::ScopedThreads scoped(threads);
      for (const Dims& s : sizes)
        for (const FlashConfig& c : configs)
          for (bool strided : {false, true})
            check_case(s, {}, c, strided,
                       std::string(bf16_path_name()) + " threads " + std::to_string(threads) + " " + describe(s) +
                           " tiles " + std::to_string(c.block_q) + "x" + std::to_string(c.block_k) +
                           (strided ? " strided" : ""));
    }
  }
}

TEST(AttentionFlashBf16, EveryMaskKind) {
  const Dims s{2, 41, 67, 2, 24, 24};
  for (Bf16Isa isa : paths()) {
    ScopedIsa scoped_isa(isa);
    for (const MaskCase& mc : mask_cases()) {
      for (const FlashConfig& c : {FlashConfig{}, FlashConfig{9, 16}}) {
        AttentionOptions options;
        options.mask = mc.make(s);
        check_case(s, options, c, true, std::string(bf16_path_name()) + " mask " + mc.name);
      }
    }
  }
}

TEST(AttentionFlashBf16, FullyMaskedRowsGiveZeroAndMinusInfLse) {
  const Dims s{2, 9, 11, 1, 8, 8};
  AttentionOptions options;
  options.mask = Mask::key_padding({11, 0});
  const Heads q = make_heads(s.B, s.N, s.H, s.d, 5, false), k = make_heads(s.B, s.M, s.H, s.d, 6, false);
  const Heads v = make_heads(s.B, s.M, s.H, s.dv, 7, false);
  Tensor out = Tensor::full({s.B, s.N, s.H, s.dv}, NAN), lse = Tensor::full({s.B, s.H, s.N}, NAN);
  attention_flash_bf16_forward(q.bf, k.bf, v.bf, options, out, &lse);
  for (int64_t i = 0; i < s.N; ++i) {
    EXPECT_EQ(lse.at({1, 0, i}), -INFINITY);
    for (int64_t c = 0; c < s.dv; ++c) EXPECT_EQ(out.at({1, i, 0, c}), 0.0f);
  }
}

TEST(AttentionFlashBf16, DropoutMatchesReferenceDecisions) {
  const Dims s{1, 33, 40, 2, 16, 16};
  for (Bf16Isa isa : paths()) {
    ScopedIsa scoped_isa(isa);
    AttentionOptions options;
    options.dropout = 0.3f;
    options.dropout_seed = 99;
    options.dropout_offset = 4;
    check_case(s, options, {}, false, std::string(bf16_path_name()) + " dropout");
    options.mask = Mask::causal();
    check_case(s, options, {8, 16}, true, std::string(bf16_path_name()) + " dropout causal");
  }
}

TEST(AttentionFlashBf16, ThreadCountDoesNotChangeResult) {
  // Work is split by query tile, each tile computed by one thread in a fixed order: bitwise equal.
  const Dims s{1, 100, 90, 3, 32, 32};
  const Heads q = make_heads(s.B, s.N, s.H, s.d, 8, true), k = make_heads(s.B, s.M, s.H, s.d, 9, true);
  const Heads v = make_heads(s.B, s.M, s.H, s.dv, 10, true);
  AttentionOptions options;
  options.mask = Mask::causal();
  Tensor one = Tensor::zeros({s.B, s.N, s.H, s.dv}), two = Tensor::zeros({s.B, s.N, s.H, s.dv});
  {
    test::ScopedThreads scoped(1);
    attention_flash_bf16_forward(q.bf, k.bf, v.bf, options, one);
  }
  {
    test::ScopedThreads scoped(2);
    attention_flash_bf16_forward(q.bf, k.bf, v.bf, options, two);
  }
  EXPECT_CLOSE(two, one, 0.0, 0.0);
}

TEST(AttentionFlashBf16, RejectsF32Inputs) {
  Tensor q = Tensor::zeros({1, 4, 1, 8}), out = Tensor::zeros({1, 4, 1, 8});
  EXPECT_THROW(attention_flash_bf16_forward(q, q, q, {}, out), Error);
}

}  // namespace
}  // namespace cabm
