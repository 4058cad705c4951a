#include "cabm/train/model_config.h"

#include "cabm/core/checked.h"
#include "cabm/core/error.h"
#include "cabm/interop/state_dict.h"
#include "cabm/nn/parameters.h"
#include "cabm/train/train_config.h"

#include <cstdlib>

namespace cabm {

std::string activation_name(Activation activation) {
  return activation == Activation::kGelu ? "gelu" : "relu";
}

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::kRelu;
  if (name == "gelu") return Activation::kGelu;
  throw Error(fmt::format("unknown activation '{}' (expected relu or gelu)", name));
}

namespace {

std::string bool_str(bool b) {
  return b ? "true" : "false";
}
std::string float_str(float f) {
  return fmt::format("{}", f);
}  // shortest round-trip

// The fields the two model configs share: the EncoderLayerConfig they extend and the token
// input and depth around it (members of both configs; each key is the member's name).
template <typename ModelConfig>
Metadata encoder_metadata(const ModelConfig& c) {
  Metadata m = {{"vocab_size", std::to_string(c.vocab_size)},
          {"max_seq_len", std::to_string(c.max_seq_len)},
          {"d_model", std::to_string(c.d_model)},
          {"nhead", std::to_string(c.nhead)},
          {"num_kv_heads", std::to_string(c.num_kv_heads == 0 ? c.nhead : c.num_kv_heads)},
          {"num_layers", std::to_string(c.num_layers)},
          {"dim_feedforward", std::to_string(c.dim_feedforward)},
          {"dropout", float_str(c.dropout)},
          {"activation", activation_name(c.activation)},
          {"norm_first", bool_str(c.norm_first)},
          {"layer_norm_eps", float_str(c.layer_norm_eps)},
          {"positional", positional_name(c.positional)},
          {"tokenizer", "bytes"}};
  if (c.positional == PositionalKind::kRotary) m["rope_theta"] = float_str(c.rope.theta);
  return m;
}

const std::string& need(const SafetensorsFile& f, const std::string& key) {
  const std::string* v = f.find_metadata(key);
  if (v == nullptr) throw Error(fmt::format("{}: missing metadata '{}' (not a cabm checkpoint?)", f.path, key));
  return *v;
}

// Before they are compared with the file's tensors, sizes are only known to be positive and
// below this, so that products such as V·E cannot overflow.
constexpr int64_t kMaxMetadataSize = int64_t{1} << 31;

int64_t get_int(const SafetensorsFile& f, const std::string& key) {
  return parse_integer(need(f, key), 1, kMaxMetadataSize, fmt::format("{}: metadata '{}'", f.path, key));
}

float get_float(const SafetensorsFile& f, const std::string& key, const RealRange& range) {
  return static_cast<float>(parse_real(need(f, key), range, fmt::format("{}: metadata '{}'", f.path, key)));
}

bool get_bool(const SafetensorsFile& f, const std::string& key, bool fallback) {
  const std::string* s = f.find_metadata(key);
  if (s == nullptr) return fallback;
  if (*s == "true") return true;
  if (*s == "false") return false;
  throw Error(fmt::format("{}: metadata '{}' must be true or false, got '{}'", f.path, key, *s));
}

// positional, and for rotary models the layers' rope options (neox layout, the whole head dim).
template <typename ModelConfig>
void get_positional(const SafetensorsFile& f, ModelConfig& c) {
  const std::string* s = f.find_metadata("positional");
  if (s == nullptr || *s == "learned") {
    c.positional = PositionalKind::kLearned;
  } else if (*s == "sinusoidal") {
    c.positional = PositionalKind::kSinusoidal;
  } else if (*s == "rotary") {
    c.positional = PositionalKind::kRotary;
    c.rope = {RopeStyle::kNeox, get_float(f, "rope_theta", {0, 1e30, true, false}), 0};
  } else {
    throw Error(fmt::format("{}: metadata 'positional' must be learned, sinusoidal or rotary, got '{}'", f.path, *s));
  }
}

Activation get_activation(const SafetensorsFile& f) {
  try {
    return parse_activation(need(f, "activation"));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: metadata 'activation': {}", f.path, e.what()));
  }
}

// Reads encoder_metadata's fields back, but for positional (each caller reads it after its own
// keys, so that the first bad key of a file is the one reported). A file without norm_first
// keeps the default of c's model kind: pre-norm for the LM, post-norm for the classifier.
template <typename ModelConfig>
void read_encoder_metadata(const SafetensorsFile& f, ModelConfig& c) {
  c.vocab_size = get_int(f, "vocab_size");
  c.max_seq_len = get_int(f, "max_seq_len");
  c.d_model = get_int(f, "d_model");
  c.nhead = get_int(f, "nhead");
  // Checkpoints from before grouped-query attention have no num_kv_heads: as many as nhead.
  c.num_kv_heads = f.find_metadata("num_kv_heads") ? get_int(f, "num_kv_heads") : c.nhead;
  c.num_layers = get_int(f, "num_layers");
  c.dim_feedforward = get_int(f, "dim_feedforward");
  c.dropout = get_float(f, "dropout", {0, 1, false, true});
  c.activation = get_activation(f);
  c.norm_first = get_bool(f, "norm_first", c.norm_first);
  c.layer_norm_eps = get_float(f, "layer_norm_eps", {0, 1, true, false});
}

// "[2, 3]", or "absent" for a tensor the file does not have.
std::string file_shape(const SafetensorsFile& f, const std::string& name) {
  const Tensor* t = f.find(name);
  return t ? shape_str(t->shape()) : "absent";
}

void expect_shape(const SafetensorsFile& f, const std::string& name, const Shape& shape, const std::string& because) {
  const Tensor* t = f.find(name);
  if (t == nullptr || t->shape() != shape)
    throw Error(fmt::format("{}: metadata {} needs tensor '{}' of shape {}, the file's is {}", f.path, because, name,
                            shape_str(shape), file_shape(f, name)));
}

// The sizes the metadata claims, checked against the tensors the file holds, before anything
// is allocated: a model whose parameters are not in the file (a hostile or corrupt num_layers,
// vocab_size, max_seq_len ...) is refused here instead of being built and then failing to
// load, or exhausting memory first. What the file cannot bound (the sinusoidal context) has
// a fixed limit.
template <typename ModelConfig>
void check_encoder_against_file(const SafetensorsFile& f, const ModelConfig& c) {
  const int64_t E = c.d_model, F = c.dim_feedforward;
  if (E % c.nhead != 0)
    throw Error(fmt::format("{}: metadata 'nhead' is {}, which does not divide d_model {}", f.path, c.nhead, E));
  if (c.nhead % c.num_kv_heads != 0)
    throw Error(fmt::format("{}: metadata 'num_kv_heads' is {}, which does not divide nhead {}", f.path,
                            c.num_kv_heads, c.nhead));
  const int64_t qkv_rows = E + 2 * (E / c.nhead) * c.num_kv_heads;
  expect_shape(f, "embed.weight", {c.vocab_size, E}, fmt::format("vocab_size {}, d_model {}", c.vocab_size, E));
  if (c.positional == PositionalKind::kLearned)
    expect_shape(f, "pos_embed.weight", {c.max_seq_len, E}, fmt::format("max_seq_len {}", c.max_seq_len));
  else if (c.max_seq_len > kMaxSeqLen)
    throw Error(fmt::format("{}: metadata 'max_seq_len' is {}, more than the {} positions a sinusoidal model may have",
                            f.path, c.max_seq_len, kMaxSeqLen));
  int64_t layers = 0;
  while (f.find(fmt::format("encoder.layers.{}.self_attn.in_proj_weight", layers))) ++layers;
  if (layers != c.num_layers)
    throw Error(fmt::format("{}: metadata 'num_layers' is {}, but the file holds {} layers (encoder.layers.N)", f.path,
                            c.num_layers, layers));
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = fmt::format("encoder.layers.{}.", l);
    expect_shape(f, p + "self_attn.in_proj_weight", {qkv_rows, E},
                 fmt::format("d_model {}, nhead {}, num_kv_heads {}", E, c.nhead, c.num_kv_heads));
    expect_shape(f, p + "linear1.weight", {F, E}, fmt::format("dim_feedforward {}, d_model {}", F, E));
  }
}

