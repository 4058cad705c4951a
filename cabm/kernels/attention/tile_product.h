// The one micro-kernel of the tiled fp32 attention, and the tile product built on it. Internal to
// kernels/: included by the tile loops (attention/flash_{forward,backward}_body.h), once per
// instruction set, in the namespace of that set's simd flavour (CABM_SIMD_NS, simd.h).
#pragma once

#include "cabm/kernels/simd.h"
#include "cabm/kernels/unroll.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

namespace cabm::CABM_SIMD_NS::tile {

namespace simd = ::cabm::CABM_SIMD_NS;
using simd::kWidth;
using simd::Vec;

// The one micro-kernel. Every block product of the forward and backward passes has the form
//
//   C[r][l] (+)= Σ_k A(r, k) · B[k][l]      r < rows, l < lanes (a multiple of kWidth)
//
// where A is read one element at a time and broadcast (so it may be any strided view: a head of
// q, k, v, dout in their natural [.., N, H, d] layout, or a tile of ours read transposed), and B
// and C are our own packed tiles, read and written as whole vectors. A register block of
// MR rows × NV vectors of C stays in registers for the whole k loop: per k, NV vector loads of B,
// MR broadcasts of A, MR·NV fused multiply-adds.
//   forward   Sᵀ = K · Qᵀ        (rows keys,    lanes queries, k over d)
//             Oᵀ += Vᵀ · Pᵀ      (rows d,       lanes queries, k over keys)
//   backward  S = Q · Kᵀ, dP = dO · Vᵀ   (rows queries, lanes keys, k over d)
//             dVᵀ += dOᵀ · P, dKᵀ += Qᵀ · dS   (rows d, lanes keys, k over queries)
//             dQ += dS · K       (rows queries, lanes d, k over keys)

#if CABM_SIMD_LEVEL == 2
inline constexpr int kMR = 6, kNV = 4;  // 24 accumulators + 4 B vectors + 1 broadcast of 32 zmm
#elif CABM_SIMD_LEVEL == 1
inline constexpr int kMR = 6, kNV = 2;  // 12 accumulators + 2 B vectors + 1 broadcast of 16 ymm
#else
inline constexpr int kMR = 4, kNV = 2;
#endif

// C = A·B;  C += A·B;  C = alpha[l]·C + A·B;  C = A·B and lane_max[l] = max(lane_max[l], max_r C[r][l]).
enum class Accum { kOverwrite, kAdd, kScaleAdd, kOverwriteMax };

// Left alone, GCC folds the B loads into the FMAs' memory operands for some block shapes (MR·NV
// loads instead of NV per k), which saturates the load ports and halves the speed of the tails.
inline void keep_in_register(Vec& x) {
#if CABM_SIMD_LEVEL == 2
  __asm__("" : "+v"(x.v));
#elif CABM_SIMD_LEVEL == 1
  __asm__("" : "+x"(x.v));
#else
  (void)x;
#endif
}

struct ScalarOperand {  // A(r, k) = data[r · row_stride + k · k_stride]
  const float* data;
  int64_t row_stride, k_stride;
};
struct VectorOperand {  // B[k][l] = data[k · ld + l]
  const float* data;
  int64_t ld;
};
struct TileRef {  // C[r][l] = data[r · ld + l]
  float* data;
  int64_t ld;
};

// lanes: alpha (kScaleAdd, read) or lane_max (kOverwriteMax, read and written), else unused.
// The operands come by reference: passed by value, the 24-byte ScalarOperand went on the stack,
// and GCC copied it there with a 16-byte load of two 8-byte stores just made, which the store
// buffer cannot forward (about 2% of the AVX2 forward's time on a Zen 4, perf).
template <int MR, int NV, Accum kMode>
void block_kernel(int64_t K, const ScalarOperand& a, const VectorOperand& b, const TileRef& c_ref, float* lanes) {
  // A local copy: the vector stores below may alias anything, and through the reference GCC
  // reloaded c's pointer and stride from memory before every one of them.
  const TileRef c = c_ref;
  Vec acc[MR][NV];
  CABM_UNROLL
  for (int r = 0; r < MR; ++r) {
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) {
      if constexpr (kMode == Accum::kOverwrite || kMode == Accum::kOverwriteMax) {
        acc[r][v] = simd::zero();
      } else {
        acc[r][v] = simd::load(c.data + r * c.ld + v * kWidth);
        if constexpr (kMode == Accum::kScaleAdd) acc[r][v] = simd::mul(acc[r][v], simd::load(lanes + v * kWidth));
      }
    }
  }
  const float* ap = a.data;
  const float* bp = b.data;
  for (int64_t k = 0; k < K; ++k, ap += a.k_stride, bp += b.ld) {
    Vec bv[NV];
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) {
      bv[v] = simd::load(bp + v * kWidth);
      keep_in_register(bv[v]);
    }
    CABM_UNROLL
    for (int r = 0; r < MR; ++r) {
      const Vec ar = simd::broadcast(ap + r * a.row_stride);
      CABM_UNROLL
      for (int v = 0; v < NV; ++v) acc[r][v] = simd::fma(ar, bv[v], acc[r][v]);
    }
  }
  CABM_UNROLL
  for (int r = 0; r < MR; ++r) {
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) simd::store(c.data + r * c.ld + v * kWidth, acc[r][v]);
  }
  if constexpr (kMode == Accum::kOverwriteMax) {
    CABM_UNROLL
    for (int v = 0; v < NV; ++v) {
      Vec m = simd::load(lanes + v * kWidth);
      CABM_UNROLL
      for (int r = 0; r < MR; ++r) m = simd::max(m, acc[r][v]);
      simd::store(lanes + v * kWidth, m);
    }
  }
}

