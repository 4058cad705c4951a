// The files of a Hugging Face model directory as the tokenizer loader reads them, shared by
// hf_tokenizer_load.cpp (tokenizer.json) and hf_tokenizer_legacy.cpp (vocab.txt, vocab.json +
// merges.txt, sentencepiece.bpe.model). Not part of the interface.
#pragma once

#include "cabm/io/hf_tokenizer_impl.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace cabm::hf_files {

using nlohmann::json;

inline constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// The files of a directory that say how transformers sets the tokenizer up.
struct Configs {
  std::filesystem::path dir;
  json tokenizer_config;        // tokenizer_config.json
  json special_tokens;          // special_tokens_map.json
  json model_config;            // config.json
  std::string tokenizer_class;  // without "Fast"
  std::string model_type;       // config.json's model_type
};

json read_json(const std::filesystem::path& path);           // a JSON object, or an Error naming the file
json read_optional_json(const std::filesystem::path& path);  // {} when the file is absent

// A special token as tokenizer_config.json / special_tokens_map.json give it: a string, or an
// AddedToken object with "content".
std::optional<std::string> config_token(const Configs& c, const std::string& key);
std::string config_token_or(const Configs& c, const std::string& key, const std::string& fallback);

// A JSON integer in [min, max]. Anything else is an Error naming `file` and `key`: a float (1e30
// would make nlohmann's get<int64_t> an undefined conversion), a string, a value out of range.
int64_t json_integer(const json& v, const std::string& file, std::string_view key, int64_t min, int64_t max);
// The same for doc[key], `fallback` when it is absent or null.
int64_t integer_or(const json& doc, const std::string& key, int64_t fallback, const std::string& file, int64_t min,
                   int64_t max);

// A value of a non-integer type T (bool, string, double) or `fallback`; integers: integer_or.
template <typename T>
T get_or(const json& doc, const std::string& key, T fallback) {
  static_assert(!std::is_integral_v<T> || std::is_same_v<T, bool>, "integers: integer_or, range-checked");
  const auto it = doc.find(key);
  return it == doc.end() || it->is_null() ? fallback : it->get<T>();
}

bool class_is(const Configs& c, std::initializer_list<const char*> names);
bool is_bert_like(const Configs& c);
bool is_roberta_like(const Configs& c);
AddedToken special(const std::string& content, int64_t id, bool lstrip = false);
std::vector<TemplatePiece> wrap_template(int64_t first, int64_t last);  // first $A last
// A pair as BERT has it: cls $A sep $B sep, type ids 0 through the first sep, 1 after it
// (BertProcessing; transformers' BertConverter's template).
std::vector<TemplatePiece> bert_pair_template(int64_t cls, int64_t sep);
// A pair as RoBERTa and XLM-R have it: cls $A sep sep $B sep, type ids all 0 (RobertaProcessing;
// transformers' XLMRobertaConverter's template, which gives no type ids).
std::vector<TemplatePiece> roberta_pair_template(int64_t cls, int64_t sep);
int64_t vocab_id(const std::unordered_map<std::string, int64_t>& vocab, const std::string& token,
                 const std::string& file);
std::unordered_map<std::string, int64_t> read_vocab_object(const json& vocab, const std::string& file);
NormalizerStep bert_step(bool clean_text, bool chinese, std::optional<bool> strip_accents, bool lowercase);

// The older files (hf_tokenizer_legacy.cpp).
void load_vocab_txt(HfTokenizer::Impl& impl, const Configs& c);
void load_bpe_files(HfTokenizer::Impl& impl, const Configs& c);
void load_sentencepiece(HfTokenizer::Impl& impl, const Configs& c);
void apply_added_tokens_decoder(HfTokenizer::Impl& impl, const Configs& c);

}  // namespace cabm::hf_files
