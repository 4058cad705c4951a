// Tier 3 of the attention tests: the reference kernels against math written out again here, in
// double precision, independently of kernels/ (mask semantics included): the forward against a
// naive double implementation, the backward against central finite differences of that
// implementation.
#include "cabm/kernels/attention/reference.h"
#include "cabm/kernels/attention/block_sparse.h"
#include "util/attention_cases.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace cabm {
namespace {

using test::Dims;
using test::max_abs;
using test::MaskCase;

// --- the mask, re-evaluated from its definition ----------------------------------------------

float broadcast_at(const Tensor& t, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t full[4] = {b, h, i, j};
  std::vector<int64_t> index;
  for (int64_t axis = 0; axis < t.dim(); ++axis) {
    const int64_t outer = 4 - t.dim() + axis;
    index.push_back(t.size(axis) == 1 ? 0 : full[outer]);
  }
  switch (t.dim()) {
    case 1: return t.at({index[0]});
    case 2: return t.at({index[0], index[1]});
    case 3: return t.at({index[0], index[1], index[2]});
    default: return t.at({index[0], index[1], index[2], index[3]});
  }
}

// The additive term of score (b, h, i, j): −inf where blocked, else the sum of the biases.
double naive_mask(const Mask& mask, const Dims& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  const double blocked = -std::numeric_limits<double>::infinity();
  const int64_t p = i + s.M - s.N;  // query i's position among the keys, bottom-right aligned
  if (mask.causal_align() == CausalAlign::kBottomRight && j > p) return blocked;
  if (mask.causal_align() == CausalAlign::kTopLeft && j > i) return blocked;
  if (mask.window_left() != Mask::kUnbounded && j < p - mask.window_left()) return blocked;
  if (mask.window_right() != Mask::kUnbounded && j > p + mask.window_right()) return blocked;
  if (!mask.key_lengths().empty() && j >= mask.key_lengths()[b]) return blocked;
  for (const BlockSparseLayout& layout : mask.block_layouts()) {
    const int64_t hh = layout.blocks.size(0) == 1 ? 0 : h;
    if (layout.blocks.at({hh, i / layout.block_q, j / layout.block_k}) == 0.0f) return blocked;
  }
  for (const Tensor& t : mask.allowed())
    if (broadcast_at(t, b, h, i, j) == 0.0f) return blocked;
  double bias = 0;
  for (const Tensor& t : mask.biases()) bias += broadcast_at(t, b, h, i, j);
  return bias;
}

// --- naive attention in double ----------------------------------------------------------------

// The scale of the scores, not taken from kernels/ (attention_scale) and in double.
double naive_scale(const AttentionOptions& options, int64_t d) {
  return options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(d));
}

struct Naive {
  std::vector<double> out;  // [B, N, H, dv]
  std::vector<double> lse;  // [B, H, N]
};

Naive naive_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  const Dims s = test::dims_of(q, k, v);
  const double scale = naive_scale(options, s.d);
  Naive r;
  r.out.assign(static_cast<size_t>(s.B * s.N * s.H * s.dv), 0.0);
  r.lse.assign(static_cast<size_t>(s.B * s.H * s.N), 0.0);
  std::vector<double> row(static_cast<size_t>(s.M));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.N; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.M; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < s.d; ++c) dot += static_cast<double>(q.at({b, i, h, c})) * k.at({b, j, h, c});
          row[j] = dot * scale + naive_mask(options.mask, s, b, h, i, j);
          mx = std::max(mx, row[j]);
        }
        double* o = &r.out[static_cast<size_t>(((b * s.N + i) * s.H + h) * s.dv)];
        double& lse = r.lse[static_cast<size_t>((b * s.H + h) * s.N + i)];
        if (mx == -INFINITY) {
          lse = -INFINITY;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < s.M; ++j) sum += std::exp(row[j] - mx);
        lse = mx + std::log(sum);
        for (int64_t j = 0; j < s.M; ++j) {
          double a = std::exp(row[j] - mx) / sum;
          if (options.dropout > 0)
            a = attention_dropout_keep(options, b, h, s.H, i, j, s.M) ? a / (1.0 - options.dropout) : 0.0;
          for (int64_t c = 0; c < s.dv; ++c) o[c] += a * v.at({b, j, h, c});
        }
      }
  return r;
}

// Tolerances: the bound of one float kernel against exact math (test::relative_bound, Higham 2002),
// applied to the largest element of each tensor (norm-wise).
double relative_bound(const Dims& s, const Tensor& q, const Tensor& k, const AttentionOptions& options) {
  return test::relative_bound(s, test::smax_bound(naive_scale(options, s.d), q, k, options.mask));
}