using BlockKernel = void (*)(int64_t, const ScalarOperand&, const VectorOperand&, const TileRef&, float*);

template <Accum kMode, int MR, int... NVs>
constexpr std::array<BlockKernel, kNV> kernel_row(std::integer_sequence<int, NVs...>) {
  return {&block_kernel<MR, NVs + 1, kMode>...};
}
template <Accum kMode, int... MRs>
constexpr std::array<std::array<BlockKernel, kNV>, kMR> kernel_table(std::integer_sequence<int, MRs...>) {
  return {kernel_row<kMode, MRs + 1>(std::make_integer_sequence<int, kNV>())...};
}
// kKernels[mode][mr − 1][nv − 1]
inline constexpr std::array<std::array<std::array<BlockKernel, kNV>, kMR>, 4> kKernels = {
    kernel_table<Accum::kOverwrite>(std::make_integer_sequence<int, kMR>()),
    kernel_table<Accum::kAdd>(std::make_integer_sequence<int, kMR>()),
    kernel_table<Accum::kScaleAdd>(std::make_integer_sequence<int, kMR>()),
    kernel_table<Accum::kOverwriteMax>(std::make_integer_sequence<int, kMR>())};

// C[rows][lanes] (+)= A[rows][K] · B[K][lanes], blocked over the micro-kernel; `lanes_aux` holds
// one value per lane: alpha for kScaleAdd, the running maximum for kOverwriteMax.
inline void tile_product(int64_t rows, int64_t lanes, int64_t K, ScalarOperand a, VectorOperand b, TileRef c, Accum mode,
                  float* lanes_aux = nullptr) {
  const auto& table = kKernels[static_cast<int>(mode)];
  for (int64_t l0 = 0; l0 < lanes; l0 += kNV * kWidth) {
    const int64_t nv = std::min<int64_t>(kNV, (lanes - l0) / kWidth);
    for (int64_t r0 = 0; r0 < rows; r0 += kMR) {
      const int64_t mr = std::min<int64_t>(kMR, rows - r0);
      const ScalarOperand ab{a.data + r0 * a.row_stride, a.row_stride, a.k_stride};
      const VectorOperand bb{b.data + l0, b.ld};
      const TileRef cb{c.data + r0 * c.ld + l0, c.ld};
      table[mr - 1][nv - 1](K, ab, bb, cb, lanes_aux ? lanes_aux + l0 : nullptr);
    }
  }
}

}  // namespace cabm::CABM_SIMD_NS::tile
