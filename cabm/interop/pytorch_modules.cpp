#include "cabm/interop/pytorch_modules.h"

#include "cabm/core/checked.h"
#include "cabm/interop/state_dict.h"

#include <set>

namespace cabm {

bool MetadataReader::get_bool(const std::string& key, bool fallback) const {
  const std::string* value = file.find_metadata(key);
  if (!value) return fallback;
  if (*value == "true" || *value == "True" || *value == "1") return true;
  if (*value == "false" || *value == "False" || *value == "0") return false;
  throw Error(fmt::format("{}: metadata '{}' is '{}', expected true or false", file.path, key, *value));
}

int64_t MetadataReader::get_int(const std::string& key, int64_t min, int64_t max) const {
  const std::string* value = file.find_metadata(key);
  if (!value) throw Error(fmt::format("{}: metadata '{}' is required", file.path, key));
  return parse_integer(*value, min, max, fmt::format("{}: metadata '{}'", file.path, key));
}

float MetadataReader::get_float(const std::string& key, float fallback, const RealRange& range) const {
  const std::string* value = file.find_metadata(key);
  if (!value) return fallback;
  return static_cast<float>(parse_real(*value, range, fmt::format("{}: metadata '{}'", file.path, key)));
}

Activation MetadataReader::get_activation(const std::string& key, Activation fallback) const {
  const std::string* value = file.find_metadata(key);
  if (!value) return fallback;
  if (*value == "relu") return Activation::kRelu;
  if (*value == "gelu") return Activation::kGelu;
  throw Error(fmt::format("{}: metadata '{}' is '{}', expected relu or gelu", file.path, key, *value));
}

namespace {

const Tensor& require_matrix(const SafetensorsFile& file, const std::string& key) {
  const Tensor& t = file.get(key);
  if (t.dim() != 2 || t.size(0) == 0 || t.size(1) == 0)
    throw Error(fmt::format("{}: tensor '{}' has shape {}, expected a non-empty matrix", file.path, key,
                            shape_str(t.shape())));
  return t;
}

void reject_unsupported(const SafetensorsFile& file, const std::string& prefix) {
  for (const char* name : {"bias_k", "bias_v"})
    if (file.find(prefix + name))
      throw Error(fmt::format("{}: '{}{}' found: add_bias_kv is not supported", file.path, prefix, name));
}

}  // namespace

MultiHeadAttention multi_head_attention_from_state_dict(const SafetensorsFile& file, const std::string& prefix,
                                                        int64_t nhead) {
  reject_unsupported(file, prefix);
  MultiHeadAttentionConfig config;
  config.num_heads = nhead;
  config.bias = file.find(prefix + "in_proj_bias") != nullptr;
  if (file.find(prefix + "in_proj_weight")) {
    const Tensor& w = require_matrix(file, prefix + "in_proj_weight");
    if (w.size(0) != 3 * w.size(1))
      throw Error(fmt::format("{}: tensor '{}in_proj_weight' has shape {}, expected [3E, E]", file.path, prefix,
                              shape_str(w.shape())));
    config.embed_dim = w.size(1);
  } else {
    config.embed_dim = require_matrix(file, prefix + "q_proj_weight").size(0);
    config.kdim = require_matrix(file, prefix + "k_proj_weight").size(1);
    config.vdim = require_matrix(file, prefix + "v_proj_weight").size(1);
  }
  if (nhead <= 0) throw Error(fmt::format("{}: metadata 'nhead' must be positive, got {}", file.path, nhead));
  if (config.embed_dim % nhead != 0)
    throw Error(fmt::format("{}: embed_dim {} is not divisible by nhead {}", file.path, config.embed_dim, nhead));
  if ((file.find(prefix + "out_proj.bias") != nullptr) != config.bias)
    throw Error(fmt::format("{}: '{}in_proj_bias' and '{}out_proj.bias' must be both present or both absent",
                            file.path, prefix, prefix));
  MultiHeadAttention mha = make_multi_head_attention(config);
  load_parameters(file, named_parameters(mha), prefix, /*allow_unexpected=*/false);
  return mha;
}

namespace {
EncoderLayerConfig encoder_layer_config(const SafetensorsFile& file, const std::string& prefix) {
  const MetadataReader meta{file};
  EncoderLayerConfig config;
  const Tensor& in_proj = require_matrix(file, prefix + "self_attn.in_proj_weight");
  config.d_model = in_proj.size(1);
  config.dim_feedforward = require_matrix(file, prefix + "linear1.weight").size(0);
  config.nhead = meta.get_int("nhead", 1, config.d_model);
  if (config.d_model % config.nhead != 0)
    throw Error(fmt::format("{}: d_model {} is not divisible by nhead {}", file.path, config.d_model, config.nhead));
  config.dropout = 0.0f;  // eval mode
  config.activation = meta.get_activation("activation", Activation::kRelu);
  config.norm_first = meta.get_bool("norm_first", false);
  config.layer_norm_eps = meta.get_float("layer_norm_eps", 1e-5f, {0, 1e30, true, false});
  return config;
}
}  // namespace

EncoderLayer encoder_layer_from_state_dict(const SafetensorsFile& file, const std::string& prefix) {
  EncoderLayer layer = make_encoder_layer(encoder_layer_config(file, prefix));
  reject_unsupported(file, prefix + "self_attn.");
  load_parameters(file, named_parameters(layer), prefix, /*allow_unexpected=*/false);
  return layer;
}

Encoder encoder_from_state_dict(const SafetensorsFile& file) {
  int64_t num_layers = 0;
  while (file.find("layers." + std::to_string(num_layers) + ".self_attn.in_proj_weight")) ++num_layers;
  if (num_layers == 0) throw Error(fmt::format("{}: missing tensor 'layers.0.self_attn.in_proj_weight'", file.path));
  const EncoderLayerConfig config = encoder_layer_config(file, "layers.0.");
  Encoder encoder = make_encoder(config, num_layers, file.find("norm.weight") != nullptr);
  load_parameters(file, named_parameters(encoder), "", /*allow_unexpected=*/false);
  return encoder;
}

Mask mask_from_pytorch_attn_mask(const Tensor& attn_mask, int64_t B, int64_t H, int64_t N, int64_t M,
                                 const std::string& what) {
  Tensor mask = attn_mask;
  if (mask.dim() == 3) {
    if (mask.size(0) != B * H || mask.size(1) != N || mask.size(2) != M)
      throw Error(fmt::format("{} has shape {}, expected [{}, {}] or [{}, {}, {}]", what, shape_str(mask.shape()), N,
                              M, B * H, N, M));
    mask = mask.view({B, H, N, M});
  } else if (mask.dim() != 2 || mask.size(0) != N || mask.size(1) != M) {
    throw Error(fmt::format("{} has shape {}, expected [{}, {}] or [{}, {}, {}]", what, shape_str(mask.shape()), N, M,
                            B * H, N, M));
  }
  if (mask.dtype() == DType::F32) return Mask::additive(mask);
  if (mask.dtype() != DType::BOOL)
    throw Error(fmt::format("{} has dtype {}, expected BOOL or F32", what, dtype_name(mask.dtype())));
  // PyTorch: True = blocked. cabm: true = may attend.
  Tensor allowed = Tensor::empty(mask.shape(), DType::BOOL);
  const uint8_t* src = mask.data<uint8_t>();
  uint8_t* dst = allowed.data<uint8_t>();
  for (int64_t i = 0; i < mask.numel(); ++i) dst[i] = src[i] ? 0 : 1;
  return Mask::allow(allowed);
}

Mask mask_from_pytorch_key_padding(const Tensor& key_padding_mask, int64_t B, int64_t M, const std::string& what) {
  const Tensor& kpm = key_padding_mask;
  if (kpm.dim() != 2 || kpm.size(0) != B || kpm.size(1) != M)
    throw Error(fmt::format("{} has shape {}, expected [{}, {}]", what, shape_str(kpm.shape()), B, M));
  if (kpm.dtype() == DType::F32) return Mask::additive(kpm.view({B, 1, 1, M}));
  if (kpm.dtype() != DType::BOOL)
    throw Error(fmt::format("{} has dtype {}, expected BOOL or F32", what, dtype_name(kpm.dtype())));
  // Padding that forms a suffix becomes lengths (the fast kernels skip it); anything else an
  // explicit allow mask.
  const uint8_t* pad = kpm.data<uint8_t>();
  std::vector<int64_t> lengths(B);
  bool suffix = true;
  for (int64_t b = 0; b < B && suffix; ++b) {
    int64_t len = 0;
    while (len < M && !pad[b * M + len]) ++len;
    for (int64_t j = len; j < M; ++j) suffix = suffix && pad[b * M + j];
    lengths[b] = len;
  }
  if (suffix) return Mask::key_padding(lengths);
  Tensor allowed = Tensor::empty({B, 1, 1, M}, DType::BOOL);
  uint8_t* dst = allowed.data<uint8_t>();
  for (int64_t i = 0; i < B * M; ++i) dst[i] = pad[i] ? 0 : 1;
  return Mask::allow(allowed);
}

}  // namespace cabm
