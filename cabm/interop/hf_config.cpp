#include "cabm/interop/hf_config.h"

#include "cabm/core/checked.h"
#include "cabm/core/error.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace cabm {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open", path.string()));
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    json doc = json::parse(buffer.str());
    if (!doc.is_object()) throw Error(fmt::format("{}: expected a JSON object", path.string()));
    return doc;
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", path.string(), e.what()));
  }
}

// Typed access to one JSON object's keys; every message names the file and the key.
struct Keys {
  const json& doc;
  const std::string& path;

  const json* find(const std::string& key) const {
    auto it = doc.find(key);
    return it == doc.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(fmt::format("{}: '{}' {}", path, key, what));
  }
  int64_t get_int(const std::string& key, int64_t min, int64_t max) const {
    const json* v = find(key);
    if (!v) fail(key, "is required");
    const std::string what = fmt::format("{}: '{}'", path, key);
    if (v->is_number_unsigned()) return checked_integer(v->get<uint64_t>(), min, max, what);
    if (v->is_number_integer()) return checked_integer(v->get<int64_t>(), min, max, what);
    throw_not_integer(v->dump(), min, max, what);
  }
  int64_t get_int(const std::string& key, int64_t min, int64_t max, int64_t fallback) const {
    return find(key) ? get_int(key, min, max) : fallback;
  }
  float get_float(const std::string& key, float fallback, const RealRange& range) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number()) fail(key, fmt::format("is {}, expected a number", v->dump()));
    return static_cast<float>(checked_real(v->get<double>(), range, fmt::format("{}: '{}'", path, key)));
  }
  std::string get_string(const std::string& key, const std::string& fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_string()) fail(key, fmt::format("is {}, expected a string", v->dump()));
    return v->get<std::string>();
  }
  bool get_bool(const std::string& key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(key, fmt::format("is {}, expected true or false", v->dump()));
    return v->get<bool>();
  }
  // Options cabm does not implement: refused when set to anything but their neutral value.
  void refuse_true(const std::string& key, const std::string& why) const {
    if (get_bool(key, false)) fail(key, fmt::format("is true: {} is not supported", why));
  }
};

constexpr int64_t kMaxSize = int64_t{1} << 31;

HfActivation parse_activation(const Keys& keys, const std::string& key, const std::string& fallback) {
  const std::string name = keys.get_string(key, fallback);
  if (name == "gelu") return HfActivation::kGelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return HfActivation::kGeluTanh;
  if (name == "relu") return HfActivation::kRelu;
  keys.fail(key, fmt::format("is '{}', expected gelu, gelu_new, gelu_pytorch_tanh or relu", name));
}

struct Architecture {
  const char* name;
  const char* model_type;
  HfFamily family;
  HfHead head;
};
constexpr Architecture kArchitectures[] = {
    {"BertModel", "bert", HfFamily::kBert, HfHead::kNone},
    {"BertForSequenceClassification", "bert", HfFamily::kBert, HfHead::kSequenceClassification},
    {"RobertaModel", "roberta", HfFamily::kRoberta, HfHead::kNone},
    {"RobertaForSequenceClassification", "roberta", HfFamily::kRoberta, HfHead::kSequenceClassification},
    {"XLMRobertaModel", "xlm-roberta", HfFamily::kRoberta, HfHead::kNone},
    {"XLMRobertaForSequenceClassification", "xlm-roberta", HfFamily::kRoberta, HfHead::kSequenceClassification},
    {"DistilBertModel", "distilbert", HfFamily::kDistilBert, HfHead::kNone},
    {"DistilBertForSequenceClassification", "distilbert", HfFamily::kDistilBert, HfHead::kSequenceClassification},
};

const Architecture& find_architecture(const Keys& keys) {
  const std::string model_type = keys.get_string("model_type", "");
  std::string name;
  if (const json* archs = keys.find("architectures")) {
    if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string())
      keys.fail("architectures", fmt::format("is {}, expected a list of one name", archs->dump()));
    name = (*archs)[0].get<std::string>();
  }
  for (const Architecture& a : kArchitectures) {
    if (name.empty() ? (a.model_type == model_type && a.head == HfHead::kNone) : a.name == name) {
      if (!model_type.empty() && model_type != a.model_type)
        keys.fail("model_type", fmt::format("is '{}' but architectures names {}", model_type, a.name));
      return a;
    }
  }
  if (name.empty())
    keys.fail("model_type", fmt::format("is '{}', expected bert, roberta, xlm-roberta or distilbert", model_type));
  keys.fail("architectures", fmt::format("names {}, which cabm does not run (supported: BertModel, RobertaModel, "
                                         "XLMRobertaModel, DistilBertModel and their *ForSequenceClassification)",
                                         name));
}