// Rebuilding the model allocates as much again as the file's tensors; a refusal names the file.
template <typename Model, typename Make>
Model build_model(const SafetensorsFile& file, Make&& make) {
  try {
    Model model = make();
    load_parameters(file, named_parameters(model));
    return model;
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(fmt::format("{}: no memory to build its model: {}", file.path, e.what()));
  }
}

}  // namespace

Metadata causal_lm_metadata(const CausalLMConfig& c) {
  Metadata m = encoder_metadata(c);
  m["model"] = "CausalLM";
  m["tie_head"] = bool_str(c.tie_head);
  return m;
}

Metadata classifier_metadata(const ClassifierConfig& c, const std::vector<std::string>& labels) {
  Metadata m = encoder_metadata(c);
  m["model"] = "Classifier";
  m["num_classes"] = std::to_string(c.num_classes);
  m["final_norm"] = bool_str(c.final_norm);
  std::string joined;
  for (size_t i = 0; i < labels.size(); ++i) joined += (i ? "," : "") + labels[i];
  m["labels"] = joined;
  return m;
}

std::string model_kind(const SafetensorsFile& file) {
  const std::string* kind = file.find_metadata("model");
  return kind ? *kind : std::string();
}

CausalLMConfig causal_lm_config_from(const SafetensorsFile& f) {
  if (model_kind(f) != "CausalLM")
    throw Error(fmt::format("{}: not a causal language model (metadata model = '{}')", f.path, model_kind(f)));
  CausalLMConfig c;
  read_encoder_metadata(f, c);
  c.tie_head = get_bool(f, "tie_head", true);
  get_positional(f, c);
  check_encoder_against_file(f, c);
  if (!c.tie_head)
    expect_shape(f, "head.weight", {c.vocab_size, c.d_model},
                 fmt::format("tie_head false, vocab_size {}", c.vocab_size));
  return c;
}

