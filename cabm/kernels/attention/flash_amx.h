// The AMX products of attention_flash_bf16_forward (paths "amx_bf16" and "amx_bf16_emulated"):
// one key tile of the bf16 forward's tile loop (attention/flash_bf16.cpp, which owns the query
// tiles, the mask, dropout and the output) with both products on Intel AMX tiles (tdpbf16ps) and
// the online softmax in AVX-512. Internal to kernels/; see attention/flash_bf16.h for the
// numerics contract.
//
// Tiles (palette 1, all eight configured 16 rows × 64 bytes; attention/amx_tile_gemm.h):
//   S = Q·Kᵀ   C: 16 queries × 16 keys fp32; A: 16 query rows × 32 head-dim bf16; B: 16 pairs of
//              head-dim elements × 16 keys × 2 (VNNI), i.e. K packed [Mp/16][dp/2][16][2].
//   O += P·V   C: 16 queries × 16 columns fp32 (loaded from and stored to the fp32 accumulator);
//              A: 16 rows of P × 32 keys bf16; B: 16 key pairs × 16 columns × 2, i.e. V packed
//              [Mp/2][dvp][2].
// Register blocking 2 × 2 (four C tiles, two A, two B) over the tile's query rows in 16s. The
// caller pads: dp = d rounded up to 32, dvp = dv rounded up to 16, Mp = M rounded up to 16, plus
// 16 (a tile of 16·n keys reads P·V 32 keys at a time, so up to 16 keys past its end, where P is 0
// and V is zero padding or the next tile's finite values); query rows, S and P rows to 16 (rows
// past the tile's end hold finite values whose results nobody reads); S, P and the mask rows `lds`
// apart, lds a multiple of 32.
#pragma once

#include "cabm/kernels/attention/bf16_packing.h"
#include "cabm/kernels/attention/bf16_variants.h"
#include "cabm/kernels/attention/flash.h"

namespace cabm::detail {

// One key tile of one query tile: ni query rows, nk keys. m, l, alpha: the rows' running maximum
// (base 2), sum and this tile's correction, updated; o: the rows' unnormalised output, updated.
struct AmxForwardTile {
  const bf16* q;                  // query rows [ni rounded up to 16][dp]
  int64_t dp, ni;                 //
  const bf16 *k, *v;              // packed K and V at the tile's first key
  int64_t nk, dvp;                //
  const float *mask, *z;          // additive mask (base 2, padding keys −inf) and dropout factors: null if none
  float* s;                       // S scratch [rows][lds]
  bf16* p;                        // P [rows][lds]
  int64_t lds;                    //
  float* o;                       // [rows][dvp]
  float *m, *l, *alpha;           // [ni]
  float qscale;                   // scale·log2(e), or 1 where the variant pass scales
  const ScoreVariants* variants;  // soft-cap, ALiBi: null if none (then h, i0, kpos unused)
  int64_t h, i0;
  const int64_t* kpos;  // the tile's key positions (ALiBi)
};
// run_on: kAmxTiles (the CPU's tiles; only where bf16_amx_active()) or kAmxEmulated (the scalar
// model of attention/amx_tiles.h, which any CPU with AVX512_BF16 runs and the tests take to check
// this kernel where no AMX exists; results equal the hardware's up to the order of fp32 additions
// inside tdpbf16ps, which Intel does not specify beyond its pseudo-code). Called between
// amx_tiles_begin and amx_tiles_end on the calling thread.
void amx_forward_tile(const AmxForwardTile& tile, Bf16Products run_on);
// The tile configuration is per thread: loaded before a thread's first tile, released after its last.
void amx_tiles_begin(Bf16Products run_on);
void amx_tiles_end(Bf16Products run_on);

// Test hook: while on, attention_flash_bf16_forward and _backward take the emulated AMX path
// wherever they would take avx512_bf16 (attention/flash_bf16.cpp). Off by default; not for use
// while kernels run.
void set_amx_emulation(bool on);
bool amx_emulation();

}  // namespace cabm::detail