void read_labels(const Keys& keys, HfEncoderConfig& config) {
  const json* labels = keys.find("id2label");
  const int64_t fallback = labels && labels->is_object() ? static_cast<int64_t>(labels->size()) : 2;
  const int64_t num_labels = keys.get_int("num_labels", 1, kMaxSize, fallback);
  config.id2label.assign(static_cast<size_t>(num_labels), "");
  for (int64_t i = 0; i < num_labels; ++i) config.id2label[static_cast<size_t>(i)] = fmt::format("LABEL_{}", i);
  if (labels) {
    if (!labels->is_object() || static_cast<int64_t>(labels->size()) != num_labels)
      keys.fail("id2label", fmt::format("must map each of the {} label ids to a name", num_labels));
    for (const auto& [id, name] : labels->items()) {
      std::string problem;
      const auto index = try_parse_integer(id, 0, num_labels - 1, problem);
      if (!index || !name.is_string())
        keys.fail("id2label", fmt::format("has entry \"{}\": {}, expected ids 0..{} mapped to strings", id, name.dump(),
                                          num_labels - 1));
      config.id2label[static_cast<size_t>(*index)] = name.get<std::string>();
    }
  }
  const std::string problem_type = keys.get_string("problem_type", "single_label_classification");
  if (problem_type != "single_label_classification" && problem_type != "multi_label_classification")
    keys.fail("problem_type",
              fmt::format("is '{}', expected single_label_classification or multi_label_classification", problem_type));
  config.multi_label = problem_type == "multi_label_classification";
}

}  // namespace

std::string HfEncoderConfig::base_prefix() const {
  switch (family) {
    case HfFamily::kBert:
      return "bert.";
    case HfFamily::kRoberta:
      return "roberta.";
    case HfFamily::kDistilBert:
      return "distilbert.";
  }
  return "";
}

int64_t HfEncoderConfig::max_tokens() const {
  return family == HfFamily::kRoberta ? max_position_embeddings - pad_token_id - 1 : max_position_embeddings;
}

std::string activation_name(HfActivation activation) {
  switch (activation) {
    case HfActivation::kRelu:
      return "relu";
    case HfActivation::kGelu:
      return "gelu";
    case HfActivation::kGeluTanh:
      return "gelu_new";
  }
  return "?";
}

HfEncoderConfig parse_hf_config(const json& doc, const std::string& path) {
  const Keys keys{doc, path};
  const Architecture& arch = find_architecture(keys);
  HfEncoderConfig c;
  c.path = path;
  c.model_type = arch.model_type;
  c.architecture = arch.name;
  c.family = arch.family;
  c.head = arch.head;
  c.vocab_size = keys.get_int("vocab_size", 1, kMaxSize);
  if (c.family == HfFamily::kDistilBert) {
    c.hidden_size = keys.get_int("dim", 1, kMaxSize);
    c.num_layers = keys.get_int("n_layers", 1, 4096);
    c.num_heads = keys.get_int("n_heads", 1, c.hidden_size);
    c.intermediate_size = keys.get_int("hidden_dim", 1, kMaxSize);
    c.activation = parse_activation(keys, "activation", "gelu");
    c.sinusoidal_pos_embds = keys.get_bool("sinusoidal_pos_embds", false);
    c.layer_norm_eps = 1e-12f;  // transformers' DistilBERT hard-codes it
    c.type_vocab_size = 0;
    if (c.hidden_size % c.num_heads != 0)
      keys.fail("n_heads", fmt::format("is {}, which does not divide dim {}", c.num_heads, c.hidden_size));
  } else {
    c.hidden_size = keys.get_int("hidden_size", 1, kMaxSize);
    c.num_layers = keys.get_int("num_hidden_layers", 1, 4096);
    c.num_heads = keys.get_int("num_attention_heads", 1, c.hidden_size);
    c.intermediate_size = keys.get_int("intermediate_size", 1, kMaxSize);
    c.activation = parse_activation(keys, "hidden_act", "gelu");
    c.layer_norm_eps = keys.get_float("layer_norm_eps", 1e-12f, {0, 1, true, false});
    c.type_vocab_size = keys.get_int("type_vocab_size", 1, kMaxSize, 2);
    if (c.hidden_size % c.num_heads != 0)
      keys.fail("num_attention_heads",
                fmt::format("is {}, which does not divide hidden_size {}", c.num_heads, c.hidden_size));
    const std::string positions = keys.get_string("position_embedding_type", "absolute");
    if (positions != "absolute")
      keys.fail("position_embedding_type", fmt::format("is '{}': only absolute is supported", positions));
    keys.refuse_true("is_decoder", "a decoder (causal self-attention)");
    keys.refuse_true("add_cross_attention", "cross-attention");
  }
  c.max_position_embeddings = keys.get_int("max_position_embeddings", 1, kMaxSize, 512);
  c.pad_token_id = keys.get_int("pad_token_id", 0, c.vocab_size - 1, c.family == HfFamily::kRoberta ? 1 : 0);
  if (c.max_tokens() < 1)
    keys.fail("max_position_embeddings", fmt::format("is {}, leaving no position after pad_token_id {}",
                                                     c.max_position_embeddings, c.pad_token_id));
  if (const json* pruned = keys.find("pruned_heads"); pruned && !pruned->empty())
    keys.fail("pruned_heads", "is not empty: pruned attention heads are not supported");
  if (c.head == HfHead::kSequenceClassification) read_labels(keys, c);
  return c;
}

