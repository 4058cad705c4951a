// The attention variants of current models (attention/reference.h): grouped-query attention,
// soft-capping, ALiBi with positions, sinks; and rotary positions (rope.h).
//  - tier 3: the reference forward against naive double math written here from the formulas,
//    the reference backward (and the sink gradient) against central finite differences of
//    that double math;
//  - the entry point (attention_forward/backward, which folds sinks around the tiled kernels)
//    against the reference;
//  - rotary: against the rotation written out in double, its backward as the exact transpose.
#include "cabm/kernels/attention/attention.h"
#include "cabm/kernels/attention/reference.h"
#include "cabm/kernels/rope.h"
#include "util/attention_cases.h"
#include "util/test_util.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace cabm {
namespace {

struct Problem {
  int64_t B, N, M, H, Hkv, d, dv;
};

struct Inputs {
  Tensor q, k, v, g;
};

Inputs make_inputs(const Problem& p, uint64_t seed, float range) {
  return {test::random_tensor({p.B, p.N, p.H, p.d}, seed, -range, range),
          test::random_tensor({p.B, p.M, p.Hkv, p.d}, seed + 1, -range, range),
          test::random_tensor({p.B, p.M, p.Hkv, p.dv}, seed + 2, -1.0f, 1.0f),
          test::random_tensor({p.B, p.N, p.H, p.dv}, seed + 3, -1.0f, 1.0f)};
}

double at(const Tensor& t, int64_t a, int64_t b, int64_t c, int64_t e) {
  return t.data<float>()[((a * t.size(1) + b) * t.size(2) + c) * t.size(3) + e];
}

// The formulas of attention/reference.h in double, one row at a time (contiguous inputs).
struct Naive {
  std::vector<double> out, lse;
};
Naive naive(const Inputs& in, const AttentionOptions& o, const std::vector<double>& sinks) {
  const Tensor &q = in.q, &k = in.k, &v = in.v;
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2), d = q.size(3), M = k.size(1), Hkv = k.size(2),
                dv = v.size(3);
  const ResolvedMask mask(o.mask, B, H, N, M);
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(d));
  Naive r{std::vector<double>(static_cast<size_t>(B * N * H * dv), 0.0),
          std::vector<double>(static_cast<size_t>(B * H * N), -INFINITY)};
  std::vector<float> bias(static_cast<size_t>(M));
  std::vector<double> s(static_cast<size_t>(M));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        mask.fill_row(b, h, i, bias.data());
        const int64_t hk = h / (H / Hkv);
        const int64_t qpos = o.q_positions.empty() ? M - N + i : o.q_positions[i];
        double m = -INFINITY;
        for (int64_t j = 0; j < M; ++j) {
          s[j] = -INFINITY;
          if (bias[j] == -INFINITY) continue;
          double t = 0;
          for (int64_t c = 0; c < d; ++c) t += at(q, b, i, h, c) * at(k, b, j, hk, c);
          t *= scale;
          if (o.softcap > 0) t = o.softcap * std::tanh(t / o.softcap);
          if (!o.alibi_slopes.empty()) {
            const int64_t kpos = o.k_positions.empty() ? j : o.k_positions[j];
            t -= o.alibi_slopes[h] * static_cast<double>(std::llabs(qpos - kpos));
          }
          s[j] = t + bias[j];
          m = std::max(m, s[j]);
        }
        if (m == -INFINITY) continue;
        const double sink = sinks.empty() ? -INFINITY : sinks[h];
        const double mm = std::max(m, sink);
        double sum = std::exp(sink - mm);
        for (int64_t j = 0; j < M; ++j) sum += std::exp(s[j] - mm);
        r.lse[(b * H + h) * N + i] = mm + std::log(sum);
        for (int64_t j = 0; j < M; ++j) {
          const double a = std::exp(s[j] - mm) / sum;
          for (int64_t c = 0; c < dv; ++c) r.out[((b * N + i) * H + h) * dv + c] += a * at(v, b, j, hk, c);
        }
      }
  return r;
}

std::vector<double> sink_values(const AttentionOptions& o) {
  if (!o.sinks.defined()) return {};
  const std::vector<float> f = o.sinks.to_vector();
  return {f.begin(), f.end()};
}

double loss(const Inputs& in, const AttentionOptions& o, const std::vector<double>& sinks) {
  const Naive r = naive(in, o, sinks);
  const std::vector<float> g = in.g.to_vector();
  double l = 0;
  for (size_t n = 0; n < g.size(); ++n) l += r.out[n] * g[n];
  return l;
}

