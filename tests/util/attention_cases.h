// What the attention kernel tests share (test_attention_reference, test_attention_flash,
// test_attention_flash_bf16): problem sizes, random heads and masks, the mask cases, the float
// error bound, and the cases, buffers and checks of a fast kernel against the reference.
#pragma once

#include "cabm/core/tensor.h"
#include "cabm/kernels/attention/flash.h"
#include "cabm/kernels/attention/flash_detail.h"
#include "cabm/kernels/attention/reference.h"
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/attention/mask.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace cabm::test {

// One problem: q [B, N, H, d], k [B, M, H, d], v [B, M, H, dv], out and dO [B, N, H, dv].
struct Dims {
  int64_t B, N, M, H, d, dv;
};
std::string describe(const Dims& s);
Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v);

// --- error bounds -----------------------------------------------------------------------------

// Higham (2002, "Accuracy and Stability of Numerical Algorithms", §3.1): a float sum or dot
// product of L terms is off by at most γ_L = L·u / (1 − L·u) times the sum of the terms'
// magnitudes, u = 2^-24. For attention computed in float against exact math:
//  - a score s = scale·q·k + bias is off by γ_d·smax, smax bounding |scale·Σ_c q_c k_c| + |bias|;
//  - a weight a_j = exp(s_j − lse) is then off by a relative 2·γ_d·smax (s_j and lse), plus a few
//    u for exp, the maximum subtraction and the division (8u covers them);
//  - o = Σ_j a_j v_j adds γ_M relative to Σ_j a_j |v_j| <= vmax.
// Gradients add the dv-long dots dP = dO·V and D = dO·O and the N- or M-long sums of dQ, dK, dV,
// so their relative bound is the same expression with γ_dv and γ_max(N, M) added. It is meant for
// the largest element of each tensor (a norm-wise bound), and is one kernel's: a test that
// compares two float kernels doubles it.
constexpr double kU = 0x1p-24;
double gamma_n(int64_t n);
double relative_bound(const Dims& s, double smax);

double max_abs(const Tensor& t);  // over the finite elements

// smax for the bound above: |scale|·d·max|q|·max|k| + Σ max|bias| over the additive parts.
// The scale is the caller's, so that a test can compute it without kernels/.
double smax_bound(double scale, const Tensor& q, const Tensor& k, const Mask& mask);

// --- random inputs ----------------------------------------------------------------------------

// Heads [B, L, H, d]. Strided: heads of a [B, L, 2, H, d + 1] buffer (row stride 2·H·(d + 1), head
// stride d + 1), as nn/ produces them from a fused projection. head_buffer_shape is the buffer,
// head_view the heads in it; make_heads fills the buffer uniform in [lo, hi), deterministic in seed.
Shape head_buffer_shape(int64_t B, int64_t L, int64_t H, int64_t d, bool strided);
Tensor head_view(const Tensor& buffer, int64_t d, bool strided);
Tensor make_heads(int64_t B, int64_t L, int64_t H, int64_t d, uint64_t seed, bool strided, float lo = -1.0f,
                  float hi = 1.0f);

// q, k, v and the output gradient g from seeds seed .. seed + 3; q and k in [−qk_range, qk_range),
// v and g in [−1, 1).
struct Inputs {
  Tensor q, k, v, g;
};
Inputs random_inputs(const Dims& s, uint64_t seed, bool strided, float qk_range = 1.0f);

Tensor random_bool(const Shape& shape, uint64_t seed, float p_true);  // BOOL, true with probability p_true

// Blocks of bq queries × bk keys, one layout per head, each block on with probability p_on.
BlockSparseLayout random_layout(const Dims& s, int64_t bq, int64_t bk, uint64_t seed, float p_on);

// --- mask cases -------------------------------------------------------------------------------

// A mask kind for a TEST_P over its index; the name is the test's suffix.
struct MaskCase {
  std::string name;
  std::function<Mask(const Dims&)> make;
};

// The kinds that need no sizes: none, causal (bottom-right) and causal top-left.
std::vector<MaskCase> plain_mask_cases();

// Every mask kind and combination at tile scale (N, M of tens to a few hundred): windows, padded
// and blocked rows, blocks aligned and not aligned to the tiles, additive biases with −inf.
std::vector<MaskCase> tile_mask_cases();

// The cases of `all` with these names, in the order of `names`.
std::vector<MaskCase> pick(const std::vector<MaskCase>& all, const std::vector<std::string>& names);

// --- a fast kernel against the reference ------------------------------------------------------

struct Outcome {
  Tensor out, lse;       // [B, N, H, dv], [B, H, N]
  AttentionGrads grads;  // empty unless backward ran
};

// The fp32 reference, forward (with lse) and, if backward, backward from dO = g.
Outcome run_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                      const AttentionOptions& options, bool backward);

// Result buffers for a fast kernel, full of NaN so that an element it does not write fails the
// comparison: out a view inside a [B, N, H, dv + 3] buffer, lse [B, H, N] (strided_outputs), dq a
// head view of a [B, N, H, d + 1] buffer, dk and dv head views of one [B, M, H, d + dv] buffer, as
// nn/ allocates them (strided_grads).
Outcome strided_outputs(const Dims& s);
AttentionGrads strided_grads(const Dims& s);

// Every element within an absolute tolerance.
void expect_within(const Tensor& actual, const Tensor& expected, double tol, const std::string& what);

