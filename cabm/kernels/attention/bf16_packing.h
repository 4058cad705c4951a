// The packed bf16 K and V layouts that the vdpbf16ps and AMX attention kernels share (internal
// to cabm/kernels/: included by attention/flash_bf16.cpp, flash_bf16_backward.cpp and
// flash_amx.cpp):
//   K [Mp/16][dp/2][16][2]  blocks of 16 keys, then pairs of head-dim elements (one zmm of
//                           16 keys × 2 dims; for AMX, the VNNI layout of a B tile)
//   V [Mp/2][dvp][2]        pairs of keys, then columns
// dp, dvp: d and dv rounded up (even at least); Mp: M rounded up to 16 (or more); the padding
// is zero. Also the end of a query tile, which both forwards share (write_tile_output).
#pragma once

#include "cabm/core/error.h"
#include "cabm/core/tensor.h"
#include "cabm/kernels/attention/head_rows.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace cabm::detail {

inline constexpr int64_t kPackedKeyBlock = 16;

// What computes the block products on these layouts, for the forward and the backward alike:
// vdpbf16ps (path avx512_bf16), AMX tiles (amx_bf16, only where bf16_amx_active()) or the scalar
// model of the tiles (amx_bf16_emulated, any CPU with AVX512_BF16; attention/amx_tiles.h).
enum class Bf16Products { kVdpbf16ps, kAmxTiles, kAmxEmulated };

// Element (key j, dim c) in packed K, and (key j, column c) in packed V.
inline int64_t packed_k_index(int64_t j, int64_t c, int64_t dp) {
  return ((j / kPackedKeyBlock) * (dp / 2) + c / 2) * (kPackedKeyBlock * 2) + (j % kPackedKeyBlock) * 2 + (c & 1);
}
inline int64_t packed_v_index(int64_t j, int64_t c, int64_t dvp) {
  return ((j / 2) * dvp + c) * 2 + (j & 1);
}

// Element [b, 0, h, 0] of a BF16 [B, L, H, d] view.
inline const bf16* bf16_head_ptr(const Tensor& t, int64_t b, int64_t h) {
  return t.data<bf16>() + b * t.stride(0) + h * t.stride(2);
}