// dL/dx by central differences on the stored float values (step 1e-3: the double math has no
// rounding to speak of; the truncation error h²/6·|L'''| stays below 1e-6 for these inputs).
std::vector<double> numeric_grad(Tensor x, const std::function<double()>& f) {
  std::vector<double> grad;
  float* p = x.data<float>();
  for (int64_t n = 0; n < x.numel(); ++n) {
    const float saved = p[n];
    p[n] = saved + 1e-3f;
    const double up = static_cast<double>(p[n]) - saved;
    const double l_up = f();
    p[n] = saved - 1e-3f;
    const double down = saved - static_cast<double>(p[n]);
    const double l_down = f();
    p[n] = saved;
    grad.push_back((l_up - l_down) / (up + down));
  }
  return grad;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x)
    if (std::isfinite(e)) m = std::max(m, std::fabs(e));
  return m;
}

void expect_close(const Tensor& got, const std::vector<double>& want, double rel, const std::string& what) {
  const std::vector<float> g = got.to_vector();
  ASSERT_EQ(g.size(), want.size()) << what;
  const double bound = rel * std::max(1.0, max_abs(want));
  int bad = 0;
  for (size_t n = 0; n < g.size(); ++n) {
    if (!std::isfinite(want[n])) {
      if (static_cast<double>(g[n]) != want[n] && bad++ < 3) ADD_FAILURE() << what << "[" << n << "] = " << g[n];
      continue;
    }
    if (!(std::fabs(g[n] - want[n]) <= bound) && bad++ < 3)
      ADD_FAILURE() << what << "[" << n << "] = " << g[n] << ", expected " << want[n] << " (bound " << bound << ")";
  }
  EXPECT_EQ(bad, 0) << what;
}

struct Variant {
  std::string name;
  std::function<AttentionOptions(const Problem&)> make;
};

std::vector<Variant> variants() {
  const auto slopes = [](const Problem& p) { return alibi_paper_slopes(p.H); };
  const auto sinks = [](const Problem& p) { return test::random_tensor({p.H}, 77, -2.0f, 2.0f); };
  return {
      {"plain", [](const Problem&) { return AttentionOptions{}; }},
      {"softcap", [](const Problem&) { AttentionOptions o; o.softcap = 1.5f; return o; }},
      {"alibi", [=](const Problem& p) { AttentionOptions o; o.alibi_slopes = slopes(p); return o; }},
      {"alibi_causal_positions",
       [=](const Problem& p) {
         AttentionOptions o;
         o.mask = Mask::causal(CausalAlign::kTopLeft);
         o.alibi_slopes = slopes(p);
         for (int64_t i = 0; i < p.N; ++i) o.q_positions.push_back(100 + 3 * i);
         for (int64_t j = 0; j < p.M; ++j) o.k_positions.push_back(98 + 2 * j);
         return o;
       }},
      {"sinks", [=](const Problem& p) { AttentionOptions o; o.sinks = sinks(p); return o; }},
      {"sinks_padding",  // item 1 has no keys: its rows are fully masked whatever the sink
       [=](const Problem& p) {
         AttentionOptions o;
         o.sinks = sinks(p);
         std::vector<int64_t> lengths(static_cast<size_t>(p.B), p.M);
         lengths.back() = 0;
         o.mask = Mask::key_padding(lengths);
         return o;
       }},
      {"everything",
       [=](const Problem& p) {
         AttentionOptions o;
         o.mask = Mask::causal() & Mask::sliding_window(3, 0) & Mask::additive(test::random_tensor({p.N, p.M}, 9, -1, 1));
         o.softcap = 2.0f;
         o.alibi_slopes = {0.3f, 0.1f, 0.7f, 0.05f};
         o.alibi_slopes.resize(static_cast<size_t>(p.H), 0.2f);
         o.sinks = sinks(p);
         o.scale = 0.4f;
         o.dropout = 0.0f;
         return o;
       }},
  };
}

const std::vector<Problem> kProblems = {
    {2, 5, 6, 4, 2, 3, 2},  // GQA, 2 query heads per key/value head
    {2, 4, 7, 4, 1, 4, 3},  // MQA
    {2, 6, 4, 2, 2, 2, 3},  // plain multi-head
};

class Variants : public ::testing::TestWithParam<size_t> {};