ClassifierConfig classifier_config_from(const SafetensorsFile& f, std::vector<std::string>& labels) {
  if (model_kind(f) != "Classifier")
    throw Error(fmt::format("{}: not a classifier (metadata model = '{}')", f.path, model_kind(f)));
  ClassifierConfig c;
  read_encoder_metadata(f, c);
  c.num_classes = get_int(f, "num_classes");
  c.final_norm = get_bool(f, "final_norm", true);
  get_positional(f, c);
  check_encoder_against_file(f, c);
  expect_shape(f, "classifier.weight", {c.num_classes, c.d_model}, fmt::format("num_classes {}", c.num_classes));
  labels.clear();
  const std::string& joined = need(f, "labels");
  size_t pos = 0;
  while (pos <= joined.size()) {
    const size_t comma = joined.find(',', pos);
    labels.push_back(joined.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (static_cast<int64_t>(labels.size()) != c.num_classes)
    throw Error(
        fmt::format("{}: metadata 'labels' names {} classes, num_classes is {}", f.path, labels.size(), c.num_classes));
  return c;
}

CausalLM load_causal_lm(const SafetensorsFile& file) {
  const CausalLMConfig config = causal_lm_config_from(file);
  return build_model<CausalLM>(file, [&] { return make_causal_lm(config); });
}

Classifier load_classifier(const SafetensorsFile& file, std::vector<std::string>& labels) {
  const ClassifierConfig config = classifier_config_from(file, labels);
  return build_model<Classifier>(file, [&] { return make_classifier(config); });
}

double parameter_count(const CausalLMConfig& c) {
  const double V = static_cast<double>(c.vocab_size), E = static_cast<double>(c.d_model);
  double n = V * E + 2 * E + static_cast<double>(c.num_layers) * layer_parameter_count(c);
  if (c.positional == PositionalKind::kLearned) n += static_cast<double>(c.max_seq_len) * E;
  if (!c.tie_head) n += V * E;
  return n;
}

double parameter_count(const ClassifierConfig& c) {
  const double V = static_cast<double>(c.vocab_size), E = static_cast<double>(c.d_model);
  double n = V * E + static_cast<double>(c.num_layers) * layer_parameter_count(c) +
             static_cast<double>(c.num_classes) * (E + 1);
  if (c.final_norm) n += 2 * E;
  if (c.positional == PositionalKind::kLearned) n += static_cast<double>(c.max_seq_len) * E;
  return n;
}

double layer_parameter_count(const EncoderLayerConfig& c) {
  const double E = static_cast<double>(c.d_model), F = static_cast<double>(c.dim_feedforward);
  // Q, K, V rows: E + 2Ekv (Ekv = E without grouped-query attention).
  const int64_t kv_heads = c.num_kv_heads == 0 ? c.nhead : c.num_kv_heads;
  const double W = E + 2.0 * static_cast<double>(c.nhead > 0 ? c.d_model / c.nhead * kv_heads : c.d_model);
  return W * E + W + E * E + E + 2 * E * F + F + E + 4 * E;  // attention, feed-forward, two norms
}

}  // namespace cabm