// Room for a call's packed K (nk elements) and V (nv elements), shared by the call's threads,
// 64-byte aligned (each vector load stays within one cache line) and kept by the calling thread
// for its next call: fresh pages cost about 8 µs each on the VMs measured (2 ms per MiB, 16 ms
// for K and V at N 4096, H 8, d 64, where the forward takes 150 ms). It grows to the largest size
// the thread has needed and is freed when the thread ends. Contents are unspecified.
struct PackedKV {
  bf16* k;
  bf16* v;
};
inline PackedKV packed_kv_storage(int64_t nk, int64_t nv) {
  struct Free {
    void operator()(bf16* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<bf16[], Free> storage;
  thread_local int64_t capacity = 0;
  const int64_t nk_rounded = (nk + 31) / 32 * 32;  // 32 bf16 = 64 bytes: V starts aligned too
  const int64_t need = std::max<int64_t>(nk_rounded + nv, 32);
  if (capacity < need) {
    storage.reset();
    capacity = 0;
    const size_t bytes = static_cast<size_t>((need + 31) / 32 * 64);
    storage.reset(static_cast<bf16*>(std::aligned_alloc(64, bytes)));
    CABM_CHECK(storage != nullptr, "attention_flash_bf16: out of memory allocating {} bytes for packed K and V", bytes);
    capacity = need;
  }
  return {storage.get(), storage.get() + nk_rounded};
}

// Packs rows [0, n) of a [n][cols] bf16 operand (row r at src + r·stride) as 16-row blocks of
// column pairs, [n16/16][cols2/2][16][2] (packed K's layout; what scores_avx512 reads as B), zero
// padded to n16 rows and cols2 columns (both even, n16 ≥ n, cols2 ≥ cols): one 32-bit pair at a time.
inline void pack_row_blocks(const bf16* src, int64_t stride, int64_t n, int64_t cols, int64_t n16, int64_t cols2,
                            bf16* out) {
  static_assert(sizeof(bf16) == 2);
  std::fill_n(out, n16 * cols2, bf16{0});
  const int64_t pairs = cols2 / 2, whole = cols / 2;
  for (int64_t r = 0; r < n; ++r) {
    const bf16* row = src + r * stride;
    bf16* block = out + (r / kPackedKeyBlock) * pairs * kPackedKeyBlock * 2 + (r % kPackedKeyBlock) * 2;
    for (int64_t c = 0; c < whole; ++c) std::memcpy(block + c * kPackedKeyBlock * 2, row + 2 * c, 4);
    if (cols % 2) block[whole * kPackedKeyBlock * 2] = row[2 * whole];  // the last pair: (x, 0)
  }
}

// Packs key/value head (b, h) of k [B, M, Hkv, d] and v [B, M, Hkv, dv] into kp [Mp · dp] and
// vp [Mp · dvp]: once per key/value head, whatever number of query heads read it (GQA).
// pack_k: pack_row_blocks, or a function with its contract (pack_row_blocks_avx512).
using RowBlockPacker = void (*)(const bf16* src, int64_t stride, int64_t n, int64_t cols, int64_t n16, int64_t cols2,
                                bf16* out);
inline void pack_kv_head(const Tensor& k, const Tensor& v, int64_t b, int64_t h, int64_t Mp, int64_t dp, int64_t dvp,
                         bf16* kp, bf16* vp, RowBlockPacker pack_k = pack_row_blocks) {
  const int64_t M = k.size(1), d = k.size(3), dv = v.size(3);
  pack_k(bf16_head_ptr(k, b, h), k.stride(1), M, d, Mp, dp, kp);
  std::fill_n(vp, Mp * dvp, bf16{0});
  const bf16* vs = bf16_head_ptr(v, b, h);
  const int64_t stride = v.stride(1);
  // Keys j and j + 1 of column c as one 32-bit word, key j in the low half (at the address
  // packed_v_index gives it, on a little-endian CPU): a loop the compiler vectorizes.
  static_assert(std::endian::native == std::endian::little);
  const auto pack_pair = [dv](const bf16* v0, const bf16* v1, bf16* out) {
    for (int64_t c = 0; c < dv; ++c) {
      const uint32_t pair = uint32_t{v0[c].bits} | uint32_t{v1[c].bits} << 16;
      std::memcpy(out + 2 * c, &pair, 4);
    }
  };
  for (int64_t j = 0; j + 1 < M; j += 2)
    pack_pair(vs + j * stride, vs + (j + 1) * stride, vp + packed_v_index(j, 0, dvp));
  if (M % 2) {  // the last key's pair partner is zero padding
    const bf16* last = vs + (M - 1) * stride;
    for (int64_t c = 0; c < dv; ++c) vp[packed_v_index(M - 1, c, dvp)] = last[c];
  }
}

// A query tile's running softmax state: unnormalised output rows o (ldo floats apart), their
// denominators l and base-2 maxima m.
struct TileState {
  const float* o;
  int64_t ldo;
  const float* l;
  const float* m;
};

// Divides each of the tile's ni rows by its denominator into out [B, N, H, dv] (rows i0 … of
// head (b, h)) and writes its natural log-sum-exp to lse_rows (when not null); fully masked rows
// (l = 0) give 0 and lse −inf.
inline void write_tile_output(const Tensor& out, int64_t b, int64_t h, int64_t i0, int64_t ni, int64_t dv,
                              const TileState& t, float* lse_rows) {
  constexpr float kLn2 = 0.6931471805599453f;
  const int64_t out_stride = out.stride(1);
  float* rows = out.data<float>() + b * out.stride(0) + h * out.stride(2);
  for (int64_t r = 0; r < ni; ++r) {
    float* orow = rows + (i0 + r) * out_stride;
    const float lr = t.l[r];
    if (lr == 0.0f) {
      std::fill_n(orow, dv, 0.0f);
    } else {
      const float inv = 1.0f / lr;
      for (int64_t c = 0; c < dv; ++c) orow[c] = t.o[r * t.ldo + c] * inv;
    }
    if (lse_rows) lse_rows[r] = lr > 0.0f ? (t.m[r] + std::log2(lr)) * kLn2 : -INFINITY;
  }
}

}  // namespace cabm::detail
