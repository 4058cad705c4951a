#include "cabm/interop/hf_encoder.h"

#include "cabm/core/error.h"
#include "cabm/interop/state_dict.h"
#include "cabm/io/safetensors.h"
#include "cabm/kernels/layernorm.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

namespace cabm {

namespace {

namespace fs = std::filesystem;

// Copies tensors by name into module parameters, checking shapes, and remembers what it took.
struct Loader {
  const SafetensorsFile& file;
  std::set<std::string> taken;

  bool has(const std::string& key) const { return file.find(key) != nullptr; }

  // The tensor as F32 of `shape` (BF16 converted).
  Tensor get(const std::string& key, const Shape& shape) {
    const Tensor& src = file.get(key);  // "PATH: missing tensor 'key'"
    if (src.dtype() != DType::F32 && src.dtype() != DType::BF16)
      throw Error(fmt::format("{}: tensor '{}' has dtype {}, expected F32, F16 or BF16", file.path, key,
                              dtype_name(src.dtype())));
    if (src.shape() != shape)
      throw Error(fmt::format("{}: tensor '{}' has shape {}, expected {}", file.path, key, shape_str(src.shape()),
                              shape_str(shape)));
    check_finite_weights(file, key, src);
    taken.insert(key);
    return src.dtype() == DType::F32 ? src.contiguous() : Tensor::from_vector(src.to_vector(), src.shape());
  }
  void take(const std::string& key, const Tensor& dst) {
    Tensor out = dst;
    out.copy_from(get(key, dst.shape()));
  }
  // An embedding table as read, not copied: the word embeddings are half of a small BERT, and a
  // zeroed table to copy them into would be as much fresh memory again (loading time).
  Embedding table(const std::string& key, int64_t rows, int64_t E) { return Embedding{get(key, {rows, E})}; }
  void take(const std::string& prefix, const Linear& linear) {
    take(prefix + "weight", linear.weight);
    take(prefix + "bias", linear.bias);
  }
  void take(const std::string& prefix, const LayerNorm& norm) {
    take(prefix + "weight", norm.weight);
    take(prefix + "bias", norm.bias);
  }
};

// DistilBERT's fixed table (transformers' _create_sinusoidal_embeddings):
//   pe[pos, j] = sin(pos / 10000^(2⌊j/2⌋/dim)) for even j, cos(...) for odd j.
void fill_sinusoidal(const Tensor& table) {
  const int64_t n = table.size(0), dim = table.size(1);
  float* out = table.data<float>();
  for (int64_t pos = 0; pos < n; ++pos)
    for (int64_t j = 0; j < dim; ++j) {
      const double angle = static_cast<double>(pos) / std::pow(10000.0, 2.0 * static_cast<double>(j / 2) / dim);
      out[pos * dim + j] = static_cast<float>(j % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
}

Linear linear(int64_t in, int64_t out) {
  return make_linear(in, out, /*bias=*/true);
}

SafetensorsFile open_weights(const fs::path& dir) {
  const fs::path path = dir / "model.safetensors";
  if (fs::exists(path)) return read_safetensors(path.string());
  if (fs::exists(dir / "model.safetensors.index.json"))
    throw Error(fmt::format("{}: sharded checkpoints (model.safetensors.index.json) are not supported", dir.string()));
  if (fs::exists(dir / "pytorch_model.bin"))
    throw Error(
        fmt::format("{}: has only pytorch_model.bin, a pickle file; cabm does not read pickle files because "
                    "they execute code when loaded (convert it to model.safetensors)",
                    dir.string()));
  throw Error(fmt::format("{}: missing model.safetensors", dir.string()));
}

}  // namespace

HfEncoder load_hf_encoder(const std::filesystem::path& model_dir) {
  HfEncoder m;
  m.config = read_hf_config(model_dir);
  const HfEncoderConfig& c = m.config;
  const SafetensorsFile file = open_weights(model_dir);
  Loader load{file, {}};
  const int64_t E = c.hidden_size, F = c.intermediate_size;

  // The base model's tensors: under "bert." etc. in a classification checkpoint; bare (or, in
  // some bare-model checkpoints, under the prefix too) otherwise.
  std::string p;
  if (c.head == HfHead::kSequenceClassification || (!load.has("embeddings.word_embeddings.weight") &&
                                                    load.has(c.base_prefix() + "embeddings.word_embeddings.weight")))
    p = c.base_prefix();

  m.word = load.table(p + "embeddings.word_embeddings.weight", c.vocab_size, E);
  const std::string position_key = p + "embeddings.position_embeddings.weight";
  if (c.sinusoidal_pos_embds && !load.has(position_key)) {
    m.position = make_embedding(c.max_position_embeddings, E);
    fill_sinusoidal(m.position.weight);
  } else {
    m.position = load.table(position_key, c.max_position_embeddings, E);
  }
  if (c.family != HfFamily::kDistilBert)
    m.token_type = load.table(p + "embeddings.token_type_embeddings.weight", c.type_vocab_size, E);
  m.embed_norm = make_layer_norm(E, c.layer_norm_eps);
  load.take(p + "embeddings.LayerNorm.", m.embed_norm);

  EncoderLayerConfig lc;
  lc.d_model = E;
  lc.nhead = c.num_heads;
  lc.dim_feedforward = F;
  lc.dropout = 0.0f;
  lc.activation = c.activation == HfActivation::kRelu ? Activation::kRelu : Activation::kGelu;
  lc.layer_norm_eps = c.layer_norm_eps;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    EncoderLayer layer = make_encoder_layer(lc);
    const MultiHeadAttention& a = layer.self_attn;
    if (c.family == HfFamily::kDistilBert) {
      const std::string q = fmt::format("{}transformer.layer.{}.", p, i);
      load.take(q + "attention.q_lin.", a.q_proj);
      load.take(q + "attention.k_lin.", a.k_proj);
      load.take(q + "attention.v_lin.", a.v_proj);
      load.take(q + "attention.out_lin.", a.out_proj);
      load.take(q + "sa_layer_norm.", layer.norm1);
      load.take(q + "ffn.lin1.", layer.ffn.linear1);
      load.take(q + "ffn.lin2.", layer.ffn.linear2);
      load.take(q + "output_layer_norm.", layer.norm2);
    } else {
      const std::string q = fmt::format("{}encoder.layer.{}.", p, i);
      load.take(q + "attention.self.query.", a.q_proj);
      load.take(q + "attention.self.key.", a.k_proj);
      load.take(q + "attention.self.value.", a.v_proj);
      load.take(q + "attention.output.dense.", a.out_proj);
      load.take(q + "attention.output.LayerNorm.", layer.norm1);
      load.take(q + "intermediate.dense.", layer.ffn.linear1);
      load.take(q + "output.dense.", layer.ffn.linear2);
      load.take(q + "output.LayerNorm.", layer.norm2);
    }
    m.layers.push_back(std::move(layer));
  }

  const bool bert_head = c.head == HfHead::kSequenceClassification && c.family == HfFamily::kBert;
  if (c.family != HfFamily::kDistilBert && (bert_head || load.has(p + "pooler.dense.weight"))) {
    m.pooler = linear(E, E);
    load.take(p + "pooler.dense.", *m.pooler);
  }
  if (c.head == HfHead::kSequenceClassification) {
    const int64_t labels = m.num_labels();
    switch (c.family) {
      case HfFamily::kBert:
        m.head_out = linear(E, labels);
        load.take("classifier.", m.head_out);
        break;
      case HfFamily::kRoberta:
        m.head_dense = linear(E, E);
        m.head_out = linear(E, labels);
        load.take("classifier.dense.", m.head_dense);
        load.take("classifier.out_proj.", m.head_out);
        break;
      case HfFamily::kDistilBert:
        m.head_dense = linear(E, E);
        m.head_out = linear(E, labels);
        load.take("pre_classifier.", m.head_dense);
        load.take("classifier.", m.head_out);
        break;
    }
  }

  // Strict like load_state_dict, except for transformers' buffers and, in a bare model whose
  // tensors sit under a prefix, for the tensors of heads outside it.
  for (const auto& [name, tensor] : file.tensors) {
    if (load.taken.count(name)) continue;
    if (name == p + "embeddings.position_ids" || name == p + "embeddings.token_type_ids") continue;
    if (c.head == HfHead::kNone && !p.empty() && name.compare(0, p.size(), p) != 0) continue;
    throw Error(
        fmt::format("{}: unexpected tensor '{}' (no parameter of {} has that name)", file.path, name, c.architecture));
  }
  return m;
}

void set_precision(HfEncoder& model, Precision precision) {
  for (EncoderLayer& layer : model.layers) set_precision(layer, precision);
  model.precision = precision;
}

namespace {

void check_ids(const Tensor& t, const char* what, int64_t B, int64_t T) {
  if (t.dtype() != DType::I64 || t.dim() != 2 || (B >= 0 && (t.size(0) != B || t.size(1) != T)))
    throw Error(fmt::format("{} must be I64 [{}, {}], got {} {}", what, B < 0 ? "B" : std::to_string(B),
                            B < 0 ? "T" : std::to_string(T), dtype_name(t.dtype()), shape_str(t.shape())));
}

// The embeddings' sum before their LayerNorm, in transformers' order: (word + token_type) + position.
void embed(const HfEncoder& m, const HfInputs& in, Tensor& sum) {
  const HfEncoderConfig& c = m.config;
  const int64_t B = in.input_ids.size(0), T = in.input_ids.size(1), E = c.hidden_size;
  if (T > c.max_tokens())
    throw Error(
        fmt::format("{}: inputs of {} tokens are longer than the model's {} positions (max_position_embeddings "
                    "{})",
                    c.path, T, c.max_tokens(), c.max_position_embeddings));
  const int64_t* ids = in.input_ids.data<int64_t>();
  const int64_t* types = in.token_type_ids.defined() ? in.token_type_ids.data<int64_t>() : nullptr;
  std::vector<int64_t> positions(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int64_t count = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = b * T + t;
      if (ids[i] < 0 || ids[i] >= c.vocab_size)
        throw Error(fmt::format("input_ids[{}, {}] is {}, outside the vocabulary [0, {})", b, t, ids[i], c.vocab_size));
      if (types && (types[i] < 0 || types[i] >= std::max<int64_t>(c.type_vocab_size, 1)))
        throw Error(fmt::format("token_type_ids[{}, {}] is {}, outside [0, {})", b, t, types[i],
                                std::max<int64_t>(c.type_vocab_size, 1)));
      if (c.family == HfFamily::kRoberta) {
        const bool token = ids[i] != c.pad_token_id;
        count += token ? 1 : 0;
        positions[static_cast<size_t>(i)] = token ? c.pad_token_id + count : c.pad_token_id;
      } else {
        positions[static_cast<size_t>(i)] = t;
      }
    }
  }
  ensure_shape(sum, {B, T, E});
  const float* word = m.word.weight.data<float>();
  const float* pos = m.position.weight.data<float>();
  const float* type = m.token_type.weight.defined() ? m.token_type.weight.data<float>() : nullptr;
  float* out = sum.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < B * T; ++i) {
    const float* w = word + ids[i] * E;
    const float* p = pos + positions[static_cast<size_t>(i)] * E;
    float* o = out + i * E;
    if (type) {
      const float* ty = type + (types ? types[i] : 0) * E;
      for (int64_t e = 0; e < E; ++e) o[e] = (w[e] + ty[e]) + p[e];
    } else {
      for (int64_t e = 0; e < E; ++e) o[e] = w[e] + p[e];
    }
  }
}

Mask mask_from_attention_mask(const Tensor& attention_mask) {
  if (!attention_mask.defined()) return Mask();
  const int64_t B = attention_mask.size(0), T = attention_mask.size(1);
  const int64_t* m = attention_mask.data<int64_t>();
  std::vector<int64_t> lengths(static_cast<size_t>(B));
  bool suffix = true;
  for (int64_t b = 0; b < B; ++b) {
    int64_t len = 0;
    while (len < T && m[b * T + len] != 0) ++len;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t v = m[b * T + t];
      if (v != 0 && v != 1) throw Error(fmt::format("attention_mask[{}, {}] is {}, expected 0 or 1", b, t, v));
      if (t >= len && v != 0) suffix = false;
    }
    lengths[static_cast<size_t>(b)] = len;
  }
  bool full = true;
  for (int64_t len : lengths) full = full && len == T;
  if (suffix) return full ? Mask() : Mask::key_padding(lengths);
  Tensor allowed = Tensor::empty({B, 1, 1, T}, DType::BOOL);
  uint8_t* dst = allowed.data<uint8_t>();
  for (int64_t i = 0; i < B * T; ++i) dst[i] = m[i] != 0 ? 1 : 0;
  return Mask::allow(allowed);
}

