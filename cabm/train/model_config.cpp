#include "cabm/train/model_config.h"

#include "cabm/core/error.h"
#include "cabm/interop/state_dict.h"
#include "cabm/nn/parameters.h"

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
  return {{"vocab_size", std::to_string(c.vocab_size)},
          {"max_seq_len", std::to_string(c.max_seq_len)},
          {"d_model", std::to_string(c.d_model)},
          {"nhead", std::to_string(c.nhead)},
          {"num_layers", std::to_string(c.num_layers)},
          {"dim_feedforward", std::to_string(c.dim_feedforward)},
          {"dropout", float_str(c.dropout)},
          {"activation", activation_name(c.activation)},
          {"norm_first", bool_str(c.norm_first)},
          {"layer_norm_eps", float_str(c.layer_norm_eps)},
          {"positional", c.positional == PositionalKind::kLearned ? "learned" : "sinusoidal"},
          {"tokenizer", "bytes"}};
}

const std::string& need(const SafetensorsFile& f, const std::string& key) {
  const std::string* v = f.find_metadata(key);
  if (v == nullptr) throw Error(fmt::format("{}: missing metadata '{}' (not a cabm checkpoint?)", f.path, key));
  return *v;
}

int64_t get_int(const SafetensorsFile& f, const std::string& key) {
  const std::string& s = need(f, key);
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < 0)
    throw Error(fmt::format("{}: metadata '{}' is not a count: '{}'", f.path, key, s));
  return v;
}

float get_float(const SafetensorsFile& f, const std::string& key) {
  const std::string& s = need(f, key);
  char* end = nullptr;
  const float v = std::strtof(s.c_str(), &end);
  if (s.empty() || *end != '\0') throw Error(fmt::format("{}: metadata '{}' is not a number: '{}'", f.path, key, s));
  return v;
}

bool get_bool(const SafetensorsFile& f, const std::string& key, bool fallback) {
  const std::string* s = f.find_metadata(key);
  if (s == nullptr) return fallback;
  if (*s == "true") return true;
  if (*s == "false") return false;
  throw Error(fmt::format("{}: metadata '{}' must be true or false, got '{}'", f.path, key, *s));
}

PositionalKind get_positional(const SafetensorsFile& f) {
  const std::string* s = f.find_metadata("positional");
  if (s == nullptr || *s == "learned") return PositionalKind::kLearned;
  if (*s == "sinusoidal") return PositionalKind::kSinusoidal;
  throw Error(fmt::format("{}: metadata 'positional' must be learned or sinusoidal, got '{}'", f.path, *s));
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
  c.num_layers = get_int(f, "num_layers");
  c.dim_feedforward = get_int(f, "dim_feedforward");
  c.dropout = get_float(f, "dropout");
  c.activation = get_activation(f);
  c.norm_first = get_bool(f, "norm_first", c.norm_first);
  c.layer_norm_eps = get_float(f, "layer_norm_eps");
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
  c.positional = get_positional(f);
  return c;
}

ClassifierConfig classifier_config_from(const SafetensorsFile& f, std::vector<std::string>& labels) {
  if (model_kind(f) != "Classifier")
    throw Error(fmt::format("{}: not a classifier (metadata model = '{}')", f.path, model_kind(f)));
  ClassifierConfig c;
  read_encoder_metadata(f, c);
  c.num_classes = get_int(f, "num_classes");
  c.final_norm = get_bool(f, "final_norm", true);
  c.positional = get_positional(f);
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
  CausalLM model = make_causal_lm(causal_lm_config_from(file));
  load_parameters(file, named_parameters(model));
  return model;
}

Classifier load_classifier(const SafetensorsFile& file, std::vector<std::string>& labels) {
  Classifier model = make_classifier(classifier_config_from(file, labels));
  load_parameters(file, named_parameters(model));
  return model;
}

}  // namespace cabm