TEST_P(Variants, ReferenceForwardMatchesDoubleMath) {
  const Variant variant = variants()[GetParam()];
  for (const Problem& p : kProblems) {
    SCOPED_TRACE(variant.name + " H " + std::to_string(p.H) + " Hkv " + std::to_string(p.Hkv));
    const AttentionOptions o = variant.make(p);
    const Inputs in = make_inputs(p, 40 + p.N, 2.0f);
    const Naive want = naive(in, o, sink_values(o));
    Tensor out = Tensor::full({p.B, p.N, p.H, p.dv}, NAN), lse = Tensor::empty({p.B, p.H, p.N});
    attention_reference_forward(in.q, in.k, in.v, o, out, nullptr, &lse);
    expect_close(out, want.out, 1e-5, "out");
    expect_close(lse, want.lse, 1e-5, "lse");
  }
}

TEST_P(Variants, ReferenceBackwardMatchesFiniteDifferences) {
  const Variant variant = variants()[GetParam()];
  for (const Problem& p : kProblems) {
    SCOPED_TRACE(variant.name + " H " + std::to_string(p.H) + " Hkv " + std::to_string(p.Hkv));
    AttentionOptions o = variant.make(p);
    Inputs in = make_inputs(p, 60 + p.N, 2.0f);
    std::vector<double> sinks = sink_values(o);
    const auto f = [&] { return loss(in, o, sinks); };
    const std::vector<double> dq = numeric_grad(in.q, f), dk = numeric_grad(in.k, f), dv = numeric_grad(in.v, f);
    std::vector<double> dsinks;
    for (size_t h = 0; h < sinks.size(); ++h) {
      const double saved = sinks[h];
      sinks[h] = saved + 1e-4;
      const double up = f();
      sinks[h] = saved - 1e-4;
      const double down = f();
      sinks[h] = saved;
      dsinks.push_back((up - down) / 2e-4);
    }
    Tensor out = Tensor::empty({p.B, p.N, p.H, p.dv}), lse = Tensor::empty({p.B, p.H, p.N});
    attention_reference_forward(in.q, in.k, in.v, o, out, nullptr, &lse);
    for (int threads : {1, 2}) {
      test::ScopedThreads scoped(threads);
      AttentionGrads grads{Tensor::full(in.q.shape(), NAN), Tensor::full(in.k.shape(), NAN),
                           Tensor::full(in.v.shape(), NAN)};
      if (o.sinks.defined()) grads.dsinks = Tensor::full({p.H}, NAN);
      attention_reference_backward({in.q, in.k, in.v, out, Tensor()}, in.g, o, grads);
      expect_close(grads.dq, dq, 2e-4, "dq");
      expect_close(grads.dk, dk, 2e-4, "dk");
      expect_close(grads.dv, dv, 2e-4, "dv");
      if (o.sinks.defined()) expect_close(grads.dsinks, dsinks, 2e-4, "dsinks");
    }
  }
}

