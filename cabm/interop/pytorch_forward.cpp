#include "cabm/interop/pytorch_forward.h"

#include "cabm/interop/pytorch_modules.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace cabm {

namespace {

enum class ModuleKind { kEncoder, kEncoderLayer, kMultiheadAttention };

ModuleKind module_kind(const SafetensorsFile& model) {
  const std::string* module = model.find_metadata("module");
  if (module) {
    if (*module == "TransformerEncoder") return ModuleKind::kEncoder;
    if (*module == "TransformerEncoderLayer") return ModuleKind::kEncoderLayer;
    if (*module == "MultiheadAttention") return ModuleKind::kMultiheadAttention;
    throw Error(fmt::format("{}: metadata 'module' is '{}', expected TransformerEncoder, TransformerEncoderLayer or "
                            "MultiheadAttention",
                            model.path, *module));
  }
  // Without the metadata, the key names tell.
  if (model.find("layers.0.self_attn.in_proj_weight")) return ModuleKind::kEncoder;
  if (model.find("self_attn.in_proj_weight")) return ModuleKind::kEncoderLayer;
  if (model.find("in_proj_weight") || model.find("q_proj_weight")) return ModuleKind::kMultiheadAttention;
  throw Error(fmt::format("{}: cannot tell the module: set metadata 'module' (TransformerEncoder, "
                          "TransformerEncoderLayer or MultiheadAttention)",
                          model.path));
}

// Every tensor and metadata key of the input must be one the module takes: another module's
// mask name (an encoder given MultiheadAttention's attn_mask) or a misspelling would otherwise
// be ignored, and the module run unmasked with exit status 0. "format" is the safetensors
// convention ({"format": "pt"}) that Hugging Face tools write into every file.
void check_input_names(const SafetensorsFile& in, const std::string& module, const std::vector<std::string>& tensors,
                       const std::vector<std::string>& metadata) {
  const auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
    return out;
  };
  for (const auto& [name, tensor] : in.tensors)
    if (std::find(tensors.begin(), tensors.end(), name) == tensors.end())
      throw Error(fmt::format("{}: unexpected tensor '{}': a {} takes {}", in.path, name, module, list(tensors)));
  for (const auto& [key, value] : in.metadata)
    if (key != "format" && std::find(metadata.begin(), metadata.end(), key) == metadata.end())
      throw Error(fmt::format("{}: unexpected metadata '{}': a {} takes {}", in.path, key, module, list(metadata)));
}

const Tensor& input_activation(const SafetensorsFile& in, const std::string& name, int64_t width) {
  const Tensor& t = in.get(name);
  if (t.dtype() != DType::F32 || t.dim() != 3 || t.size(2) != width || t.size(0) == 0 || t.size(1) == 0)
    throw Error(fmt::format("{}: tensor '{}' has {} {}, expected F32 [B, L, {}] with B, L > 0", in.path, name,
                            dtype_name(t.dtype()), shape_str(t.shape()), width));
  return t;
}

// Where PyTorch returns NaN because a query row is fully masked, cabm forward returns 0 (the
// contract). The library already gives such rows attention output 0; these helpers zero the
// rows of the module output that PyTorch's NaN reaches, so the two agree row for row.
// rows[b·N + i] != 0 marks row i of batch item b of t [B, N, X].
void zero_rows(const Tensor& t, const std::vector<uint8_t>& rows) {
  const int64_t width = t.numel() / static_cast<int64_t>(rows.size());
  float* p = t.data<float>();
  for (size_t r = 0; r < rows.size(); ++r)
    if (rows[r]) std::fill(p + static_cast<int64_t>(r) * width, p + static_cast<int64_t>(r + 1) * width, 0.0f);
}

// In PyTorch a NaN row of one layer's output is a NaN key/value row of the next layer, and
// softmax(S)·V multiplies it in (0 · NaN = NaN) for every query of that batch item.
std::vector<uint8_t> spread_over_batch_items(std::vector<uint8_t> rows, int64_t B, int64_t N) {
  for (int64_t b = 0; b < B; ++b) {
    const bool any = std::any_of(rows.begin() + b * N, rows.begin() + (b + 1) * N, [](uint8_t f) { return f != 0; });
    if (any) std::fill(rows.begin() + b * N, rows.begin() + (b + 1) * N, 1);
  }
  return rows;
}

// PyTorch's optional masks plus the is_causal flag, as one cabm Mask. PyTorch's is_causal
// masks with triu(ones(N, M), diagonal=1): top-left aligned.
Mask encoder_mask(const SafetensorsFile& in, int64_t B, int64_t H, int64_t N) {
  Mask mask;
  if (const Tensor* m = in.find("mask"))
    mask = mask & mask_from_pytorch_attn_mask(*m, B, H, N, N, in.path + ": tensor 'mask'");
  if (const Tensor* m = in.find("src_key_padding_mask"))
    mask = mask & mask_from_pytorch_key_padding(*m, B, N, in.path + ": tensor 'src_key_padding_mask'");
  if (MetadataReader{in}.get_bool("is_causal", false)) mask = mask & Mask::causal(CausalAlign::kTopLeft);
  return mask;
}

