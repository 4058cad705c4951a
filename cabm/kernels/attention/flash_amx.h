// The AMX forward of attention_flash_bf16_forward (path "amx_bf16"): both products on Intel AMX
// tiles (tdpbf16ps), the online softmax in AVX-512. Internal to kernels/: attention/flash_bf16.cpp
// dispatches to it (see attention/flash_bf16.h for the numerics contract it keeps) and the tests
// reach it through that dispatch.
//
// Tiles (palette 1, all eight configured 16 rows × 64 bytes):
//   S = Q·Kᵀ   C: 16 queries × 16 keys fp32; A: 16 query rows × 32 head-dim bf16; B: 16 pairs of
//              head-dim elements × 16 keys × 2 (VNNI), i.e. K packed [Mp/16][dp/2][16][2].
//   O += P·V   C: 16 queries × 16 columns fp32 (loaded from and stored to the fp32 accumulator);
//              A: 16 rows of P × 32 keys bf16; B: 16 key pairs × 16 columns × 2, i.e. V packed
//              [Mp/2][dvp][2].
// Register blocking 2 × 2: four C tiles, two A, two B; a work item is 32 query rows of one head.
// K and V are packed once per call, per key/value head (b, hk). Key blocks follow the resolved
// block_k (a multiple of 16) exactly as the other paths do: P is rounded relative to the running
// maximum of the blocks seen so far, so the key blocking decides the roundings; the query blocking
// does not (rows are independent), which lets this path take 32 rows per item whatever block_q is.
#pragma once

#include "cabm/kernels/attention/flash.h"

namespace cabm::detail {

// Where the tile instructions run (attention/amx_tiles.h): on the CPU's AMX tiles, or on a scalar
// model of them that any CPU with AVX512_BF16 runs (path "amx_bf16_emulated", which the tests
// take to check this kernel where no AMX exists; results equal the hardware's up to the order of
// fp32 additions inside tdpbf16ps, which Intel does not specify beyond its pseudo-code).
enum class AmxTiles { kHardware, kEmulated };

// q [B, N, H, d], k [B, M, Hkv, d], v [B, M, Hkv, dv] BF16 (H a multiple of Hkv; soft-capping and
// ALiBi as attention/bf16_variants.h), out [B, N, H, dv] F32, lse null or F32
// [B, H, N]: shapes checked by the caller; tiles resolved, block_k a multiple of 16. Only to be
// called when bf16_amx_active() (bf16.h) for kHardware, cpu_has_avx512_bf16() for kEmulated;
// B·H·N > 0.
void attention_flash_bf16_forward_amx(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const AttentionOptions& options, const Tensor& out, const Tensor* lse,
                                      const FlashConfig& tiles, AmxTiles run_on);

// Test hook: while on, attention_flash_bf16_forward takes the emulated AMX path wherever it would
// take avx512_bf16 (attention/flash_bf16.cpp). Off by default; not for use while kernels run.
void set_amx_emulation(bool on);
bool amx_emulation();

}  // namespace cabm::detail