// For causal (bottom-right, N > M) & key_padding({key_length, 0}): in item 0, queries i < N − M see
// no key and keys j >= key_length are seen by no query; item 1 has no keys. Their out, dq, dk, dv
// rows must be exactly 0 and their lse −inf.
void expect_zeros_where_fully_masked(const Outcome& r, const Dims& s, int64_t key_length);

// One check of a fast kernel against the reference.
struct FlashCase {
  Dims s;
  AttentionOptions options;
  FlashConfig config{};
  bool strided = true;  // inputs (and dO) as head views, else contiguous
  uint64_t seed = 1;    // of random_inputs
  float qk_range = 1.0f;
};
std::string describe(const FlashCase& c);

// The instruction sets of the tiled kernel's tile loops this CPU runs (the others are printed as
// skipped, once per process): the flash tests run each case on each (util/simd_isas.h).
const std::vector<SimdIsa>& flash_isas();

// A sample of sizes: N, M, d, and dv where the list fixes it (0: the test derives it; the test's
// name then leaves it out).
struct SizeCase {
  int64_t N, M, d, dv = 0;
};
std::string size_case_name(const SizeCase& c);

// Case `index` of a size sample (sc.dv set), with B = H = 1 where N·M·d exceeds max_work (the
// scalar N×M reference is what limits the sizes), else 2; seed 10 + index; every third case with
// dropout. With causal_tiles: a causal mask on contiguous heads and those tiles.
FlashCase size_case(const SizeCase& sc, int64_t max_work, size_t index, std::optional<FlashConfig> causal_tiles);

// For each dims × tiles: the mask of mask_case at those dims, inputs from seed.
std::vector<FlashCase> mask_sweep(const MaskCase& mask_case, const std::vector<Dims>& dims,
                                  const std::vector<FlashConfig>& tiles, uint64_t seed);

// Each of tiles on one problem, causal with item 1's keys padded from key_length on (s.B = 2).
std::vector<FlashCase> tile_size_cases(const Dims& s, int64_t key_length, const std::vector<FlashConfig>& tiles);

// Problems for runs with 1 and 2 threads: causal on 32×32 tiles, one head (which a backward may
// split between threads by key tiles) and three (an odd number of heads for two threads).
std::vector<FlashCase> thread_count_cases();

// Pins the tiled backwards' run count (detail::set_backward_split_runs) for its lifetime: run
// counts above and below the thread counts on any machine, whose own count is its processors.
class PinnedSplitRuns {
 public:
  explicit PinnedSplitRuns(int runs) { detail::set_backward_split_runs(runs); }
  ~PinnedSplitRuns() { detail::set_backward_split_runs(0); }
  PinnedSplitRuns(const PinnedSplitRuns&) = delete;
  PinnedSplitRuns& operator=(const PinnedSplitRuns&) = delete;
};

// Dropout 0.1 and 0.5 under masks that skip tiles: causal & padding on 32×16 tiles, then a window
// on each of window_tiles. The kernels must drop exactly the weights the reference drops.
std::vector<FlashCase> dropout_with_masks_cases(int64_t dv, const std::vector<FlashConfig>& window_tiles);

// Scaled scores up to ±7200 (|q|, |k| <= 30, d = 64, scale 1/8), without and with a causal mask:
// exp overflows unless every exponent is taken relative to the running maximum (forward) or to
// lse (backward). Softmax then is nearly one-hot.
std::vector<FlashCase> large_logits_cases();

// One key per item (softmax constant: dS is exactly 0), then with item 1 fully padded.
std::vector<FlashCase> single_key_cases();

// --- bounds with the variants (GQA, soft-capping, ALiBi) ----------------------------------------
// For inputs q [B, N, H, d], k [B, M, Hkv, d], v, dO = g (test_attention_flash_variants,
// test_attention_random).

// The largest |qpos − kpos| · |slope| of the ALiBi bias (0 without ALiBi).
double alibi_bound(const AttentionOptions& o, int64_t N, int64_t M);

// test::relative_bound (Higham's γ_n for a float kernel against exact math) with the score bound
// smax = |scale|·d·max|q|·max|k| (the error of the product; soft-capping only shrinks it, its
// derivative being <= 1) + the ALiBi bias + the mask's biases, and the error of tanh: a few ulps
// of c (8u·c, twice for the score and lse). dK sums over the group·N query rows of a key/value
// head. Doubled: both kernels compared carry it. score_bound replaces the product's part of smax
// where a test knows better (test_attention_flash_variants' SoftcapWithLargeLogits).
double variants_relative_bound(const Inputs& in, const AttentionOptions& o, double score_bound = -1.0);

// The magnitudes the relative bound applies to (as test_attention_flash.cpp): the output is an
// average of rows of v; dS = P∘(dP − D) is relative to dv·max|dO|·max|v|; dQ = scale·Σ_j dS K with
// Σ_j P = 1, dK = scale·Σ_i dSᵀ Q over the group's query rows (column sums of P: group·N/M on
// average, at least 1). Soft-capping multiplies dS by 1 − tanh² <= 1.
struct VariantMagnitudes {
  double out, ds, dq, dk;
};
VariantMagnitudes variant_magnitudes(const Inputs& in, const AttentionOptions& options);

// out, lse, dq, dk and dv of a fast kernel against the reference's within rel of those magnitudes.
void expect_variant_close(const Outcome& fast, const Outcome& ref, double rel, const VariantMagnitudes& m);

}  // namespace cabm::test