std::map<std::string, Tensor> run_encoder(const SafetensorsFile& model, const SafetensorsFile& in, bool single_layer,
                                          Precision precision) {
  check_input_names(in, single_layer ? "TransformerEncoderLayer" : "TransformerEncoder",
                    {"src", "mask", "src_key_padding_mask"}, {"is_causal"});
  std::map<std::string, Tensor> out;
  if (single_layer) {
    EncoderLayer layer = encoder_layer_from_state_dict(model, "");
    set_precision(layer, precision);
    const Tensor src = input_activation(in, "src", layer.config.d_model);
    const int64_t B = src.size(0), N = src.size(1);
    const Mask mask = encoder_mask(in, B, layer.config.nhead, N);
    EncoderLayerCache cache;
    out["output"] = encoder_layer_forward(layer, src, mask, cache);
    zero_rows(out["output"], fully_masked_query_rows(mask, B, layer.config.nhead, N, N));
  } else {
    Encoder encoder = encoder_from_state_dict(model);
    set_precision(encoder, precision);
    const EncoderLayerConfig& config = encoder.layers[0].config;
    const Tensor src = input_activation(in, "src", config.d_model);
    const int64_t B = src.size(0), N = src.size(1);
    const Mask mask = encoder_mask(in, B, config.nhead, N);
    EncoderCache cache;
    out["output"] = encoder_forward(encoder, src, mask, cache);
    std::vector<uint8_t> rows = fully_masked_query_rows(mask, B, config.nhead, N, N);
    if (encoder.layers.size() > 1) rows = spread_over_batch_items(std::move(rows), B, N);
    zero_rows(out["output"], rows);
  }
  return out;
}

std::map<std::string, Tensor> run_attention(const SafetensorsFile& model, const SafetensorsFile& in,
                                            Precision precision) {
  check_input_names(in, "MultiheadAttention", {"query", "key", "value", "attn_mask", "key_padding_mask"},
                    {"need_weights", "average_attn_weights", "is_causal"});
  const MetadataReader model_meta{model}, in_meta{in};
  MultiHeadAttention mha = multi_head_attention_from_state_dict(model, "", model_meta.get_int("nhead"));
  set_precision(mha, precision);
  AttentionInputs inputs;
  inputs.query = input_activation(in, "query", mha.embed_dim());
  inputs.key = input_activation(in, "key", mha.config.kdim);
  inputs.value = input_activation(in, "value", mha.config.vdim);
  const int64_t B = inputs.query.size(0), N = inputs.query.size(1), M = inputs.key.size(1);
  if (inputs.key.size(0) != B || inputs.value.size(0) != B || inputs.value.size(1) != M)
    throw Error(fmt::format("{}: query {}, key {} and value {} do not agree in batch size and key length", in.path,
                            shape_str(inputs.query.shape()), shape_str(inputs.key.shape()),
                            shape_str(inputs.value.shape())));
  if (const Tensor* m = in.find("attn_mask"))
    inputs.mask =
        inputs.mask & mask_from_pytorch_attn_mask(*m, B, mha.num_heads(), N, M, in.path + ": tensor 'attn_mask'");
  if (const Tensor* m = in.find("key_padding_mask"))
    inputs.mask = inputs.mask & mask_from_pytorch_key_padding(*m, B, M, in.path + ": tensor 'key_padding_mask'");
  if (in_meta.get_bool("is_causal", false)) inputs.mask = inputs.mask & Mask::causal(CausalAlign::kTopLeft);
  // PyTorch's defaults: need_weights=True, average_attn_weights=True.
  inputs.need_weights = in_meta.get_bool("need_weights", true);
  inputs.average_weights = in_meta.get_bool("average_attn_weights", true);

  MultiHeadAttentionCache cache;
  std::map<std::string, Tensor> out;
  out["output"] = multi_head_attention_forward(mha, inputs, cache);
  const std::vector<uint8_t> rows = fully_masked_query_rows(inputs.mask, B, mha.num_heads(), N, M);
  zero_rows(out["output"], rows);
  if (inputs.need_weights) {
    out["attn_weights"] = inputs.average_weights ? cache.averaged_weights : cache.weights;
    if (inputs.average_weights) zero_rows(out["attn_weights"], rows);  // the mean over heads is NaN in PyTorch
  }
  return out;
}

}  // namespace

std::map<std::string, Tensor> run_pytorch_module(const SafetensorsFile& model, const SafetensorsFile& in,
                                                 Precision precision) {
  const ModuleKind kind = module_kind(model);
  return kind == ModuleKind::kMultiheadAttention ? run_attention(model, in, precision)
                                                 : run_encoder(model, in, kind == ModuleKind::kEncoderLayer, precision);
}

}  // namespace cabm