// y = act(linear(x)) for a [B, E] view.
Tensor dense(const Linear& layer, const Tensor& x, float (*act)(float)) {
  Tensor y = Tensor::empty({x.size(0), layer.out_features()});
  linear_forward(layer, x, y);
  if (act) {
    float* p = y.data<float>();
    for (int64_t i = 0; i < y.numel(); ++i) p[i] = act(p[i]);
  }
  return y;
}

float tanh_f(float v) {
  return std::tanh(v);
}
float relu_f(float v) {
  return v > 0.0f ? v : 0.0f;
}

Tensor first_token(const Tensor& hidden) {  // [B, T, E] → [B, E] view (row stride T·E)
  return hidden.select(1, 0);
}

}  // namespace

Tensor hf_pooler_forward(const HfEncoder& model, const Tensor& hidden) {
  CABM_CHECK(model.pooler.has_value(), "{}: the model has no pooler", model.config.path);
  return dense(*model.pooler, first_token(hidden), tanh_f);
}

Tensor hf_classifier_forward(const HfEncoder& model, const Tensor& hidden) {
  CABM_CHECK(model.has_classifier(), "{}: {} has no classification head", model.config.path, model.config.architecture);
  switch (model.config.family) {
    case HfFamily::kBert:
      return dense(model.head_out, hf_pooler_forward(model, hidden), nullptr);
    case HfFamily::kRoberta:
      return dense(model.head_out, dense(model.head_dense, first_token(hidden), tanh_f), nullptr);
    case HfFamily::kDistilBert:
      return dense(model.head_out, dense(model.head_dense, first_token(hidden), relu_f), nullptr);
  }
  return {};
}

