#include "util/attention_cases.h"

#include "cabm/core/error.h"
#include "cabm/core/rng.h"
#include "cabm/kernels/attention/block_sparse.h"
#include "util/simd_isas.h"
#include "util/test_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace cabm::test {

std::string describe(const Dims& s) {
  return "B=" + std::to_string(s.B) + " N=" + std::to_string(s.N) + " M=" + std::to_string(s.M) +
         " H=" + std::to_string(s.H) + " d=" + std::to_string(s.d) + " dv=" + std::to_string(s.dv);
}

Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  return {q.size(0), q.size(1), k.size(1), q.size(2), q.size(3), v.size(3)};
}

// --- error bounds -----------------------------------------------------------------------------

double gamma_n(int64_t n) {
  return static_cast<double>(n) * kU / (1.0 - static_cast<double>(n) * kU);
}

double relative_bound(const Dims& s, double smax) {
  return 2.0 * gamma_n(s.d) * smax + 2.0 * gamma_n(s.dv) + gamma_n(std::max(s.N, s.M)) + 8.0 * kU;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (float x : t.to_vector())
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

double smax_bound(double scale, const Tensor& q, const Tensor& k, const Mask& mask) {
  double bias = 0;
  for (const Tensor& t : mask.biases()) bias += max_abs(t);
  return std::fabs(scale) * static_cast<double>(q.size(3)) * max_abs(q) * max_abs(k) + bias;
}

// --- random inputs ----------------------------------------------------------------------------

Shape head_buffer_shape(int64_t B, int64_t L, int64_t H, int64_t d, bool strided) {
  return strided ? Shape{B, L, 2, H, d + 1} : Shape{B, L, H, d};
}

Tensor head_view(const Tensor& buffer, int64_t d, bool strided) {
  return strided ? buffer.select(2, 1).narrow(3, 0, d) : buffer;
}

Tensor make_heads(int64_t B, int64_t L, int64_t H, int64_t d, uint64_t seed, bool strided, float lo, float hi) {
  return head_view(random_tensor(head_buffer_shape(B, L, H, d, strided), seed, lo, hi), d, strided);
}

Inputs random_inputs(const Dims& s, uint64_t seed, bool strided, float qk_range) {
  return {make_heads(s.B, s.N, s.H, s.d, seed, strided, -qk_range, qk_range),
          make_heads(s.B, s.M, s.H, s.d, seed + 1, strided, -qk_range, qk_range),
          make_heads(s.B, s.M, s.H, s.dv, seed + 2, strided), make_heads(s.B, s.N, s.H, s.dv, seed + 3, strided)};
}

Tensor random_bool(const Shape& shape, uint64_t seed, float p_true) {
  Tensor t = Tensor::empty(shape, DType::BOOL);
  Rng rng(seed);
  uint8_t* p = t.data<uint8_t>();
  for (int64_t n = 0; n < t.numel(); ++n) p[n] = rng.next_uniform() < p_true;
  return t;
}

BlockSparseLayout random_layout(const Dims& s, int64_t bq, int64_t bk, uint64_t seed, float p_on) {
  return {bq, bk, random_bool({s.H, (s.N + bq - 1) / bq, (s.M + bk - 1) / bk}, seed, p_on)};
}

// --- mask cases -------------------------------------------------------------------------------

std::vector<MaskCase> plain_mask_cases() {
  return {
      {"none", [](const Dims&) { return Mask(); }},
      {"causal", [](const Dims&) { return Mask::causal(); }},
      {"causal_top_left", [](const Dims&) { return Mask::causal(CausalAlign::kTopLeft); }},
  };
}

std::vector<MaskCase> tile_mask_cases() {
  std::vector<MaskCase> cases = plain_mask_cases();
  const std::vector<MaskCase> sized = {
      {"key_padding",
       [](const Dims& s) {
         std::vector<int64_t> lengths;
         for (int64_t b = 0; b < s.B; ++b) lengths.push_back(b == 0 ? s.M : 0);  // item 1: no keys at all
         if (s.B > 2) lengths[2] = s.M / 3 + 1;
         return Mask::key_padding(lengths);
       }},
      {"sliding_window", [](const Dims&) { return Mask::sliding_window(20, 5); }},
      {"window_narrow", [](const Dims&) { return Mask::sliding_window(0, 1); }},
      {"window_left_causal", [](const Dims&) { return Mask::causal() & Mask::sliding_window(33, Mask::kUnbounded); }},
      {"block_sparse_aligned", [](const Dims& s) { return Mask::block_sparse(random_layout(s, 16, 16, 21, 0.4f)); }},
      {"block_sparse_odd", [](const Dims& s) { return Mask::block_sparse(random_layout(s, 5, 7, 22, 0.4f)); }},
      {"bigbird",
       [](const Dims& s) {
         return Mask::block_sparse(bigbird_layout(
             s.N, s.M,
             {.block = 16, .local_blocks = 1, .global_blocks = 1, .random_blocks = 1, .heads = s.H, .seed = 4}));
       }},
      {"allow_nm",
       [](const Dims& s) {
         Tensor allowed = random_bool({s.N, s.M}, 23, 0.7f);
         for (int64_t j = 0; j < s.M; ++j) allowed.data<uint8_t>()[3 * s.M + j] = 0;  // row 3 fully blocked
         return Mask::allow(allowed);
       }},
      {"allow_bhnm_blocky",
       [](const Dims& s) {
         // Whole 32×32 regions blocked, so that some tiles are skipped after the per-element scan.
         Tensor allowed = Tensor::empty({s.B, s.H, s.N, s.M}, DType::BOOL);
         uint8_t* p = allowed.data<uint8_t>();
         for (int64_t n = 0; n < allowed.numel(); ++n) {
           const int64_t j = n % s.M, i = n / s.M % s.N;
           p[n] = ((i / 32 + j / 32) % 3) != 1;
         }
         return Mask::allow(allowed);
       }},
      {"additive_hnm",
       [](const Dims& s) {
         Tensor bias = random_tensor({s.H, s.N, s.M}, 24, -3.0f, 3.0f);
         for (int64_t n = 0; n < bias.numel(); n += 7) bias.data<float>()[n] = -INFINITY;
         return Mask::additive(bias);
       }},
      {"additive_broadcast_m", [](const Dims& s) { return Mask::additive(random_tensor({s.M}, 25, -1.0f, 1.0f)); }},
      {"additive_transposed",  // [N, M] view of an [M, N] buffer: keys N floats apart
       [](const Dims& s) {
         Tensor buffer = random_tensor({s.M, s.N}, 30, -2.0f, 2.0f);
         for (int64_t n = 0; n < buffer.numel(); n += 5) buffer.data<float>()[n] = -INFINITY;
         return Mask::additive(buffer.as_strided({s.N, s.M}, {1, s.N}));
       }},
      {"allow_key_broadcast",  // [B, 1, N, 1]: whole query rows blocked, keys at stride 0
       [](const Dims& s) {
         return Mask::allow(random_bool({s.B, 1, s.N, 1}, 31, 0.7f));
       }},
      {"window_padding_tensors",  // PyTorch's key_padding_mask as tensors [B, 1, 1, M] (the same for
                                  // every query), with a window: one row of terms serves a tile
       [](const Dims& s) {
         Tensor bias = random_tensor({s.B, 1, 1, s.M}, 32, -1.0f, 1.0f);
         for (int64_t n = 0; n < bias.numel(); n += 4) bias.data<float>()[n] = -INFINITY;
         return Mask::sliding_window(30, 12) & Mask::allow(random_bool({s.B, 1, 1, s.M}, 33, 0.8f)) &
                Mask::additive(bias);
       }},
      {"causal_padding_additive",
       [](const Dims& s) {
         std::vector<int64_t> lengths(static_cast<size_t>(s.B), s.M - 3);
         return Mask::causal() & Mask::key_padding(lengths) &
                Mask::additive(random_tensor({s.N, s.M}, 26, -1.0f, 1.0f));
       }},
      {"window_block_allow",
       [](const Dims& s) {
         return Mask::sliding_window(40, 10) & Mask::block_sparse(random_layout(s, 8, 8, 27, 0.4f)) &
                Mask::allow(random_bool({s.B, 1, s.N, s.M}, 28, 0.8f));
       }},
  };
  cases.insert(cases.end(), sized.begin(), sized.end());
  return cases;
}

std::vector<MaskCase> pick(const std::vector<MaskCase>& all, const std::vector<std::string>& names) {
  std::vector<MaskCase> picked;
  for (const std::string& name : names) {
    const auto it = std::find_if(all.begin(), all.end(), [&](const MaskCase& c) { return c.name == name; });
    CABM_CHECK(it != all.end(), "no mask case '{}'", name);
    picked.push_back(*it);
  }
  return picked;
}

// --- a fast kernel against the reference ------------------------------------------------------

Outcome run_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                      const AttentionOptions& options, bool backward) {
  const Dims s = dims_of(q, k, v);
  Outcome r;
  r.out = Tensor::full({s.B, s.N, s.H, s.dv}, NAN);
  r.lse = Tensor::full({s.B, s.H, s.N}, NAN);
  attention_reference_forward(q, k, v, options, r.out, nullptr, &r.lse);
  if (backward) {
    r.grads = {Tensor::full(q.shape(), NAN), Tensor::full(k.shape(), NAN), Tensor::full(v.shape(), NAN)};
    attention_reference_backward({q, k, v, r.out, Tensor()}, g, options, r.grads);
  }
  return r;
}