// The entry point: whatever kernel it picks (tiled where it takes the variant, with sinks folded
// around it; else the reference), the result is the reference's within float rounding.
TEST_P(Variants, EntryPointMatchesReference) {
  const Variant variant = variants()[GetParam()];
  for (const Problem& p : {Problem{2, 37, 45, 4, 2, 16, 8}, Problem{1, 9, 70, 8, 1, 32, 32},
                           Problem{2, 40, 33, 2, 2, 8, 5}}) {
    SCOPED_TRACE(variant.name + " H " + std::to_string(p.H) + " Hkv " + std::to_string(p.Hkv));
    const AttentionOptions o = variant.make(p);
    const Inputs in = make_inputs(p, 80 + p.N, 1.5f);
    Tensor want = Tensor::empty({p.B, p.N, p.H, p.dv}), want_lse = Tensor::empty({p.B, p.H, p.N});
    attention_reference_forward(in.q, in.k, in.v, o, want, nullptr, &want_lse);
    Tensor out = Tensor::full({p.B, p.N, p.H, p.dv}, NAN), lse = Tensor::full({p.B, p.H, p.N}, NAN);
    attention_forward(in.q, in.k, in.v, o, out, &lse);
    const std::vector<float> w = want.to_vector(), wl = want_lse.to_vector();
    expect_close(out, {w.begin(), w.end()}, 2e-5, "out");
    expect_close(lse, {wl.begin(), wl.end()}, 2e-5, "lse");

    const AttentionGrads ref{Tensor::empty(in.q.shape()), Tensor::empty(in.k.shape()), Tensor::empty(in.v.shape()),
                             o.sinks.defined() ? Tensor::empty({p.H}) : Tensor()};
    attention_reference_backward({in.q, in.k, in.v, want, want_lse}, in.g, o, ref);
    const AttentionGrads grads{Tensor::full(in.q.shape(), NAN), Tensor::full(in.k.shape(), NAN),
                               Tensor::full(in.v.shape(), NAN), o.sinks.defined() ? Tensor::full({p.H}, NAN) : Tensor()};
    attention_backward({in.q, in.k, in.v, out, lse}, in.g, o, grads);
    for (const auto& [name, got, expected] : {std::tuple{"dq", grads.dq, ref.dq}, std::tuple{"dk", grads.dk, ref.dk},
                                              std::tuple{"dv", grads.dv, ref.dv}}) {
      const std::vector<float> e = expected.to_vector();
      expect_close(got, {e.begin(), e.end()}, 5e-5, name);
    }
    if (o.sinks.defined()) {
      const std::vector<float> e = ref.dsinks.to_vector();
      expect_close(grads.dsinks, {e.begin(), e.end()}, 5e-5, "dsinks");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Variants, ::testing::Range<size_t>(0, variants().size()),
                         [](const auto& info) { return variants()[info.param].name; });

TEST(AttentionVariants, FullyMaskedRowsWithSinksAreZero) {
  const Problem p{2, 3, 4, 2, 1, 4, 4};
  AttentionOptions o;
  o.sinks = Tensor::full({2}, 1.0f);
  o.mask = Mask::key_padding({4, 0});
  const Inputs in = make_inputs(p, 5, 1.0f);
  Tensor out = Tensor::empty({p.B, p.N, p.H, p.dv}), lse = Tensor::empty({p.B, p.H, p.N});
  attention_forward(in.q, in.k, in.v, o, out, &lse);
  for (int64_t i = 0; i < p.N; ++i)
    for (int64_t h = 0; h < p.H; ++h) {
      EXPECT_EQ(lse.data<float>()[(1 * p.H + h) * p.N + i], -INFINITY);
      for (int64_t c = 0; c < p.dv; ++c) EXPECT_EQ(at(out, 1, i, h, c), 0.0);
    }
}

TEST(AttentionVariants, PaperAlibiSlopes) {
  // Powers of two: 2^(−8(i+1)/H). 8 heads: 1/2, 1/4, ..., 1/256.
  const std::vector<float> s8 = alibi_paper_slopes(8);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(s8[i], std::exp2(-(i + 1.0f)));
  // 6 heads: the 4-head slopes (1/4, 1/16, 1/64, 1/256), then slopes 0 and 2 of the 8-head
  // sequence (1/2, 1/8).
  const std::vector<float> s6 = alibi_paper_slopes(6);
  const std::vector<float> s4 = alibi_paper_slopes(4);
  ASSERT_EQ(s6.size(), 6u);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(s6[i], s4[i]);
  EXPECT_FLOAT_EQ(s6[0], 0.25f);
  EXPECT_FLOAT_EQ(s6[4], 0.5f);
  EXPECT_FLOAT_EQ(s6[5], 0.125f);
  EXPECT_EQ(alibi_paper_slopes(1), std::vector<float>{1.0f / 256.0f});
}

TEST(AttentionVariants, RejectsBadOptions) {
  const Problem p{1, 3, 4, 4, 2, 4, 4};
  const Inputs in = make_inputs(p, 5, 1.0f);
  Tensor out = Tensor::empty({p.B, p.N, p.H, p.dv});
  const auto error = [&](AttentionOptions o) {
    return test::error_of([&] { attention_forward(in.q, in.k, in.v, o, out); });
  };
  AttentionOptions o;
  o.alibi_slopes = {1, 2};
  EXPECT_NE(error(o).find("alibi_slopes"), std::string::npos);
  o = {};
  o.softcap = -1;
  EXPECT_NE(error(o).find("softcap"), std::string::npos);
  o = {};
  o.q_positions = {1, 2};
  EXPECT_NE(error(o).find("q_positions"), std::string::npos);
  o = {};
  o.sinks = Tensor::zeros({3});
  EXPECT_NE(error(o).find("sinks"), std::string::npos);
  const Tensor k3 = Tensor::zeros({1, 4, 3, 4}), v3 = Tensor::zeros({1, 4, 3, 4});
  EXPECT_NE(test::error_of([&] { attention_forward(in.q, k3, v3, {}, out); }).find("multiple"), std::string::npos);
}

// --- rotary -----------------------------------------------------------------------------------

// The rotation written out: pair p of (a, b) at angle t·θ^(−2p/rd) (float angle, as rope.h says).
std::vector<double> rotated(const Tensor& x, const std::vector<int64_t>& pos, const RopeOptions& o) {
  const int64_t B = x.size(0), L = x.size(1), H = x.size(2), d = x.size(3);
  const int64_t rd = o.rope_dim ? o.rope_dim : d;
  std::vector<double> r;
  for (float e : x.to_vector()) r.push_back(e);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t p = 0; p < rd / 2; ++p) {
          const float inv = 1.0f / static_cast<float>(std::pow(double{o.theta}, static_cast<float>(2 * p) / rd));
          const double angle = static_cast<float>(pos[t]) * inv;
          const int64_t ia = o.style == RopeStyle::kNeox ? p : 2 * p, ib = o.style == RopeStyle::kNeox ? p + rd / 2 : 2 * p + 1;
          const int64_t base = ((b * L + t) * H + h) * d;
          const double a = at(x, b, t, h, ia), c = at(x, b, t, h, ib);
          r[base + ia] = a * std::cos(angle) - c * std::sin(angle);
          r[base + ib] = c * std::cos(angle) + a * std::sin(angle);
        }
  return r;
}

TEST(Rope, MatchesTheRotationAndItsTranspose) {
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
    for (int64_t d : {2, 6, 16, 64}) {
      for (int64_t rope_dim : {int64_t{0}, int64_t{2}, d / 2 * 2 == d && d >= 4 ? d / 2 : 2}) {
        RopeOptions o{style, d == 16 ? 500000.0f : 10000.0f, rope_dim % 2 ? rope_dim + 1 : rope_dim};
        SCOPED_TRACE(std::string(rope_style_name(style)) + " d " + std::to_string(d) + " rope_dim " +
                     std::to_string(o.rope_dim));
        const Tensor x = test::random_tensor({2, 5, 3, d}, 3 + d, -1, 1);
        const std::vector<int64_t> pos = {0, 1, 7, 4095, 70000};
        Tensor y = x.clone();
        rope_forward(y, pos, o);
        expect_close(y, rotated(x, pos, o), 2e-6, "rotated");
        // Backward is the inverse rotation: it gives x back (to rounding), and is Rᵀ exactly in the
        // sense <R x, g> = <x, Rᵀ g>.
        const Tensor g = test::random_tensor({2, 5, 3, d}, 9 + d, -1, 1);
        Tensor gt = g.clone();
        rope_backward(gt, pos, o);
        double lhs = 0, rhs = 0;
        const std::vector<float> yv = y.to_vector(), gv = g.to_vector(), xv = x.to_vector(), gtv = gt.to_vector();
        for (size_t n = 0; n < xv.size(); ++n) lhs += double{yv[n]} * gv[n], rhs += double{xv[n]} * gtv[n];
        EXPECT_NEAR(lhs, rhs, 1e-5 * static_cast<double>(xv.size()));
        rope_backward(y, pos, o);
        const std::vector<float> back = y.to_vector();
        for (size_t n = 0; n < xv.size(); ++n) ASSERT_NEAR(back[n], xv[n], 1e-6) << n;
      }
    }
  }
}

