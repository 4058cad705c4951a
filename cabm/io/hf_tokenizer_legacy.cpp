// HfTokenizer's loader for the older files of a model directory, converted as transformers
// converts them when tokenizer.json is absent; and the helpers both loaders share.
#include "cabm/core/checked.h"
#include "cabm/core/error.h"
#include "cabm/io/hf_tokenizer_files.h"
#include "cabm/io/text_data.h"

#include <algorithm>

namespace cabm::hf_files {

namespace fs = std::filesystem;

json read_json(const fs::path& path) {
  const std::string text = read_file_bytes(path.string());
  try {
    json doc = json::parse(text);
    if (!doc.is_object()) throw Error(fmt::format("{}: not a JSON object", path.string()));
    return doc;
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", path.string(), e.what()));
  }
}

json read_optional_json(const fs::path& path) {
  return fs::exists(path) ? read_json(path) : json::object();
}

// A special token as tokenizer_config.json / special_tokens_map.json give it: a string, or an
// AddedToken object with "content".
std::optional<std::string> config_token(const Configs& c, const std::string& key) {
  for (const json* doc : {&c.tokenizer_config, &c.special_tokens}) {
    const auto it = doc->find(key);
    if (it == doc->end() || it->is_null()) continue;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

std::string config_token_or(const Configs& c, const std::string& key, const std::string& fallback) {
  return config_token(c, key).value_or(fallback);
}

int64_t json_integer(const json& v, const std::string& file, std::string_view key, int64_t min, int64_t max) {
  const std::string what = fmt::format("{}: {}", file, key);
  if (v.is_number_unsigned()) return checked_integer(v.get<uint64_t>(), min, max, what);
  if (v.is_number_integer()) return checked_integer(v.get<int64_t>(), min, max, what);
  throw_not_integer(v.dump(), min, max, what);
}

int64_t integer_or(const json& doc, const std::string& key, int64_t fallback, const std::string& file, int64_t min,
                   int64_t max) {
  const auto it = doc.find(key);
  return it == doc.end() || it->is_null() ? fallback : json_integer(*it, file, key, min, max);
}

bool class_is(const Configs& c, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return c.tokenizer_class == n; });
}

bool is_bert_like(const Configs& c) {
  return class_is(c, {"BertTokenizer", "DistilBertTokenizer"}) ||
         (c.tokenizer_class.empty() && (c.model_type == "bert" || c.model_type == "distilbert"));
}
bool is_roberta_like(const Configs& c) {
  return class_is(c, {"RobertaTokenizer"}) || (c.tokenizer_class.empty() && c.model_type == "roberta");
}

AddedToken special(const std::string& content, int64_t id, bool lstrip) {
  AddedToken t;
  t.content = unicode::decode_utf8(content, "special token");
  t.id = id;
  t.lstrip = lstrip;
  return t;
}

std::vector<TemplatePiece> wrap_template(int64_t first, int64_t last) {
  return {{false, false, {first}, 0}, {true, false, {}, 0}, {false, false, {last}, 0}};
}

std::vector<TemplatePiece> bert_pair_template(int64_t cls, int64_t sep) {
  return {{false, false, {cls}, 0},
          {true, false, {}, 0},
          {false, false, {sep}, 0},
          {true, true, {}, 1},
          {false, false, {sep}, 1}};
}

std::vector<TemplatePiece> roberta_pair_template(int64_t cls, int64_t sep) {
  return {{false, false, {cls}, 0},
          {true, false, {}, 0},
          {false, false, {sep, sep}, 0},
          {true, true, {}, 0},
          {false, false, {sep}, 0}};
}

int64_t vocab_id(const std::unordered_map<std::string, int64_t>& vocab, const std::string& token,
                 const std::string& file) {
  const auto it = vocab.find(token);
  if (it == vocab.end()) throw Error(fmt::format("{}: token '{}' is not in the vocabulary", file, token));
  return it->second;
}

std::unordered_map<std::string, int64_t> read_vocab_object(const json& vocab, const std::string& file) {
  if (!vocab.is_object()) throw Error(fmt::format("{}: the vocabulary is not an object of token: id", file));
  std::unordered_map<std::string, int64_t> out;
  out.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      throw Error(fmt::format("{}: token '{}' has no valid id", file, token));
    out.emplace(token, id.get<int64_t>());
  }
  return out;
}

NormalizerStep bert_step(bool clean_text, bool chinese, std::optional<bool> strip_accents, bool lowercase) {
  NormalizerStep step;
  step.kind = NormalizerStep::Kind::Bert;
  step.bert = {clean_text, chinese, strip_accents.value_or(lowercase), lowercase};
  return step;
}

