// Inference through post-norm encoder layers (eval mode, nothing kept for a backward pass):
//   h = LN1(x + (attn_heads(x) W_Oᵀ + b_O));   x ← LN2(h + (act(h W1ᵀ + b1) W2ᵀ + b2))
// the same modules, the same order of operations and (up to the products' rounding) the same
// numbers as encoder_layer_forward, with less memory traffic:
// - one workspace serves every layer of a model, and the output overwrites the input, so a model
//   touches the memory of one layer, not of L (fresh pages cost about 8 µs per 4 KiB on the VMs
//   cabm is benchmarked on, and every buffer is sized by the first, longest batch);
// - out_proj and linear2 run without their bias; the bias, the residual add and the LayerNorm
//   after them are one pass (add_layernorm_forward), and linear1's bias and activation another
//   (bias_activation_inplace), in place in the product's output.
#pragma once

#include "cabm/nn/encoder_layer.h"

namespace cabm {

struct EncoderInferenceWorkspace {
  MultiHeadAttentionCache attn;  // Q, K, V and the merged heads
  Tensor h;                      // [B·N, E]: LN1's output, the second sublayer's residual
  Tensor branch;                 // [B·N, E]: out_proj's and linear2's products, before their bias
  Tensor hidden;                 // [B·N, F]: act(linear1)
};

// The feed-forward activation: the layer's own, or GELU's tanh approximation (transformers'
// gelu_new), which the trained modules do not have.
enum class InferenceActivation { kLayer, kGeluTanh };

// x: [B, N, E] contiguous, overwritten with the layer's output. Post-norm layers only; dropout
// is off (eval).
void encoder_layer_infer(const EncoderLayer& layer, const Tensor& x, const Mask& mask, EncoderInferenceWorkspace& ws,
                         InferenceActivation activation = InferenceActivation::kLayer);

}  // namespace cabm