Outcome strided_outputs(const Dims& s) {
  Outcome r;
  r.out = Tensor::full({s.B, s.N, s.H, s.dv + 3}, NAN).narrow(3, 1, s.dv);
  r.lse = Tensor::full({s.B, s.H, s.N}, NAN);
  return r;
}

AttentionGrads strided_grads(const Dims& s) {
  const Tensor kv = Tensor::full({s.B, s.M, s.H, s.d + s.dv}, NAN);
  return {Tensor::full({s.B, s.N, s.H, s.d + 1}, NAN).narrow(3, 0, s.d), kv.narrow(3, 0, s.d), kv.narrow(3, s.d, s.dv)};
}

void expect_within(const Tensor& actual, const Tensor& expected, double tol, const std::string& what) {
  const auto cmp = compare(actual, expected, 0.0, tol);
  EXPECT_TRUE(cmp.ok) << what << ": max |diff| " << cmp.max_abs_diff << " > tolerance " << tol << "; first mismatch "
                      << cmp.first_bad;
}

void expect_zeros_where_fully_masked(const Outcome& r, const Dims& s, int64_t key_length) {
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t i = 0; i < s.N; ++i) {
        if (b == 0 && i >= s.N - s.M) continue;
        EXPECT_EQ(r.lse.at({b, h, i}), -INFINITY);
        for (int64_t c = 0; c < s.dv; ++c) ASSERT_EQ(r.out.at({b, i, h, c}), 0.0f) << b << " " << i;
        for (int64_t c = 0; c < s.d; ++c) ASSERT_EQ(r.grads.dq.at({b, i, h, c}), 0.0f) << b << " " << i;
      }
      for (int64_t j = 0; j < s.M; ++j) {
        if (b == 0 && j < key_length) continue;
        for (int64_t c = 0; c < s.d; ++c) ASSERT_EQ(r.grads.dk.at({b, j, h, c}), 0.0f);
        for (int64_t c = 0; c < s.dv; ++c) ASSERT_EQ(r.grads.dv.at({b, j, h, c}), 0.0f);
      }
    }
}

