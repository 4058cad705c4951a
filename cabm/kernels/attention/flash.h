// Tiled attention with O(N) memory: FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster
// Attention with Better Parallelism and Work Partitioning") on the CPU.
//
// Same conventions as attention/reference.h (layout, scale, masks, fully masked rows, dropout);
// the N×M score matrix is never built. Forward: for each query tile, walk the key/value tiles with
// an online softmax (running row maximum m and sum l; the accumulator is rescaled only when m
// grows), divide once at the end and save lse = m + log l per row. Backward: for each key/value
// tile, walk the query tiles and recompute P = exp(S − lse) from the saved lse.
//
// Masks are evaluated per tile: a tile every element of which is blocked is skipped (no work at
// all); a tile every element of which is allowed by the structural parts (causal, sliding window,
// key padding, block-sparse layouts) runs without any per-element mask; only boundary tiles and
// the general parts (allow / additive tensors) pay for a per-element mask tile. Causal, window and
// key padding bound each query tile's key range, so causal costs about half of full attention and
// a sliding window is linear in N.
//
// Dropout uses the counter-based decisions of attention_dropout_keep (via DropoutMatrix), so the
// flash and reference kernels drop exactly the same weights, in forward and backward.
//
// Variants (attention/reference.h): grouped-query attention (GQA/MQA) reads key/value head
// h / (H / Hkv), packed once per key/value head in the forward; the backward's work items are key
// tiles of a key/value head, each walking the query heads of its group in order, so dk and dv sum
// the group in a fixed order with one writer. Soft-capping and ALiBi are a score epilogue per tile
// (attention/score_variants.h; ALiBi from positions, never an N×M tensor), compiled into a second
// instance of the tile loops: the plain loops are untouched when both are off. Masks, dropout and
// lse are indexed by the query head. Sinks are not applied here (attention/attention.cpp folds them).
#pragma once

#include "cabm/kernels/attention/reference.h"

#include <cstdint>

namespace cabm {

// Tile sizes. 0 selects the tuned default for the head dim and direction; tests force small
// tiles to exercise boundaries. Any positive values work (tails are handled).
struct FlashConfig {
  int64_t block_q = 0;  // query rows per tile
  int64_t block_k = 0;  // keys per tile
  // Backward: query rows a thread holds at once (rounded up to a multiple of block_q). 0 selects
  // all rows while their buffers fit in 4 MiB per thread, fewer beyond (long sequences).
  int64_t backward_rows = 0;
};

// Writes out [B, N, H, dv] (any strided view with unit last stride) and, if lse is non-null,
// lse F32 [B, H, N] contiguous (natural log; −inf for fully masked rows, whose output is 0).
// q [B, N, H, d], k [B, M, Hkv, d], v [B, M, Hkv, dv]: strided views, H a multiple of Hkv.
void attention_flash_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                             const Tensor& out, const Tensor* lse = nullptr, const FlashConfig& config = {});

// FlashAttention-2 backward. saved.lse is required (from attention_flash_forward, or the
// reference forward: both give the same quantity); dout [B, N, H, dv]; grads are overwritten.
// Work is split over key/value heads with their groups of query heads (dynamically, when there are
// enough) or over runs of key tiles (each owns its rows of dk, dv; the runs follow the machine's
// processors, not the thread count); dq of a head cut between runs sums the runs' partials in run
// order (attention/flash_backward_body.h). out, lse, dq, dk and dv are the same bits for any
// thread count.
void attention_flash_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                              const AttentionGrads& grads, const FlashConfig& config = {});

// The tile sizes a call would use (after defaults), for tests and benchmarks.
// d: head dim; n: query rows N; dtype: of the inputs, F32 (attention_flash_forward / _backward) or
// BF16 (the bf16 kernels' paths that take these tiles, which keep their own measured defaults).
FlashConfig flash_resolved_config(const FlashConfig& config, const AttentionOptions& options, int64_t d, int64_t n,
                                  bool backward, DType dtype = DType::F32);
// Whether this CPU's cores take 64 × 64 fp32 tiles on the avx512 set: an L1d of at least
// kFlashSquareTilesMinL1dBytes and at least kFlashSquareTilesMinFmasPerCycle 512-bit FMAs per cycle
// (cpu_isa.h: cpu_l1d_bytes, avx512_fmas_per_cycle); the L1d is checked first. See the .cpp.
inline constexpr int64_t kFlashSquareTilesMinL1dBytes = int64_t{48} << 10;
inline constexpr double kFlashSquareTilesMinFmasPerCycle = 1.5;
bool flash_square_fp32_tiles();

// Whether attention_flash_forward / _backward (and the bf16 SIMD path, the same bodies over bf16
// operands) run these variants themselves: H query heads over Hkv key/value heads, soft-capping,
// ALiBi. They run all of them, with every mask kind and dropout: always true. (Sinks are applied
// around them by attention.cpp.)
bool flash_supports_variants(int64_t H, int64_t Hkv, const AttentionOptions& options);

// The instruction set whose tile loops run (cpu_isa.h: chosen once from CPUID, or pinned by
// CABM_SIMD_ISA / set_simd_isa_override): "avx512", "avx2" or "portable".
const char* flash_isa();

}  // namespace cabm
