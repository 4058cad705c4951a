// The split-key decoding kernel (attention/decode.h) against the reference: GQA and MQA shapes,
// 1 to kDecodeMaxQueryRows query rows, caches spanning many chunks (forced small chunks and the
// default), every mask it takes (causal both ways, windows, key padding with empty items), soft-
// capping, ALiBi with positions, sinks through the entry point, F32 and BF16 caches; results
// bit-identical across thread counts and chunkings that keep the same chunk size.
#include "cabm/kernels/attention/attention.h"
#include "cabm/kernels/attention/decode.h"
#include "cabm/kernels/attention/decode_item.h"
#include "cabm/kernels/simd.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/cpu_isa.h"
#include "util/simd_isas.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace cabm {
namespace {

using test::runnable_isas;
using test::ScopedSimdIsa;

struct Case {
  int64_t B, N, M, H, Hkv, d, dv;
};

double max_abs(const Tensor& t) {
  double m = 0;
  for (float x : t.to_vector())
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

void expect_close(const Tensor& got, const Tensor& want, double rel, const std::string& what) {
  const std::vector<float> g = got.to_vector(), w = want.to_vector();
  const double bound = rel * std::max(1.0, max_abs(want));
  int bad = 0;
  for (size_t n = 0; n < w.size(); ++n) {
    const bool ok = std::isfinite(w[n]) ? std::fabs(g[n] - w[n]) <= bound : g[n] == w[n];
    if (!ok && bad++ < 3) ADD_FAILURE() << what << "[" << n << "] = " << g[n] << ", expected " << w[n];
  }
  EXPECT_EQ(bad, 0) << what;
}

struct OptionCase {
  std::string name;
  std::function<AttentionOptions(const Case&)> make;
};

std::vector<OptionCase> option_cases() {
  return {
      {"none", [](const Case&) { return AttentionOptions{}; }},
      {"causal", [](const Case&) { AttentionOptions o; o.mask = Mask::causal(); return o; }},
      {"causal_top_left", [](const Case&) { AttentionOptions o; o.mask = Mask::causal(CausalAlign::kTopLeft); return o; }},
      {"window", [](const Case&) { AttentionOptions o; o.mask = Mask::causal() & Mask::sliding_window(700, 0); return o; }},
      {"padding",  // the last batch item has no keys at all
       [](const Case& c) {
         AttentionOptions o;
         std::vector<int64_t> lengths(static_cast<size_t>(c.B), c.M - 3);
         lengths.back() = 0;
         o.mask = Mask::key_padding(lengths);
         return o;
       }},
      {"softcap_alibi",
       [](const Case& c) {
         AttentionOptions o;
         o.mask = Mask::causal();
         o.softcap = 3.0f;
         o.alibi_slopes = alibi_paper_slopes(c.H);
         return o;
       }},
      {"alibi_positions_scale",
       [](const Case& c) {
         AttentionOptions o;
         o.alibi_slopes = alibi_paper_slopes(c.H);
         for (int64_t i = 0; i < c.N; ++i) o.q_positions.push_back(5000 + 7 * i);
         for (int64_t j = 0; j < c.M; ++j) o.k_positions.push_back(4000 + j);
         o.scale = 0.3f;
         return o;
       }},
      {"sinks",
       [](const Case& c) {
         AttentionOptions o;
         o.mask = Mask::causal();
         o.sinks = test::random_tensor({c.H}, 4, -1.0f, 3.0f);
         return o;
       }},
  };
}

const std::vector<Case> kCases = {
    {1, 1, 1, 4, 1, 8, 8},        {2, 1, 1500, 8, 2, 64, 64},  {1, 3, 2100, 4, 4, 32, 16},
    {2, 8, 600, 6, 3, 40, 24},    {1, 1, 4097, 32, 8, 128, 128}, {1, 2, 37, 2, 1, 5, 7},
};

class Decode : public ::testing::TestWithParam<size_t> {};

void check_case(const OptionCase& oc, const Case& c);

TEST_P(Decode, MatchesReference) {
  const OptionCase oc = option_cases()[GetParam()];
  for (SimdIsa isa : runnable_isas("decode")) {
    const ScopedSimdIsa pin(isa);
    SCOPED_TRACE(std::string("isa ") + attention_decode_isa());
    ASSERT_STREQ(attention_decode_isa(), simd_isa_name(isa));
    for (const Case& c : kCases) check_case(oc, c);
  }
}

void check_case(const OptionCase& oc, const Case& c) {
  SCOPED_TRACE(oc.name + " B " + std::to_string(c.B) + " N " + std::to_string(c.N) + " M " + std::to_string(c.M) +
               " H " + std::to_string(c.H) + "/" + std::to_string(c.Hkv) + " d " + std::to_string(c.d));
  const AttentionOptions o = oc.make(c);
  const Tensor q = test::random_tensor({c.B, c.N, c.H, c.d}, 1, -1.5f, 1.5f);
  const Tensor k = test::random_tensor({c.B, c.M, c.Hkv, c.d}, 2, -1.5f, 1.5f);
  const Tensor v = test::random_tensor({c.B, c.M, c.Hkv, c.dv}, 3);
  Tensor want = Tensor::empty({c.B, c.N, c.H, c.dv}), want_lse = Tensor::empty({c.B, c.H, c.N});
  attention_reference_forward(q, k, v, o, want, nullptr, &want_lse);
  ASSERT_EQ(attention_forward_kernel(q, k, o), AttentionKernel::kDecode);
  Tensor out = Tensor::full({c.B, c.N, c.H, c.dv}, NAN), lse = Tensor::full({c.B, c.H, c.N}, NAN);
  attention_forward(q, k, v, o, out, &lse);  // the entry point: decode, sinks folded
  expect_close(out, want, 2e-5, "out");
  expect_close(lse, want_lse, 2e-5, "lse");

  // Same chunk size: identical bits for 1 and 2 threads; small chunks: the same numbers.
  if (!o.sinks.defined()) {
    Tensor a = Tensor::empty(want.shape()), b = Tensor::empty(want.shape()), small = Tensor::empty(want.shape());
    {
      test::ScopedThreads one(1);
      attention_decode_forward(q, k, v, o, a, nullptr, 256);
    }
    {
      test::ScopedThreads two(2);
      attention_decode_forward(q, k, v, o, b, nullptr, 256);
      attention_decode_forward(q, k, v, o, small, nullptr, 7);
    }
    EXPECT_EQ(a.to_vector(), b.to_vector());
    expect_close(small, want, 2e-5, "out (chunks of 7)");
  }

  // A BF16 cache (and query): the reference on the widened bf16 values; P is not rounded.
  const Tensor q16 = rounded_to_bf16(q), k16 = rounded_to_bf16(k), v16 = rounded_to_bf16(v);
  attention_reference_forward(widened_to_f32(q16), widened_to_f32(k16), widened_to_f32(v16), o, want, nullptr,
                              &want_lse);
  attention_forward(q16, k16, v16, o, out, &lse);
  expect_close(out, want, 2e-5, "out (bf16)");
  expect_close(lse, want_lse, 2e-5, "lse (bf16)");
}

INSTANTIATE_TEST_SUITE_P(All, Decode, ::testing::Range<size_t>(0, option_cases().size()),
                         [](const auto& info) { return option_cases()[info.param].name; });

// The prefetch of the next block's rows (taken for big caches only) changes no bit, on every set,
// for F32 and BF16 caches, strided views, masks that end a batch item's keys early, and caches
// whose last block is short.
TEST(Decode, PrefetchChangesNoBits) {
  struct Restore {
    ~Restore() { set_decode_prefetch(-1); }
  } restore;
  const Case c{2, 2, 1000, 8, 2, 64, 48};
  for (SimdIsa isa : runnable_isas("decode")) {
    const ScopedSimdIsa pin(isa);
    for (const OptionCase& oc : option_cases()) {
      if (oc.name != "causal" && oc.name != "padding" && oc.name != "window") continue;
      for (const bool bf16_cache : {false, true}) {
        SCOPED_TRACE(std::string(attention_decode_isa()) + " " + oc.name + (bf16_cache ? " bf16" : " f32"));
        const AttentionOptions o = oc.make(c);
        // K and V as views into wider rows, so that the rows prefetched are strided.
        Tensor kw = test::random_tensor({c.B, c.M, c.Hkv, c.d + 8}, 12, -1.5f, 1.5f);
        Tensor vw = test::random_tensor({c.B, c.M, c.Hkv, c.dv + 8}, 13);
        Tensor q = test::random_tensor({c.B, c.N, c.H, c.d}, 11, -1.5f, 1.5f);
        if (bf16_cache) q = rounded_to_bf16(q), kw = rounded_to_bf16(kw), vw = rounded_to_bf16(vw);
        const Tensor k = kw.narrow(3, 0, c.d), v = vw.narrow(3, 0, c.dv);
        const auto wide = [&](const Tensor& t) { return bf16_cache ? widened_to_f32(t) : t; };
        Tensor want = Tensor::empty({c.B, c.N, c.H, c.dv});
        attention_reference_forward(wide(q), wide(k), wide(v), o, want, nullptr, nullptr);
        std::vector<float> runs[2];
        for (int mode : {0, 1}) {
          set_decode_prefetch(mode);
          Tensor out = Tensor::empty(want.shape());
          attention_decode_forward(q, k, v, o, out, nullptr, 96);  // chunks of 1.5 blocks
          runs[mode] = out.to_vector();
          if (mode == 1) expect_close(out, want, 2e-5, "out with the prefetch");
        }
        EXPECT_EQ(runs[0], runs[1]);
      }
    }
  }
}

// The decode kernel's two vector primitives: lane l of sum_each is the sum of input l (any lane
// order inside is fine, the mapping is not), and load_bf16 widens exactly.
TEST(DecodeSimd, SumEachAndLoadBf16) {
  std::printf("simd: %s, %d lanes\n", simd::kIsa, simd::kWidth);
  const Tensor x = test::random_tensor({simd::kWidth, simd::kWidth}, 11, -2.0f, 2.0f);
  simd::Vec a[simd::kWidth];
  for (int l = 0; l < simd::kWidth; ++l) a[l] = simd::load(x.data<float>() + l * simd::kWidth);
  float got[simd::kWidth];
  simd::store(got, simd::sum_each(a));
  for (int l = 0; l < simd::kWidth; ++l) {
    double want = 0.0;
    for (int m = 0; m < simd::kWidth; ++m) want += x.data<float>()[l * simd::kWidth + m];
    EXPECT_NEAR(got[l], want, 1e-5) << "lane " << l;
  }
  const Tensor h = rounded_to_bf16(x);
  float wide[simd::kWidth];
  simd::store(wide, simd::load_bf16(reinterpret_cast<const uint16_t*>(h.data<bf16>())));
  for (int l = 0; l < simd::kWidth; ++l) EXPECT_EQ(wide[l], bf16_to_float(h.data<bf16>()[l])) << "lane " << l;
}

// A KV cache is a view: [B, M, Hkv, d] rows of a [B, capacity, Hkv·d] buffer.
TEST(Decode, StridedCacheViews) {
  const int64_t B = 2, N = 1, H = 8, Hkv = 2, d = 64, M = 777, cap = 1000;
  const Tensor q = test::random_tensor({B, N, H, d}, 1, -1.5f, 1.5f);
  const Tensor kbuf = test::random_tensor({B, cap, Hkv * d}, 2, -1.5f, 1.5f);
  const Tensor vbuf = test::random_tensor({B, cap, Hkv * d}, 3);
  for (const auto& [isa, half] : {std::pair{SimdIsa::kPortable, false}, {SimdIsa::kPortable, true},
                                   {SimdIsa::kAvx2, false}, {SimdIsa::kAvx2, true},
                                   {SimdIsa::kAvx512, false}, {SimdIsa::kAvx512, true}}) {
    if (!cpu_supports(isa)) continue;  // printed by Decode.MatchesReference
    const ScopedSimdIsa pin(isa);
    SCOPED_TRACE(std::string(half ? "bf16 " : "fp32 ") + simd_isa_name(isa));
    const Tensor kb = half ? rounded_to_bf16(kbuf) : kbuf, vb = half ? rounded_to_bf16(vbuf) : vbuf,
                 qq = half ? rounded_to_bf16(q) : q;
    const Tensor k = kb.as_strided({B, M, Hkv, d}, {cap * Hkv * d, Hkv * d, d, 1});
    const Tensor v = vb.as_strided({B, M, Hkv, d}, {cap * Hkv * d, Hkv * d, d, 1});
    Tensor kc = Tensor::empty({B, M, Hkv, d}), vc = Tensor::empty({B, M, Hkv, d});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < M * Hkv * d; ++j) {
        const int64_t at = b * cap * Hkv * d + j;
        kc.data<float>()[b * M * Hkv * d + j] = half ? bf16_to_float(kb.data<bf16>()[at]) : kb.data<float>()[at];
        vc.data<float>()[b * M * Hkv * d + j] = half ? bf16_to_float(vb.data<bf16>()[at]) : vb.data<float>()[at];
      }
    AttentionOptions o;
    o.mask = Mask::causal();
    Tensor want = Tensor::empty({B, N, H, d}), out = Tensor::full({B, N, H, d}, NAN);
    attention_reference_forward(half ? widened_to_f32(qq) : qq, kc, vc, o, want);
    attention_decode_forward(qq, k, v, o, out);
    expect_close(out, want, 2e-5, "out");
  }
}

TEST(DecodeDispatch, OnlyFewRowsWithoutDropoutOrTensorMasks) {
  const Tensor q1 = Tensor::zeros({1, 1, 4, 8}), q9 = Tensor::zeros({1, kDecodeMaxQueryRows + 1, 4, 8});
  const Tensor k = Tensor::zeros({1, 16, 2, 8});
  AttentionOptions o;
  EXPECT_EQ(attention_forward_kernel(q1, k, o), AttentionKernel::kDecode);
  EXPECT_NE(attention_forward_kernel(q9, k, o), AttentionKernel::kDecode);
  o.dropout = 0.1f;
  EXPECT_NE(attention_forward_kernel(q1, k, o), AttentionKernel::kDecode);
  o = {};
  o.mask = Mask::additive(Tensor::zeros({1, 16}));
  EXPECT_NE(attention_forward_kernel(q1, k, o), AttentionKernel::kDecode);
  Tensor blocks = Tensor::empty({1, 1, 4}, DType::BOOL);
  std::fill_n(blocks.data<uint8_t>(), 4, uint8_t{1});
  o.mask = Mask::block_sparse({1, 4, blocks});
  EXPECT_NE(attention_forward_kernel(q1, k, o), AttentionKernel::kDecode);
}

}  // namespace
}  // namespace cabm