// Compares a float tensor to double values in logical order with an absolute tolerance.
void expect_near(const Tensor& actual, const std::vector<double>& expected, double atol, const std::string& what) {
  const std::vector<float> a = actual.to_vector();
  ASSERT_EQ(a.size(), expected.size()) << what;
  double worst = 0;
  size_t worst_at = 0;
  for (size_t n = 0; n < a.size(); ++n) {
    if (std::isinf(expected[n])) {
      EXPECT_EQ(static_cast<double>(a[n]), expected[n]) << what << " at " << n;
      continue;
    }
    ASSERT_TRUE(std::isfinite(a[n])) << what << " at " << n << " is " << a[n];
    const double diff = std::fabs(a[n] - expected[n]);
    if (diff > worst) worst = diff, worst_at = n;
  }
  EXPECT_LE(worst, atol) << what << ": worst at " << worst_at << ": " << a[worst_at] << " vs " << expected[worst_at];
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x)
    if (std::isfinite(e)) m = std::max(m, std::fabs(e));
  return m;
}

// --- mask cases ---------------------------------------------------------------------------------

// At the small sizes that the naive double math and finite differences allow.
std::vector<MaskCase> mask_cases() {
  std::vector<MaskCase> cases = test::plain_mask_cases();
  const std::vector<MaskCase> sized = {
      {"key_padding",
       [](const Dims& s) {
         std::vector<int64_t> lengths;
         for (int64_t b = 0; b < s.B; ++b) lengths.push_back(b == 0 ? s.M : (b * 7 + 1) % (s.M + 1));
         if (s.B > 1) lengths[1] = 0;  // a batch item with no keys: all its rows fully masked
         return Mask::key_padding(lengths);
       }},
      {"sliding_window", [](const Dims&) { return Mask::sliding_window(3, 1); }},
      {"window_left_only", [](const Dims&) { return Mask::sliding_window(2, Mask::kUnbounded); }},
      {"window_zero", [](const Dims&) { return Mask::sliding_window(0, 0); }},
      {"block_sparse", [](const Dims& s) { return Mask::block_sparse(test::random_layout(s, 2, 3, 11, 0.5f)); }},
      {"bigbird",
       [](const Dims& s) {
         return Mask::block_sparse(bigbird_layout(s.N, s.M, {.block = 2, .local_blocks = 1, .global_blocks = 1,
                                                             .random_blocks = 1, .heads = s.H, .seed = 3}));
       }},
      {"allow_nm", [](const Dims& s) { return Mask::allow(test::random_bool({s.N, s.M}, 5, 0.6f)); }},
      {"allow_b1nm", [](const Dims& s) { return Mask::allow(test::random_bool({s.B, 1, s.N, s.M}, 6, 0.6f)); }},
      {"additive_hnm",
       [](const Dims& s) {
         Tensor bias = test::random_tensor({s.H, s.N, s.M}, 7, -2.0f, 2.0f);
         bias.data<float>()[1] = -INFINITY;
         return Mask::additive(bias);
       }},
      {"causal_padding_additive",
       [](const Dims& s) {
         std::vector<int64_t> lengths(static_cast<size_t>(s.B), std::max<int64_t>(1, s.M - 1));
         return Mask::causal() & Mask::key_padding(lengths) &
                Mask::additive(test::random_tensor({s.N, s.M}, 8, -1.0f, 1.0f));
       }},
      {"window_block_allow",
       [](const Dims& s) {
         return Mask::sliding_window(4, 2) & Mask::block_sparse(test::random_layout(s, 3, 2, 12, 0.5f)) &
                Mask::allow(test::random_bool({s.B, s.H, s.N, s.M}, 13, 0.8f));
       }},
  };
  cases.insert(cases.end(), sized.begin(), sized.end());
  return cases;
}

// --- forward ------------------------------------------------------------------------------------

