// Tiled attention with bf16 operands and fp32 accumulation (mixed precision), forward and backward.
// FlashAttention-2 (Dao 2023) like attention/flash.h, with the same conventions (layout, scale,
// masks, fully masked rows → 0 and lse = −inf, counter-based dropout identical to the reference).
//
// Numerics: Q, K, V are bf16. S = Q·Kᵀ is accumulated in fp32 (each bf16·bf16 product is exact in
// fp32); the running maximum, the running sum l, the accumulator O and the log-sum-exp are fp32.
// P = exp(S − m) is computed in fp32, summed into l in fp32, and rounded to bf16 only as the input
// of the second product O += P·V (as FlashAttention does on GPUs). The output is fp32; callers that
// store bf16 activations round it with float_to_bf16.
//
// Paths, chosen at run time (attention_flash_bf16_path() names the one that runs):
//   amx_bf16     CPUs with AMX-BF16 tiles as well (bf16_amx_active()): the forward's two products
//                with tdpbf16ps on 16×16 fp32 tiles, the online softmax in AVX-512, every mask kind
//                and dropout (attention/flash_amx.h), on default tiles of 32 queries × 768 keys
//                for N > 256 without a window or block layout (attention_flash_bf16_forward_tiles;
//                avx512_bf16 takes 768 keys there too); the backward's five products on the same
//                tiles (attention/flash_bf16_backward.h; soft-capping and ALiBi as avx512_bf16).
//                set_bf16_isa_override(kAvx512Bf16) or CABM_NO_AMX=1 selects avx512_bf16 instead.
//   amx_bf16_emulated  the same kernels on a scalar model of the tiles (attention/amx_tiles.h),
//                taken only while the tests' hook detail::set_amx_emulation is on, on any CPU with
//                AVX-512 BF16: how the AMX kernels are tested where no AMX exists.
//   avx512_bf16  CPUs with AVX-512 BF16 where vdpbf16ps outruns fp32 FMAs (bf16_vdpbf16ps_active():
//                measured once per machine (machine_wisdom.h), or pinned by CABM_BF16_PRODUCTS; the Zen 4 and 5, not
//                the Intel Xeons measured, which take avx512_fp32 when AMX is absent): both products
//                with vdpbf16ps on pair-interleaved packed tiles (K: 16 keys × 2 head-dim
//                elements per zmm; V: 2 keys × 16 columns per zmm; Q and P rows read as 32-bit
//                pairs and broadcast); the backward's five products on the same micro-kernels
//                (attention/flash_bf16_backward.h), except for calls with soft-capping or ALiBi,
//                whose backward runs on the next path.
//   avx2_fp32    (avx512_fp32 on the avx512 set) CPUs without AVX-512 BF16, or with it where
//                vdpbf16ps does not outrun fp32 FMAs, when the SIMD set (cpu_isa.h) is not
//                portable: the bf16 tiles
//                are widened to fp32 (exact) into per-thread scratch and the fp32 flash kernel's
//                SIMD tile products run on them (attention/flash_detail.h), with P, dO, dS rounded
//                to bf16 values at the same points as the portable path.
//   portable     scalar fp32 math, written to be read: the forward on the same packed tiles as
//                avx512_bf16, the backward one (query, key) element at a time. Forced by
//                set_bf16_isa_override(Bf16Isa::kPortable) or CABM_FORCE_PORTABLE=1.
// All paths round the same operands to bf16 at the same points; they differ in the order of fp32
// sums (and so, rarely, in which way a rounded operand near a bf16 rounding boundary goes).
// Variants (GQA, soft-capping, ALiBi; attention/reference.h): the forward on amx_bf16, avx512_bf16
// and portable and the portable backward run them (attention/bf16_variants.h: one pass over each
// score tile, compiled away when off); the fp32 SIMD path runs those attention/flash.cpp does.
#pragma once

#include "cabm/kernels/attention/flash.h"

namespace cabm {

// q [B, N, H, d], k [B, M, Hkv, d], v [B, M, Hkv, dv]: BF16 strided views with unit last stride;
// query head h reads key/value head h / (H / Hkv) (GQA/MQA, packed once per key/value head).
// Soft-capping and ALiBi (options.softcap, options.alibi_slopes with the positions) as the
// reference defines them, computed per tile (attention/bf16_variants.h); the fp32 SIMD path takes
// what flash_supports_variants says. Throws for variants flash_bf16_supports_variants rejects.
// out [B, N, H, dv]: F32 (any strided view with unit last stride), overwritten.
// lse: null or F32 [B, H, N] contiguous (natural log; −inf for fully masked rows).
// config: tile sizes as FlashConfig (0 = default); block_k is rounded up to a multiple of 16.
void attention_flash_bf16_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                  const Tensor& out, const Tensor* lse = nullptr, const FlashConfig& config = {});

// FlashAttention-2 backward with bf16 operands (Dao 2023, Algorithm 2; the derivation of each
// gradient is in attention/reference.cpp). saved.q, saved.k, saved.v: BF16 views as in the
// forward; saved.out F32 [B, N, H, dv] (the forward's output); saved.lse F32 [B, H, N] (required).
// dout: F32 [B, N, H, dv].
// grads.dq/dk/dv: F32 views with the shapes of q, k, v, overwritten. D = rowsum(dO ∘ O) and
// dS = P ∘ (dP − D) in fp32; dO, P and dS rounded to bf16 only as inputs of the products
// (dV += Pᵀ dO, dP = dO Vᵀ, dQ += dS K, dK += dSᵀ Q), all accumulation fp32. P is recomputed
// from the saved lse; masks, tile skipping, dropout decisions and fully masked rows (0 gradient)
// as in attention_flash_backward. The same bits for any thread count on every path (on a given
// machine: the split of few heads follows its processors, attention/backward_split.h). GQA: dk,
// dv of a key/value head sum over its query heads in head order. With soft-capping the rounded
// operand is dT = dS ∘ (1 − tanh²(t/c)), the gradient of the capped score.
void attention_flash_bf16_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                                   const AttentionGrads& grads, const FlashConfig& config = {});

// Whether attention_flash_bf16_forward (backward: attention_flash_bf16_backward) runs these
// variants itself: H query heads over Hkv key/value heads, soft-capping, ALiBi. The forward on the
// amx_bf16, avx512_bf16 and portable paths runs all of them; on the fp32 SIMD path what
// flash_supports_variants says (the forward's answer depends on the current path, i.e. on the
// override). The backward: its portable path runs all of them, so what flash_supports_variants
// says (the process may take either backward path). (Sinks are applied around every tiled kernel
// by attention.cpp.)
bool flash_bf16_supports_variants(int64_t H, int64_t Hkv, const AttentionOptions& options, bool backward);

// The path attention_flash_bf16_forward takes now: "amx_bf16", "amx_bf16_emulated" (tests only),
// "avx512_bf16", "avx2_fp32" (or "avx512_fp32") or "portable".
const char* attention_flash_bf16_path();
// The tiles attention_flash_bf16_forward takes now for these queries, options and config: config's
// sizes where set, else the path's defaults (amx_bf16 and avx512_bf16 take wider ones), with
// block_k rounded up to 16. P is rounded relative to the running maxima of the tiles seen so far,
// so two paths round P alike only on the same tiles.
FlashConfig attention_flash_bf16_forward_tiles(const Tensor& q, const AttentionOptions& options,
                                               const FlashConfig& config = {});
// The path attention_flash_bf16_backward takes now (for calls without soft-capping or ALiBi): one
// of the forward's names.
const char* attention_flash_bf16_backward_path();

}  // namespace cabm
