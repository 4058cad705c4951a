// Rotary position embedding (RoPE; Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary
// Position Embedding"), applied once per token as a pass over Q and K before attention, and its
// backward (the rotation's transpose) over dQ and dK.
//
// For the pair (x_a, x_b) of head-dim elements number p (0 <= p < rope_dim / 2), at position t:
//   angle = t · θ^(−2p / rope_dim),   x_a' = x_a cos − x_b sin,   x_b' = x_b cos + x_a sin.
// Layouts: kNeox pairs element p with p + rope_dim/2 ("rotate half": GPT-NeoX, LLaMA, Hugging
// Face's apply_rotary_pos_emb); kGptj pairs 2p with 2p + 1 (GPT-J, the paper's interleaving).
// Elements from rope_dim on are left as they are (partial rotary, GPT-NeoX's rotary_pct).
//
// Numerics follow Hugging Face's float32 computation: inv_freq_p = 1 / θ^(2p / rope_dim) rounded
// to float, angle = float(t) · inv_freq_p rounded to float, then cos and sin of that float angle
// (correctly rounded here). At large positions the float angle differs from the exact one by
// up to t·2^-24 rad; matching the float angle is what makes cabm agree with the models' code.
#pragma once

#include "cabm/core/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace cabm {

enum class RopeStyle { kNone, kNeox, kGptj };

struct RopeOptions {
  RopeStyle style = RopeStyle::kNone;
  float theta = 10000.0f;  // base θ > 0
  int64_t rope_dim = 0;    // rotated head-dim elements: even, <= d; 0 = all of d
};

RopeStyle parse_rope_style(const std::string& name);  // "none" | "neox" | "gptj", else cabm::Error
const char* rope_style_name(RopeStyle style);

// The rotated element count for head dim d (rope_dim, or d when 0); throws cabm::Error when it
// is odd, negative or above d, or theta is not a finite positive number.
int64_t rope_resolved_dim(const RopeOptions& options, int64_t d);

// x: F32 [B, L, H, d], any strides with a unit last stride; rotated in place. positions: [L].
void rope_forward(const Tensor& x, const std::vector<int64_t>& positions, const RopeOptions& options);

// dx: F32 [B, L, H, d], the gradient with respect to rope_forward's output, rotated in place
// into the gradient with respect to its input (the inverse rotation: angle → −angle).
void rope_backward(const Tensor& dx, const std::vector<int64_t>& positions, const RopeOptions& options);

}  // namespace cabm