const Tensor& hf_encoder_hidden(const HfEncoder& model, const HfInputs& inputs, HfEncoderCache& cache) {
  check_ids(inputs.input_ids, "input_ids", -1, -1);
  const int64_t B = inputs.input_ids.size(0), T = inputs.input_ids.size(1);
  if (B == 0 || T == 0) throw Error(fmt::format("input_ids {} is empty", shape_str(inputs.input_ids.shape())));
  if (inputs.token_type_ids.defined()) check_ids(inputs.token_type_ids, "token_type_ids", B, T);
  if (inputs.attention_mask.defined()) check_ids(inputs.attention_mask, "attention_mask", B, T);
  HfInputs in{inputs.input_ids.contiguous(),
              inputs.token_type_ids.defined() ? inputs.token_type_ids.contiguous() : Tensor(),
              inputs.attention_mask.defined() ? inputs.attention_mask.contiguous() : Tensor()};
  if (model.config.family == HfFamily::kDistilBert) in.token_type_ids = Tensor();
  const Mask mask = mask_from_attention_mask(in.attention_mask);

  embed(model, in, cache.x);  // [B, T, E], then normalised in place
  layer_norm_forward(model.embed_norm, as_rows(cache.x), as_rows(cache.x), cache.norm);
  const InferenceActivation activation =
      model.config.activation == HfActivation::kGeluTanh ? InferenceActivation::kGeluTanh : InferenceActivation::kLayer;
  for (const EncoderLayer& layer : model.layers) encoder_layer_infer(layer, cache.x, mask, cache.work, activation);
  return cache.x;
}

HfOutputs hf_outputs(const HfEncoder& model, const Tensor& hidden) {
  HfOutputs out;
  out.last_hidden_state = hidden;
  if (model.pooler) out.pooler_output = hf_pooler_forward(model, hidden);
  if (model.has_classifier()) out.logits = hf_classifier_forward(model, hidden);
  return out;
}

HfOutputs hf_encoder_forward(const HfEncoder& model, const HfInputs& inputs, HfEncoderCache& cache) {
  return hf_outputs(model, hf_encoder_hidden(model, inputs, cache).clone());
}

}  // namespace cabm