HfEncoderConfig read_hf_config(const std::filesystem::path& model_dir) {
  if (!fs::is_directory(model_dir)) throw Error(fmt::format("{}: not a directory", model_dir.string()));
  const fs::path path = model_dir / "config.json";
  if (!fs::exists(path))
    throw Error(fmt::format("{}: missing (a Hugging Face model directory has one)", path.string()));
  return parse_hf_config(read_json(path), path.string());
}

HfPooling parse_pooling(const std::string& name) {
  if (name == "mean") return HfPooling::kMean;
  if (name == "cls") return HfPooling::kCls;
  if (name == "none") return HfPooling::kNone;
  throw Error(fmt::format("pooling '{}': expected mean, cls or none", name));
}

SentenceTransformersConfig read_sentence_transformers_config(const std::filesystem::path& model_dir) {
  SentenceTransformersConfig st;
  const fs::path modules_path = model_dir / "modules.json";
  if (!fs::exists(modules_path)) return st;
  st.present = true;
  std::ifstream in(modules_path, std::ios::binary);
  json modules;
  try {
    modules = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", modules_path.string(), e.what()));
  }
  if (!modules.is_array()) throw Error(fmt::format("{}: expected a list of modules", modules_path.string()));
  const std::string where = modules_path.string();
  bool have_pooling = false;
  for (const json& module : modules) {
    if (!module.is_object() || !module.contains("type") || !module["type"].is_string())
      throw Error(fmt::format("{}: every module needs a 'type' string", where));
    const std::string type = module["type"].get<std::string>();
    const std::string sub = module.value("path", std::string());
    if (type == "sentence_transformers.models.Transformer") {
      if (!sub.empty())
        throw Error(
            fmt::format("{}: the Transformer module's 'path' is '{}': only the model directory itself is "
                        "supported",
                        where, sub));
    } else if (type == "sentence_transformers.models.Pooling") {
      const fs::path pooling_path = model_dir / sub / "config.json";
      const json pooling = read_json(pooling_path);
      const std::string ppath = pooling_path.string();
      const Keys keys{pooling, ppath};
      for (const char* key : {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                              "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"})
        keys.refuse_true(key, "this pooling mode");
      const bool mean = keys.get_bool("pooling_mode_mean_tokens", false);
      const bool cls = keys.get_bool("pooling_mode_cls_token", false);
      if (mean == cls)
        keys.fail("pooling_mode_mean_tokens",
                  "and 'pooling_mode_cls_token': exactly one of them must be true (concatenated poolings are not "
                  "supported)");
      st.pooling = mean ? HfPooling::kMean : HfPooling::kCls;
      have_pooling = true;
    } else if (type == "sentence_transformers.models.Normalize") {
      st.normalize = true;
    } else {
      throw Error(
          fmt::format("{}: module type '{}' is not supported (only Transformer, Pooling and Normalize)", where, type));
    }
  }
  if (!have_pooling) throw Error(fmt::format("{}: no sentence_transformers.models.Pooling module", where));
  st.max_seq_length = read_sentence_transformers_max_length(model_dir);
  return st;
}

int64_t read_sentence_transformers_max_length(const std::filesystem::path& model_dir) {
  const fs::path bert_config = model_dir / "sentence_bert_config.json";
  if (!fs::exists(bert_config)) return 0;
  const json doc = read_json(bert_config);
  const std::string path = bert_config.string();
  const Keys keys{doc, path};
  keys.refuse_true("do_lower_case", "lower-casing before the tokenizer");
  return keys.get_int("max_seq_length", 1, kMaxSize, 0);
}

}  // namespace cabm