void check_forward(const Dims& s, const AttentionOptions& options, bool strided, uint64_t seed,
                   float qk_range = 1.0f) {
  const auto [q, k, v, g] = test::random_inputs(s, seed, strided, qk_range);
  const Naive expected = naive_forward(q, k, v, options);
  const double rel = relative_bound(s, q, k, options);
  const double vmax = max_abs(v) / (1.0 - options.dropout);
  for (int threads : {1, 2}) {
    test::ScopedThreads scoped(threads);
    // out as a strided view too: [B, N, H, dv] inside a [B, N, H, dv + 2] buffer.
    const Tensor out = strided ? Tensor::full({s.B, s.N, s.H, s.dv + 2}, NAN).narrow(3, 0, s.dv)
                               : Tensor::full({s.B, s.N, s.H, s.dv}, NAN);
    Tensor lse = Tensor::empty({s.B, s.H, s.N});
    Tensor weights = Tensor::empty({s.B, s.H, s.N, s.M});
    attention_reference_forward(q, k, v, options, out, &weights, &lse);
    expect_near(out, expected.out, rel * vmax, "out (threads " + std::to_string(threads) + ")");
    expect_near(lse, expected.lse, rel * (1.0 + max_abs(expected.lse)), "lse");
  }
}

class ReferenceForwardMasks : public ::testing::TestWithParam<size_t> {};

TEST_P(ReferenceForwardMasks, MatchesNaiveDouble) {
  const MaskCase mask_case = mask_cases()[GetParam()];
  SCOPED_TRACE(mask_case.name);
  for (const Dims& s : {Dims{2, 7, 9, 2, 5, 3}, Dims{2, 9, 5, 3, 4, 4}, Dims{1, 1, 1, 1, 1, 1}, Dims{3, 13, 13, 1, 8, 6}}) {
    SCOPED_TRACE(describe(s));
    AttentionOptions options;
    options.mask = mask_case.make(s);
    check_forward(s, options, /*strided=*/true, 100 + s.N);
    check_forward(s, options, /*strided=*/false, 200 + s.N);
  }
}
INSTANTIATE_TEST_SUITE_P(All, ReferenceForwardMasks, ::testing::Range<size_t>(0, mask_cases().size()),
                         [](const auto& info) { return mask_cases()[info.param].name; });

TEST(ReferenceForward, FullyMaskedRowsAreZero) {
  const Dims s{2, 6, 4, 2, 3, 3};
  AttentionOptions options;
  // Bottom-right causal with N > M: queries 0, 1 see no key. Batch item 1 has no keys at all.
  options.mask = Mask::causal() & Mask::key_padding({4, 0});
  const auto [q, k, v, g] = test::random_inputs(s, 1, false);
  Tensor out = Tensor::full({s.B, s.N, s.H, s.dv}, NAN), lse = Tensor::empty({s.B, s.H, s.N});
  Tensor weights = Tensor::full({s.B, s.H, s.N, s.M}, NAN);
  attention_reference_forward(q, k, v, options, out, &weights, &lse);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.N; ++i) {
        const bool masked = b == 1 || i < 2;
        if (!masked) continue;
        EXPECT_EQ(lse.at({b, h, i}), -INFINITY);
        for (int64_t c = 0; c < s.dv; ++c) EXPECT_EQ(out.at({b, i, h, c}), 0.0f);
        for (int64_t j = 0; j < s.M; ++j) EXPECT_EQ(weights.at({b, h, i, j}), 0.0f);
      }
}

TEST(ReferenceForward, LargeLogitsDoNotOverflow) {
  // Scores up to ±4·10^4: exp would overflow without the maximum subtracted.
  const Dims s{1, 6, 7, 2, 4, 3};
  AttentionOptions options;
  options.scale = 1.0f;
  check_forward(s, options, false, 31, 100.0f);
  options.mask = Mask::causal();
  check_forward(s, options, true, 32, 100.0f);
}

TEST(ReferenceForward, Dropout) {
  const Dims s{2, 5, 8, 2, 4, 3};
  AttentionOptions options;
  options.dropout = 0.3f;
  options.dropout_seed = 1234;
  options.dropout_offset = 2;
  check_forward(s, options, true, 41);
  options.mask = Mask::causal() & Mask::key_padding({8, 5});
  check_forward(s, options, false, 42);
}

TEST(Dropout, RowFillMatchesPerElementDecision) {
  AttentionOptions options;
  options.dropout = 0.4f;
  options.dropout_seed = 99;
  options.dropout_offset = 7;
  const int64_t H = 3, M = 37;
  for (int64_t b : {0, 2})
    for (int64_t h : {0, 2}) {
      const DropoutMatrix dropout(options, b, h, H, M);
      for (int64_t i : {0, 1, 5}) {
        for (auto [j0, j1] : {std::pair<int64_t, int64_t>{0, M}, {3, 4}, {5, 22}, {36, 37}}) {
          std::vector<float> row(static_cast<size_t>(2 * (j1 - j0)), -1.0f);
          dropout.fill_row(i, j0, j1, 2.5f, row.data(), 2);
          for (int64_t j = j0; j < j1; ++j) {
            const bool keep = attention_dropout_keep(options, b, h, H, i, j, M);
            EXPECT_EQ(dropout.keep(i, j), keep);
            EXPECT_EQ(row[static_cast<size_t>(2 * (j - j0))], keep ? 2.5f : 0.0f);
          }
        }
      }
    }
}

