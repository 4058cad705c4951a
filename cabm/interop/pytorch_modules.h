// The boundary with PyTorch: build cabm modules from a PyTorch state_dict (sizes read from the
// tensor shapes, the rest from string metadata), and convert PyTorch's mask conventions into
// cabm's explicit Mask type. This is the only place that knows PyTorch's polarities:
//   attn_mask / mask:  bool True = blocked (may NOT attend); float = added to the scores
//   key_padding_mask:  bool True = padding (blocked);           float = added to the scores
#pragma once

#include "cabm/core/checked.h"
#include "cabm/io/safetensors.h"
#include "cabm/kernels/attention/mask.h"
#include "cabm/nn/encoder.h"

#include <map>
#include <string>

namespace cabm {

// Typed access to a safetensors file's `__metadata__` strings; errors name the file and key.
struct MetadataReader {
  const SafetensorsFile& file;

  bool get_bool(const std::string& key, bool fallback) const;  // true/false (True/False, 1/0)
  // Required; an integer in [min, max] (cabm/core/checked.h: "1.5", "2^63" are errors).
  int64_t get_int(const std::string& key, int64_t min = 1, int64_t max = int64_t{1} << 31) const;
  // A finite number in `range` ("nan" is an error).
  float get_float(const std::string& key, float fallback, const RealRange& range = {-1e30, 1e30}) const;
  Activation get_activation(const std::string& key, Activation fallback) const;  // relu | gelu
};

// nn.MultiheadAttention state_dict (keys under `prefix`). nhead comes from the caller.
MultiHeadAttention multi_head_attention_from_state_dict(const SafetensorsFile& file, const std::string& prefix,
                                                        int64_t nhead);
// nn.TransformerEncoderLayer state_dict; metadata: nhead, activation, norm_first, layer_norm_eps.
EncoderLayer encoder_layer_from_state_dict(const SafetensorsFile& file, const std::string& prefix);
// nn.TransformerEncoder state_dict: layers.{i}.… and an optional final norm.…
Encoder encoder_from_state_dict(const SafetensorsFile& file);

// attn_mask [N, M] or [B·H, N, M] (bool or float) → Mask for [B, H, N, M]. `what` names the
// tensor in error messages.
Mask mask_from_pytorch_attn_mask(const Tensor& attn_mask, int64_t B, int64_t H, int64_t N, int64_t M,
                                 const std::string& what);
// key_padding_mask [B, M] (bool True = padding, or float added) → Mask.
Mask mask_from_pytorch_key_padding(const Tensor& key_padding_mask, int64_t B, int64_t M, const std::string& what);

}  // namespace cabm