TEST(Rope, StridedViewsAndUntouchedTail) {
  // Heads as a view into a wider buffer: only the view's elements move, the rest stay.
  Tensor buffer = test::random_tensor({1, 4, 2, 10}, 5, -1, 1);
  const Tensor before = buffer.clone();
  const Tensor view = buffer.narrow(3, 0, 8);
  rope_forward(view, {3, 4, 5, 6}, {RopeStyle::kGptj, 10000.0f, 4});
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t c = 4; c < 10; ++c) EXPECT_EQ(at(buffer, 0, t, h, c), at(before, 0, t, h, c));
  EXPECT_NE(at(buffer, 0, 1, 0, 0), at(before, 0, 1, 0, 0));
}

TEST(Rope, RejectsBadOptions) {
  const Tensor x = Tensor::zeros({1, 2, 1, 6});
  EXPECT_NE(test::error_of([&] { rope_forward(x, {0, 1}, {RopeStyle::kNeox, 10000.0f, 3}); }).find("rope_dim"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { rope_forward(x, {0, 1}, {RopeStyle::kNeox, 10000.0f, 8}); }).find("rope_dim"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { rope_forward(x, {0, 1}, {RopeStyle::kNeox, 0.0f, 0}); }).find("theta"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { parse_rope_style("llama"); }).find("llama"), std::string::npos);
}

}  // namespace
}  // namespace cabm