// --- backward against finite differences ------------------------------------------------------

// L = Σ out ∘ G in double; its gradient with respect to every element of q, k, v by central
// differences with step h = 1e-4: truncation error h²/6·|L'''| ~ 1e-9, rounding ~ 1e-16 / h.
struct FiniteDifferences {
  std::vector<double> dq, dk, dv;
};

FiniteDifferences finite_differences(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                     const AttentionOptions& options) {
  const std::vector<float> gv = g.to_vector();
  const auto loss = [&]() {
    const Naive r = naive_forward(q, k, v, options);
    double l = 0;
    for (size_t n = 0; n < gv.size(); ++n) l += r.out[n] * gv[n];
    return l;
  };
  // Perturbs elements of a contiguous copy and writes it back through the (possibly strided) view.
  const auto grad_of = [&](Tensor x) {  // a view sharing the caller's storage
    std::vector<double> grad;
    Tensor copy = x.clone();
    const Tensor original = x.clone();
    float* p = copy.data<float>();
    const double h = 1e-4;
    for (int64_t n = 0; n < copy.numel(); ++n) {
      const float saved = p[n];
      // The perturbed value must be exactly representable for the difference quotient: use the
      // float values actually stored.
      p[n] = static_cast<float>(saved + h);
      const double up = static_cast<double>(p[n]) - saved;
      x.copy_from(copy);
      const double l_up = loss();
      p[n] = static_cast<float>(saved - h);
      const double down = saved - static_cast<double>(p[n]);
      x.copy_from(copy);
      const double l_down = loss();
      p[n] = saved;
      grad.push_back((l_up - l_down) / (up + down));
    }
    x.copy_from(original);
    return grad;
  };
  return {grad_of(q), grad_of(k), grad_of(v)};
}

void check_backward(const Dims& s, const AttentionOptions& options, bool strided, uint64_t seed) {
  // Inputs in [−2, 2] for a softmax that is neither uniform nor one-hot.
  const auto [q, k, v, g] = test::random_inputs(s, seed, strided, 2.0f);
  const FiniteDifferences fd = finite_differences(q, k, v, g, options);

  Tensor out = Tensor::empty({s.B, s.N, s.H, s.dv});
  attention_reference_forward(q, k, v, options, out);
  const AttentionSaved saved{q, k, v, out, Tensor()};
  for (int threads : {1, 2}) {
    test::ScopedThreads scoped(threads);
    const AttentionGrads grads{Tensor::full(q.shape(), NAN), Tensor::full(k.shape(), NAN),
                               Tensor::full(v.shape(), NAN)};
    attention_reference_backward(saved, g, options, grads);
    // FD differences carry their own error ~1e-9 (above); float rounding dominates (see relative_bound).
    const double rel = relative_bound(s, q, k, options);
    expect_near(grads.dq, fd.dq, rel * max_abs(fd.dq) + 1e-7, "dq");
    expect_near(grads.dk, fd.dk, rel * max_abs(fd.dk) + 1e-7, "dk");
    expect_near(grads.dv, fd.dv, rel * max_abs(fd.dv) + 1e-7, "dv");
  }
}

class ReferenceBackwardMasks : public ::testing::TestWithParam<size_t> {};

TEST_P(ReferenceBackwardMasks, MatchesFiniteDifferences) {
  const MaskCase mask_case = mask_cases()[GetParam()];
  SCOPED_TRACE(mask_case.name);
  for (const Dims& s : {Dims{2, 5, 6, 2, 3, 2}, Dims{2, 6, 4, 1, 2, 3}}) {
    AttentionOptions options;
    options.mask = mask_case.make(s);
    check_backward(s, options, /*strided=*/true, 300 + s.N);
  }
}
INSTANTIATE_TEST_SUITE_P(All, ReferenceBackwardMasks, ::testing::Range<size_t>(0, mask_cases().size()),
                         [](const auto& info) { return mask_cases()[info.param].name; });