// transformers' fast XLM-R tokenizer from sentencepiece.bpe.model (XLMRobertaConverter):
// Precompiled(the model's character map) → Strip(right) → Replace(" {2,}" → "▁"), Metaspace,
// a Unigram model over <s> <pad> </s> <unk>, the model's pieces from its fourth on, <mask>.
void convert_unigram(HfTokenizer::Impl& impl, const SentencePieceModel& spm, const std::string& file) {
  using Kind = NormalizerStep::Kind;
  impl.normalizers.clear();
  if (!spm.precompiled_charsmap().empty()) {
    NormalizerStep step;
    step.kind = Kind::Precompiled;
    step.charsmap =
        std::make_shared<const PrecompiledCharsMap>(PrecompiledCharsMap::parse(spm.precompiled_charsmap(), file));
    impl.normalizers.push_back(step);
  }
  NormalizerStep strip;
  strip.kind = Kind::Strip;
  strip.strip_right = true;
  impl.normalizers.push_back(strip);
  NormalizerStep replace;
  replace.kind = Kind::Replace;
  replace.replace_space_runs = true;
  replace.replace_to = U"\u2581";
  impl.normalizers.push_back(replace);
  impl.pre_tokenizer = HfTokenizer::Impl::PreTokenizer::Metaspace;
  impl.metaspace_prepend =
      spm.add_dummy_prefix() ? HfTokenizer::Impl::Prepend::Always : HfTokenizer::Impl::Prepend::Never;
  impl.model = HfTokenizer::Impl::Model::Unigram;
  UnigramModel& unigram = impl.unigram;
  for (const char* special : {"<s>", "<pad>", "</s>", "<unk>"}) unigram.add(special, 0.0);
  for (int64_t id = 3; id < spm.piece_count(); ++id) unigram.add(spm.piece(id), spm.score(id));
  unigram.add("<mask>", 0.0);
  unigram.finish();
  unigram.unk_id = SentencePieceModel::kUnk;
  // Control and user-defined pieces are added tokens, matched in the raw text.
  for (const int64_t id : spm.control_and_user_defined()) {
    const std::string content = spm.piece(id);
    const auto it = unigram.ids.find(content);
    const bool known = std::any_of(impl.added_tokens.begin(), impl.added_tokens.end(),
                                   [&](const AddedToken& t) { return unicode::encode_utf8(t.content) == content; });
    if (it != unigram.ids.end() && !known && !content.empty())
      impl.added_tokens.push_back(special(content, it->second));
  }
}

void load_sentencepiece(HfTokenizer::Impl& impl, const Configs& c) {
  const fs::path path = c.dir / "sentencepiece.bpe.model";
  if (!c.tokenizer_class.empty() && !class_is(c, {"XLMRobertaTokenizer"}))
    throw Error(
        fmt::format("{}: tokenizer_class '{}' with a SentencePiece model is not supported (XLMRobertaTokenizer)",
                    (c.dir / "tokenizer_config.json").string(), c.tokenizer_class));
  impl.model = HfTokenizer::Impl::Model::SentencePiece;
  impl.sentencepiece = SentencePieceModel::load(path.string());
  const SentencePieceModel& spm = *impl.sentencepiece;
  const std::string mask = config_token_or(c, "mask_token", "<mask>");
  impl.added_tokens = {special("<s>", SentencePieceModel::kBos), special("<pad>", SentencePieceModel::kPad),
                       special("</s>", SentencePieceModel::kEos), special("<unk>", SentencePieceModel::kUnk),
                       special(mask, spm.piece_count() + SentencePieceModel::kFairseqOffset, true)};
  impl.single_template = wrap_template(SentencePieceModel::kBos, SentencePieceModel::kEos);
  impl.pair_template = roberta_pair_template(SentencePieceModel::kBos, SentencePieceModel::kEos);
  impl.pad_id = SentencePieceModel::kPad;
  impl.description = "SentencePiece (" + path.string() + ")";
  if (spm.is_unigram() && mask == "<mask>") {
    convert_unigram(impl, spm, path.string());
    impl.description = "Unigram (" + path.string() + ", converted as transformers' fast tokenizer)";
  }
}

void load_vocab_txt(HfTokenizer::Impl& impl, const Configs& c) {
  const std::string file = (c.dir / "vocab.txt").string();
  impl.model = HfTokenizer::Impl::Model::WordPiece;
  impl.pre_tokenizer = HfTokenizer::Impl::PreTokenizer::Bert;
  WordPiece& wp = impl.wordpiece;
  wp.vocab = read_wordpiece_vocab(file);
  const json& tc = c.tokenizer_config;
  const json sa = tc.value("strip_accents", json());
  impl.normalizers = {bert_step(true, get_or(tc, "tokenize_chinese_chars", true),
                                sa.is_null() ? std::nullopt : std::optional<bool>(sa.get<bool>()),
                                get_or(tc, "do_lower_case", true))};
  wp.unk_token = config_token_or(c, "unk_token", "[UNK]");
  wp.unk_id = vocab_id(wp.vocab, wp.unk_token, file);
  for (const char* key : {"pad_token", "unk_token", "cls_token", "sep_token", "mask_token"}) {
    const auto token = config_token(c, key);
    const std::string content = token.value_or(key == std::string("pad_token")   ? "[PAD]"
                                               : key == std::string("unk_token") ? "[UNK]"
                                               : key == std::string("cls_token") ? "[CLS]"
                                               : key == std::string("sep_token") ? "[SEP]"
                                                                                 : "[MASK]");
    if (const auto it = wp.vocab.find(content); it != wp.vocab.end())
      impl.added_tokens.push_back(special(content, it->second));
  }
  const int64_t cls = vocab_id(wp.vocab, config_token_or(c, "cls_token", "[CLS]"), file);
  const int64_t sep = vocab_id(wp.vocab, config_token_or(c, "sep_token", "[SEP]"), file);
  impl.single_template = wrap_template(cls, sep);
  impl.pair_template = bert_pair_template(cls, sep);
  impl.description = "WordPiece (" + file + ")";
}

