// Mixed-precision (bf16) modules: the split PyTorch's autocast makes, on the CPU.
//
//   bf16 (operands of products)          fp32
//   ------------------------------       ---------------------------------------------------
//   x·Wᵀ, dy·W, dyᵀ·x of every Linear     master weights, AdamW state, gradients (dW += in fp32)
//   (attention projections, FFN, head)    biases, LayerNorm, GELU/ReLU, residuals, dropout
//   Q, K, V, P·V in attention             softmax statistics (max, sum, lse), loss, reductions
//   the KV cache (decoding)               embeddings (a lookup, no product), every output
//
// A module is switched to bf16 by set_precision, which gives each weight matrix a bf16 copy (BF16,
// or F32 holding the bf16 values where gemm_bf16 widens its operands anyway: rounded_dtype() in
// cabm/nn/bf16_util.h) (Linear::weight_bf16, MultiHeadAttention::in_proj_weight_bf16; for the causal LM also the
// output matrix, tied or not, in head.weight_bf16). The copies are derived state: the fp32
// weights stay the parameters (optimizer, checkpoints, named_parameters), and whoever changes
// them calls refresh_bf16_weights — the trainers after each optimizer step and after loading.
// No loss scaling: bf16 has fp32's exponent range, so gradients do not underflow as in fp16.
#pragma once

#include "cabm/nn/causal_lm.h"
#include "cabm/nn/classifier.h"
#include "cabm/nn/encoder.h"

#include <string>

namespace cabm {

enum class Precision { kFp32, kBf16 };

std::string precision_name(Precision precision);     // "fp32" | "bf16"
Precision parse_precision(const std::string& name);  // cabm::Error for anything else

// kBf16 allocates the bf16 weight copies (once) and fills them from the fp32 weights; kFp32
// drops them (the modules run their fp32 paths again).
void set_precision(Linear& layer, Precision precision);
void set_precision(MultiHeadAttention& mha, Precision precision);
void set_precision(EncoderLayer& layer, Precision precision);
void set_precision(Encoder& encoder, Precision precision);
void set_precision(CausalLM& model, Precision precision);
void set_precision(Classifier& model, Precision precision);

Precision precision_of(const MultiHeadAttention& mha);
Precision precision_of(const CausalLM& model);
Precision precision_of(const Classifier& model);

// Re-rounds every bf16 copy from its fp32 weight (no-op for fp32 modules). The copies are
// handles to the module's buffers, so a const module can be refreshed.
void refresh_bf16_weights(const Linear& layer);
void refresh_bf16_weights(const MultiHeadAttention& mha);
void refresh_bf16_weights(const EncoderLayer& layer);
void refresh_bf16_weights(const Encoder& encoder);
void refresh_bf16_weights(const CausalLM& model);
void refresh_bf16_weights(const Classifier& model);

}  // namespace cabm
