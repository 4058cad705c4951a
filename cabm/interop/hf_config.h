// Hugging Face model directories: what `config.json` (transformers) and the sentence-transformers
// files (`modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`) say, read and
// validated. Every key cabm cannot honour is refused with one line naming the file and the key,
// never ignored: a model that ran differently from transformers would be worse than no model.
//
// Supported (`architectures[0]`, else `model_type` for the bare model):
//   BertModel, BertForSequenceClassification                         (model_type bert)
//   RobertaModel, RobertaForSequenceClassification                   (model_type roberta)
//   XLMRobertaModel, XLMRobertaForSequenceClassification             (model_type xlm-roberta)
//   DistilBertModel, DistilBertForSequenceClassification             (model_type distilbert)
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace cabm {

// Position ids: BERT and DistilBERT count 0, 1, 2, ...; RoBERTa and XLM-R count from
// pad_token_id + 1 over the non-pad tokens (transformers' create_position_ids_from_input_ids).
enum class HfFamily { kBert, kRoberta, kDistilBert };
enum class HfHead { kNone, kSequenceClassification };
// hidden_act / activation: relu; gelu (exact, erf); gelu_new and gelu_pytorch_tanh (the tanh
// approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))).
enum class HfActivation { kRelu, kGelu, kGeluTanh };

struct HfEncoderConfig {
  std::string path;          // the config.json, for messages
  std::string model_type;    // bert | roberta | xlm-roberta | distilbert
  std::string architecture;  // e.g. BertForSequenceClassification
  HfFamily family = HfFamily::kBert;
  HfHead head = HfHead::kNone;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // E (DistilBERT: dim)
  int64_t num_layers = 0;         // L (n_layers)
  int64_t num_heads = 0;          // H (n_heads)
  int64_t intermediate_size = 0;  // F (hidden_dim)
  int64_t max_position_embeddings = 0;
  int64_t type_vocab_size = 0;  // 0 for DistilBERT (no token types)
  int64_t pad_token_id = 0;
  HfActivation activation = HfActivation::kGelu;
  float layer_norm_eps = 1e-12f;      // DistilBERT: fixed 1e-12 in transformers
  bool sinusoidal_pos_embds = false;  // DistilBERT only
  // Sequence classification: labels by id (id2label, else LABEL_i), and whether the scores are
  // independent sigmoids (problem_type multi_label_classification) rather than a softmax.
  std::vector<std::string> id2label;
  bool multi_label = false;

  // The prefix of the base model's tensors in a *ForSequenceClassification checkpoint.
  std::string base_prefix() const;  // "bert." | "roberta." | "distilbert."
  // The longest input the position table takes (RoBERTa: max_position_embeddings − pad − 1).
  int64_t max_tokens() const;
};

// Reads DIR/config.json. Errors: "DIR/config.json: 'hidden_act' is 'swish', expected one of ...".
HfEncoderConfig read_hf_config(const std::filesystem::path& model_dir);
// The same for a parsed document; `path` names it in messages.
HfEncoderConfig parse_hf_config(const nlohmann::json& config, const std::string& path);

// What sentence-transformers would do after the Transformer module.
enum class HfPooling { kMean, kCls, kNone };
struct SentenceTransformersConfig {
  bool present = false;  // DIR/modules.json exists
  HfPooling pooling = HfPooling::kMean;
  bool normalize = false;      // a sentence_transformers.models.Normalize module
  int64_t max_seq_length = 0;  // sentence_bert_config.json max_seq_length (0: none given)
};
// Reads modules.json and the files it names. Modules other than Transformer (path ""), Pooling
// (mean or cls token) and Normalize are refused, naming the module type or the pooling key.
SentenceTransformersConfig read_sentence_transformers_config(const std::filesystem::path& model_dir);
// sentence_bert_config.json's max_seq_length, or 0 when the file or the key is absent.
int64_t read_sentence_transformers_max_length(const std::filesystem::path& model_dir);

HfPooling parse_pooling(const std::string& name);  // mean | cls | none; cabm::Error otherwise
std::string activation_name(HfActivation activation);

}  // namespace cabm