std::string describe(const FlashCase& c) {
  return describe(c.s) + " tiles " + std::to_string(c.config.block_q) + "x" + std::to_string(c.config.block_k) +
         " backward rows " + std::to_string(c.config.backward_rows) + (c.strided ? " strided" : "") +
         (c.options.dropout > 0 ? " dropout" : "");
}

const std::vector<SimdIsa>& flash_isas() {
  static const std::vector<SimdIsa> isas = runnable_isas("tiled attention");
  return isas;
}

std::string size_case_name(const SizeCase& c) {
  const std::string name = fmt::format("N{}_M{}_d{}", c.N, c.M, c.d);
  return c.dv != 0 ? fmt::format("{}_dv{}", name, c.dv) : name;
}

FlashCase size_case(const SizeCase& sc, int64_t max_work, size_t index, std::optional<FlashConfig> causal_tiles) {
  const int64_t heads = sc.N * sc.M * sc.d > max_work ? 1 : 2;
  FlashCase c{{heads, sc.N, sc.M, heads, sc.d, sc.dv}, {}};
  c.seed = 10 + index;
  if (causal_tiles) {
    c.options.mask = Mask::causal();
    c.config = *causal_tiles;
    c.strided = false;
  }
  if (index % 3 == 0) {
    c.options.dropout = 0.2f;
    c.options.dropout_seed = index;
  }
  return c;
}

std::vector<FlashCase> mask_sweep(const MaskCase& mask_case, const std::vector<Dims>& dims,
                                  const std::vector<FlashConfig>& tiles, uint64_t seed) {
  std::vector<FlashCase> cases;
  for (const Dims& s : dims)
    for (const FlashConfig& config : tiles) {
      FlashCase c{s, {}, config};
      c.options.mask = mask_case.make(s);
      c.seed = seed;
      cases.push_back(c);
    }
  return cases;
}

std::vector<FlashCase> tile_size_cases(const Dims& s, int64_t key_length, const std::vector<FlashConfig>& tiles) {
  std::vector<FlashCase> cases;
  for (const FlashConfig& config : tiles) {
    FlashCase c{s, {}, config};
    c.options.mask = Mask::causal() & Mask::key_padding({s.M, key_length});
    cases.push_back(c);
  }
  return cases;
}

std::vector<FlashCase> thread_count_cases() {
  std::vector<FlashCase> cases;
  for (const Dims& s : {Dims{1, 300, 300, 1, 32, 32}, Dims{1, 130, 200, 3, 16, 8}}) {
    FlashCase c{s, {}, {32, 32}};
    c.options.mask = Mask::causal();
    cases.push_back(c);
  }
  // Query rows in chunks of 64 (four), odd sizes, keys padded: the backward's runs in every chunk.
  FlashCase chunked{{1, 250, 333, 1, 40, 24}, {}, {32, 48, 64}};
  chunked.options.mask = Mask::key_padding({300});
  cases.push_back(chunked);
  return cases;
}