TEST(ReferenceBackward, DropoutMatchesFiniteDifferences) {
  const Dims s{2, 5, 6, 2, 3, 2};
  AttentionOptions options;
  options.dropout = 0.25f;
  options.dropout_seed = 77;
  check_backward(s, options, false, 400);
  options.mask = Mask::causal() & Mask::key_padding({6, 3});
  check_backward(s, options, true, 401);
}

TEST(ReferenceBackward, ExplicitScaleMatchesFiniteDifferences) {
  AttentionOptions options;
  options.scale = 0.7f;
  check_backward({1, 4, 5, 2, 3, 3}, options, false, 500);
}

TEST(ReferenceBackward, FullyMaskedRowsHaveZeroGradient) {
  const Dims s{2, 5, 3, 1, 2, 2};
  AttentionOptions options;
  options.mask = Mask::causal() & Mask::key_padding({3, 0});  // rows 0, 1 of item 0 and all of item 1
  const auto [q, k, v, g] = test::random_inputs(s, 1, false);
  Tensor out = Tensor::empty({s.B, s.N, s.H, s.dv});
  attention_reference_forward(q, k, v, options, out);
  const AttentionGrads grads{Tensor::full(q.shape(), NAN), Tensor::full(k.shape(), NAN), Tensor::full(v.shape(), NAN)};
  attention_reference_backward({q, k, v, out, Tensor()}, g, options, grads);
  for (int64_t c = 0; c < s.d; ++c) {
    EXPECT_EQ(grads.dq.at({0, 0, 0, c}), 0.0f);
    EXPECT_EQ(grads.dq.at({0, 1, 0, c}), 0.0f);
    for (int64_t i = 0; i < s.N; ++i) EXPECT_EQ(grads.dq.at({1, i, 0, c}), 0.0f);
    for (int64_t j = 0; j < s.M; ++j) EXPECT_EQ(grads.dk.at({1, j, 0, c}), 0.0f);
  }
  for (int64_t j = 0; j < s.M; ++j)
    for (int64_t c = 0; c < s.dv; ++c) EXPECT_EQ(grads.dv.at({1, j, 0, c}), 0.0f);
}

TEST(ReferenceBackward, RejectsMismatchedShapes) {
  const Tensor q = Tensor::zeros({1, 3, 1, 2}), k = Tensor::zeros({1, 4, 1, 2}), v = Tensor::zeros({1, 4, 1, 2});
  const Tensor out = Tensor::zeros({1, 3, 1, 2});
  const AttentionGrads bad{Tensor::zeros({1, 3, 1, 2}), Tensor::zeros({1, 3, 1, 2}), Tensor::zeros({1, 4, 1, 2})};
  EXPECT_THROW(attention_reference_backward({q, k, v, out, Tensor()}, out, {}, bad), Error);
}

// --- BigBird layout ------------------------------------------------------------------------------

TEST(BigBirdLayout, BandGlobalAndRandomBlocks) {
  const BigBirdConfig config{.block = 4, .local_blocks = 1, .global_blocks = 1, .random_blocks = 2, .heads = 2, .seed = 9};
  const BlockSparseLayout layout = bigbird_layout(40, 40, config);
  ASSERT_EQ(layout.blocks.shape(), (Shape{2, 10, 10}));
  EXPECT_EQ(layout.block_q, 4);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t qb = 0; qb < 10; ++qb) {
      int64_t count = 0;
      for (int64_t kb = 0; kb < 10; ++kb) {
        const bool on = layout.blocks.at({h, qb, kb}) != 0.0f;
        count += on;
        if (std::abs(kb - qb) <= 1 || kb == 0 || qb == 0) {
          EXPECT_TRUE(on) << h << " " << qb << " " << kb;
        }
      }
      // Row 0 is global. Else band (3 blocks, 2 at the edge) + global block 0 (inside the band for
      // qb = 1) + 2 random.
      if (qb == 0) EXPECT_EQ(count, 10);
      else EXPECT_EQ(count, qb == 1 || qb == 9 ? 5 : 6) << qb;
    }
  // Deterministic in the seed, different across seeds.
  const BlockSparseLayout again = bigbird_layout(40, 40, config);
  EXPECT_EQ(again.blocks.to_vector(), layout.blocks.to_vector());
  BigBirdConfig other = config;
  other.seed = 10;
  EXPECT_NE(bigbird_layout(40, 40, other).blocks.to_vector(), layout.blocks.to_vector());
  Mask::block_sparse(layout).validate(3, 2, 40, 40);
}

}  // namespace
}  // namespace cabm
