// Soft-capping and ALiBi in the tiled fp32 attention kernel (attention/flash.cpp): the score
// epilogue that runs on a tile of block products before the mask is added (its vector code, per
// instruction set: attention/score_epilogue.h; here what does not depend on the set). Internal to
// kernels/.
//
// The score of query i and key j, as the reference defines it (attention/reference.h):
//   t = scale · q_i·k_j,   t → c·tanh(t / c) (soft-capping, Gemma 2),
//   s = t − slope_h·|pos_q(i) − pos_k(j)| (ALiBi, Press et al. 2022) + the mask's additive parts.
// The kernel keeps scores in base 2 (s · log2 e, so that softmax takes exp2). Without soft-capping
// the product's operand is pre-multiplied by scale · log2 e, as for plain attention; with it, by
// scale / c, so that the product is the argument u = t / c of tanh and the epilogue maps it to
// (c · log2 e) · tanh(u). The ALiBi bias is computed per tile from positions (never an N×M
// tensor): the positions of a tile are converted to floats relative to one position of the
// tile, exact while positions within a tile and its partner lie less than 2^24 apart, so that
// |Δpos| is the same float as the reference's.
//
// Backward: dT = dS · (1 − tanh²(u)) (the epilogue leaves 1 − tanh² per element), and the bias has
// no input, so it only enters the recomputed scores.
#pragma once

#include "cabm/kernels/attention/reference.h"

#include <cstdint>

namespace cabm {

// The score variants of one call, resolved from AttentionOptions (whose vectors outlive the call).
struct ScoreVariants {
  float softcap = 0.0f;                   // c; 0 = off
  const float* slopes = nullptr;          // ALiBi slopes [H], or null: off
  const int64_t* q_positions = nullptr;   // [N], or null: M − N + i
  const int64_t* k_positions = nullptr;   // [M], or null: j
  int64_t N = 0, M = 0;

  bool any() const { return softcap > 0.0f || slopes != nullptr; }
  int64_t q_position(int64_t i) const { return q_positions ? q_positions[i] : M - N + i; }
  int64_t k_position(int64_t j) const { return k_positions ? k_positions[j] : j; }
  // The factor of the products' packed operand (Q in the forward, Kᵀ in the backward).
  float operand_scale(float scale) const { return softcap > 0.0f ? scale / softcap : scale * 1.4426950408889634f; }
};

inline ScoreVariants score_variants(const AttentionOptions& options, int64_t N, int64_t M) {
  ScoreVariants v;
  v.softcap = options.softcap;
  v.slopes = options.alibi_slopes.empty() ? nullptr : options.alibi_slopes.data();
  v.q_positions = options.q_positions.empty() ? nullptr : options.q_positions.data();
  v.k_positions = options.k_positions.empty() ? nullptr : options.k_positions.data();
  v.N = N, v.M = M;
  return v;
}

// out[x] = pos(first + x) − base as a float for x < count, 0 for count <= x < padded (lanes that
// hold no query or key: finite, never used).
inline void position_offsets(const ScoreVariants& v, bool queries, int64_t first, int64_t count, int64_t padded,
                             int64_t base, float* out) {
  for (int64_t x = 0; x < count; ++x)
    out[x] = static_cast<float>((queries ? v.q_position(first + x) : v.k_position(first + x)) - base);
  for (int64_t x = count; x < padded; ++x) out[x] = 0.0f;
}

}  // namespace cabm
