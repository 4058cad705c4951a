// What the bf16 flash kernels' tests share (test_attention_flash_bf16 for the forward,
// test_attention_flash_bf16_backward): bf16 inputs with their exact fp32 values, the mask cases,
// the paths a CPU runs (and how to reach each), running the kernels and the reference, and the
// weight statistics the error bounds need.
//
// Tolerances (Higham 2002, §3.1 for the fp32 parts). u = 2^-24 (fp32), u_b = 2^-8 (bf16's unit
// roundoff: 8 significant bits, half of its epsilon 2^-7). q, k, v hold bf16 values, exact in
// fp32, and bf16·bf16 products are exact in fp32, so the scores carry only fp32 summation error. The fp32 part of every
// bound is the fp32 flash test's: a relative bound rel = 2(2γ_d·smax + 2γ_dv + γ_max(N,M) + 8u)
// applied to each tensor's magnitude (norm-wise), where smax bounds |scale·q·k| + |bias|. On top of
// it, the bf16 roundings, each a relative error of at most u_b on one operand:
//  - forward: P before P·V. o_i = Σ_j a_ij v_j with Σ_j a_ij ≤ keep = 1/(1 − dropout), so o is off
//    by at most u_b·keep·max|v|; P's exponential is a degree-4 polynomial (exp2_poly.h) with
//    relative error ε, in P and in l = Σ P: a further 2ε (kUWeights); the backward recomputes P
//    with it: ε more where P enters dV and dS below;
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
#pragma once

#include "cabm/kernels/attention/flash.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/exp2_poly.h"
#include "util/attention_cases.h"
#include "util/test_util.h"

#include <cstdint>
#include <vector>

namespace cabm::test::flash_bf16 {

inline constexpr double kUBf16 = 0x1p-8;  // bf16's unit roundoff: 8 significant bits
// The forward's weights meet V off by u_b (rounded to bf16) and 2ε (the exponential's polynomial).
inline constexpr double kUWeights = kUBf16 + 2.0 * detail::kExp2PRelError;

// A bf16 head view [B, L, H, d] (strided: heads of a [B, L, 2, H, d + 1] buffer) and the same view
// of the fp32 values it holds.
struct Heads {
  Tensor bf, f32;
};
Heads make_heads(int64_t B, int64_t L, int64_t H, int64_t d, uint64_t seed, bool strided, float range = 1.0f);

// q, k, v as bf16 (and their fp32 values) and dO (fp32, not bf16-representable: the kernel rounds it).
struct Inputs {
  Dims s;
  Heads q, k, v;
  Tensor g;
};
Inputs make_inputs(const Dims& s, uint64_t seed, bool strided, float qk_range = 1.0f);

// A subset of the fp32 flash test's mask kinds, and two combinations of its own.
std::vector<MaskCase> mask_cases();

// --- paths ------------------------------------------------------------------------------------

struct ScopedIsa {
  explicit ScopedIsa(Bf16Isa isa) { set_bf16_isa_override(isa); }
  ~ScopedIsa() { set_bf16_isa_override(Bf16Isa::kAuto); }
};

// One way to reach a path: the override, whether the AMX forward runs on the scalar model of
// the tiles (attention/amx_tiles.h), which any AVX-512 BF16 CPU runs, and the products override
// (the widened fp32 tiles on a CPU whose automatic choice is vdpbf16ps or AMX).
struct PathSetting {
  Bf16Isa isa;
  bool emulated_amx = false;
  Bf16Products products = Bf16Products::kAuto;
};
struct ScopedPath {
  explicit ScopedPath(const PathSetting& setting);
  ~ScopedPath();
  ScopedIsa isa;
};

// The settings that reach each distinct path at run time: forced portable, the automatic choice
// (amx_bf16 on a CPU with AMX tiles; avx2_fp32 on a CPU without AVX-512 BF16 built with SIMD;
// unless CABM_FORCE_PORTABLE or CABM_NO_AMX is set), and, where the CPU has AVX-512 BF16, that
// path without AMX, the AMX kernels on emulated tiles (amx_bf16_emulated) and the widened fp32
// tiles (avx512_fp32 or avx2_fp32, the SIMD set's).
std::vector<PathSetting> forward_paths();
std::vector<PathSetting> backward_paths();

// --- running the kernels ----------------------------------------------------------------------

// The fp32 reference on the bf16 values.
Outcome run_reference(const Inputs& in, const AttentionOptions& options, bool backward);
// The bf16 backward from a saved forward (its out and lse) into r.grads.
void run_backward(const Inputs& in, const Outcome& saved, const AttentionOptions& options, const FlashConfig& config,
                  Outcome& r);
// The bf16 kernels on the current path; out is a strided view inside a wider buffer.
Outcome run_bf16(const Inputs& in, const AttentionOptions& options, const FlashConfig& config, bool backward);

// The portable path's outcome to hold `setting`'s against: `portable` (the portable run with
// config) where both paths take the same forward tiles, else a portable run on that path's tiles
// (amx_bf16 and avx512_bf16 take wider default tiles, and P's rounding depends on the tiles).
Outcome portable_on_tiles_of(const PathSetting& setting, const Inputs& in, const AttentionOptions& options,
                             const FlashConfig& config, bool backward, const Outcome& portable);

// What the bounds need from the exact weights (the reference's, as [B, H, N, M]): the largest
// weight and the largest column sum, with dropout (a, the weights that meet V) and without (P).
struct WeightStats {
  double max_a = 0, max_p = 0, col_a = 0, col_p = 0;
};
WeightStats weight_stats(const Inputs& in, const AttentionOptions& options);

}  // namespace cabm::test::flash_bf16