std::vector<FlashCase> dropout_with_masks_cases(int64_t dv, const std::vector<FlashConfig>& window_tiles) {
  std::vector<FlashCase> cases;
  for (float p : {0.1f, 0.5f}) {
    FlashCase c{{2, 77, 91, 2, 24, dv}, {}, {32, 16}};
    c.options.dropout = p;
    c.options.dropout_seed = 5;
    c.options.dropout_offset = 3;
    c.options.mask = Mask::causal() & Mask::key_padding({91, 40});
    cases.push_back(c);
    c.options.mask = Mask::sliding_window(10, 10);
    for (const FlashConfig& config : window_tiles) {
      c.config = config;
      cases.push_back(c);
    }
  }
  return cases;
}

std::vector<FlashCase> large_logits_cases() {
  std::vector<FlashCase> cases;
  for (const Mask& mask : {Mask(), Mask::causal()}) {
    FlashCase c{{1, 150, 140, 2, 64, 32}, {}, {32, 32}};
    c.options.mask = mask;
    c.qk_range = 30.0f;
    c.seed = 7;
    cases.push_back(c);
  }
  return cases;
}

std::vector<FlashCase> single_key_cases() {
  std::vector<FlashCase> cases;
  for (int64_t N : {1, 9, 70}) {
    FlashCase c{{2, N, 1, 2, 16, 16}, {}};
    cases.push_back(c);
    c.options.mask = Mask::key_padding({1, 0});
    cases.push_back(c);
  }
  return cases;
}

// --- bounds with the variants ----------------------------------------------------------------------

double alibi_bound(const AttentionOptions& o, int64_t N, int64_t M) {
  if (o.alibi_slopes.empty()) return 0.0;
  double slope = 0, qlo = 1e300, qhi = -1e300, klo = 1e300, khi = -1e300;
  for (float x : o.alibi_slopes) slope = std::max(slope, std::fabs(static_cast<double>(x)));
  for (int64_t i = 0; i < N; ++i) {
    const double p = static_cast<double>(o.q_positions.empty() ? M - N + i : o.q_positions[i]);
    qlo = std::min(qlo, p), qhi = std::max(qhi, p);
  }
  for (int64_t j = 0; j < M; ++j) {
    const double p = static_cast<double>(o.k_positions.empty() ? j : o.k_positions[j]);
    klo = std::min(klo, p), khi = std::max(khi, p);
  }
  return slope * std::max(std::fabs(qhi - klo), std::fabs(khi - qlo));
}

double variants_relative_bound(const Inputs& in, const AttentionOptions& o, double score_bound) {
  const int64_t N = in.q.size(1), M = in.k.size(1), group = in.q.size(2) / in.k.size(2);
  const double product = score_bound >= 0.0 ? score_bound + smax_bound(0.0, in.q, in.k, o.mask)
                                            : smax_bound(attention_scale(o, in.q.size(3)), in.q, in.k, o.mask);
  const double smax = product + alibi_bound(o, N, M);
  Dims s = dims_of(in.q, in.k, in.v);
  s.N *= group;
  return 2.0 * (relative_bound(s, smax) + 16.0 * kU * o.softcap);
}

VariantMagnitudes variant_magnitudes(const Inputs& in, const AttentionOptions& options) {
  const double scale = attention_scale(options, in.q.size(3));
  const double group = static_cast<double>(in.q.size(2) / in.k.size(2));
  const double ds = static_cast<double>(in.v.size(3)) * max_abs(in.g) * max_abs(in.v);
  const double column_sum = std::max(1.0, std::ceil(group * static_cast<double>(in.q.size(1)) / in.k.size(1)));
  return {max_abs(in.v) / (1.0 - options.dropout), ds, scale * max_abs(in.k) * ds,
          scale * max_abs(in.q) * ds * column_sum};
}

void expect_variant_close(const Outcome& fast, const Outcome& ref, double rel, const VariantMagnitudes& m) {
  expect_within(fast.out, ref.out, rel * m.out, "out");
  expect_within(fast.lse, ref.lse, rel * (1.0 + max_abs(ref.lse)), "lse");
  expect_within(fast.grads.dq, ref.grads.dq, rel * std::max(max_abs(ref.grads.dq), m.dq), "dq");
  expect_within(fast.grads.dk, ref.grads.dk, rel * std::max(max_abs(ref.grads.dk), m.dk), "dk");
  expect_within(fast.grads.dv, ref.grads.dv, rel * std::max(max_abs(ref.grads.dv), m.out), "dv");
}

}  // namespace cabm::test
