// What `cabm forward` runs: a PyTorch TransformerEncoder, TransformerEncoderLayer or
// MultiheadAttention state_dict (pytorch_modules.h) on the inputs of a second safetensors file,
// with PyTorch's mask conventions and output names (the contract in DESIGN.md and
// docs/forward.md).
#pragma once

#include "cabm/io/safetensors.h"
#include "cabm/nn/mixed_precision.h"

#include <map>
#include <string>

namespace cabm {

// The module is named by the model's metadata 'module' or, without it, by its key names.
// Inputs: src (+ mask, src_key_padding_mask, metadata is_causal) for an encoder or a layer;
// query, key, value (+ attn_mask, key_padding_mask, metadata need_weights,
// average_attn_weights, is_causal) for attention. An input tensor or metadata key the module
// does not take is an error, as is every malformed shape or value (cabm::Error naming the
// file). Returns "output" (and "attn_weights" when asked for); where PyTorch gives NaN for a
// fully masked query row, these rows are 0.
std::map<std::string, Tensor> run_pytorch_module(const SafetensorsFile& model, const SafetensorsFile& input,
                                                 Precision precision = Precision::kFp32);

}  // namespace cabm