void load_bpe_files(HfTokenizer::Impl& impl, const Configs& c) {
  const std::string vocab_file = (c.dir / "vocab.json").string(), merges_file = (c.dir / "merges.txt").string();
  if (!c.tokenizer_class.empty() && !class_is(c, {"RobertaTokenizer"}))
    throw Error(
        fmt::format("{}: tokenizer_class '{}' with vocab.json + merges.txt is not supported "
                    "(RobertaTokenizer)",
                    (c.dir / "tokenizer_config.json").string(), c.tokenizer_class));
  impl.model = HfTokenizer::Impl::Model::BytePair;
  impl.pre_tokenizer = HfTokenizer::Impl::PreTokenizer::ByteLevel;
  impl.add_prefix_space = get_or(c.tokenizer_config, "add_prefix_space", false);
  BytePairEncoding& bpe = impl.bpe;
  bpe.vocab = read_vocab_object(read_json(c.dir / "vocab.json"), vocab_file);
  const std::string merges = read_file_bytes(merges_file);
  check_utf8_text(merges, merges_file);
  int64_t rank = 0;
  size_t at = 0;
  for (bool first = true; at < merges.size(); first = false) {
    size_t end = merges.find('\n', at);
    if (end == std::string::npos) end = merges.size();
    std::string line = merges.substr(at, end - at);
    at = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if ((first && line.starts_with("#version")) || line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      throw Error(fmt::format("{}: line '{}' is not a merge 'LEFT RIGHT'", merges_file, line));
    bpe.add_merge(line.substr(0, space), line.substr(space + 1), rank++, merges_file);
  }
  const std::string cls = config_token_or(c, "cls_token", "<s>"), sep = config_token_or(c, "sep_token", "</s>");
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "cls_token", "pad_token", "mask_token"}) {
    const std::string k = key;
    const std::string fallback = k == "bos_token" || k == "cls_token"   ? "<s>"
                                 : k == "eos_token" || k == "sep_token" ? "</s>"
                                 : k == "unk_token"                     ? "<unk>"
                                 : k == "pad_token"                     ? "<pad>"
                                                                        : "<mask>";
    const std::string content = config_token_or(c, k, fallback);
    const auto it = bpe.vocab.find(content);
    if (it == bpe.vocab.end()) continue;
    const bool duplicate = std::any_of(impl.added_tokens.begin(), impl.added_tokens.end(),
                                       [&](const AddedToken& t) { return t.id == it->second; });
    if (!duplicate) impl.added_tokens.push_back(special(content, it->second, k == "mask_token"));
  }
  impl.single_template = wrap_template(vocab_id(bpe.vocab, cls, vocab_file), vocab_id(bpe.vocab, sep, vocab_file));
  impl.pair_template =
      roberta_pair_template(vocab_id(bpe.vocab, cls, vocab_file), vocab_id(bpe.vocab, sep, vocab_file));
  impl.description = "byte-level BPE (" + vocab_file + ", " + merges_file + ")";
}

// Without tokenizer.json, transformers takes each added token's lstrip, rstrip, single_word and
// normalized from tokenizer_config.json's added_tokens_decoder ({"id": {"content", ...}}), and
// adds the tokens it lists that the vocabulary files do not have.
void apply_added_tokens_decoder(HfTokenizer::Impl& impl, const Configs& c) {
  const auto it = c.tokenizer_config.find("added_tokens_decoder");
  if (it == c.tokenizer_config.end() || !it->is_object()) return;
  const std::string file = (c.dir / "tokenizer_config.json").string();
  for (const auto& [key, entry] : it->items()) {
    AddedToken token;
    try {
      token.id = std::stoll(key);
    } catch (const std::exception&) {
      throw Error(fmt::format("{}: added_tokens_decoder key '{}' is not an id", file, key));
    }
    token.content = unicode::decode_utf8(entry.at("content").get<std::string>(), file);
    token.lstrip = get_or(entry, "lstrip", false);
    token.rstrip = get_or(entry, "rstrip", false);
    token.single_word = get_or(entry, "single_word", false);
    token.normalized = get_or(entry, "normalized", false);
    if (token.normalized) token.content = impl.normalize(token.content);
    const auto same = std::find_if(impl.added_tokens.begin(), impl.added_tokens.end(),
                                   [&](const AddedToken& t) { return t.id == token.id; });
    if (same != impl.added_tokens.end())
      *same = token;
    else if (!token.content.empty())
      impl.added_tokens.push_back(token);
  }
}

}  // namespace cabm::hf_files
