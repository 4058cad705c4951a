// HfTokenizer::load: a Hugging Face model directory's tokenizer files → HfTokenizer::Impl.
// tokenizer.json here; the older files in hf_tokenizer_legacy.cpp.
#include "cabm/core/checked.h"
#include "cabm/core/error.h"
#include "cabm/io/hf_tokenizer_files.h"
#include "cabm/io/text_data.h"

#include <algorithm>

namespace cabm {

namespace fs = std::filesystem;
using namespace hf_files;  // the loaders' shared helpers (hf_tokenizer_files.h)

namespace {

// Sequences inside sequences: far more than any tokenizer has, few enough for the stack.
constexpr int kMaxNesting = 16;

void check_nesting(int depth, const std::string& file) {
  if (depth > kMaxNesting) throw Error(fmt::format("{}: Sequence nested more than {} deep", file, kMaxNesting));
}

void parse_normalizer(const json& n, const std::string& file, std::vector<NormalizerStep>& steps, int depth = 0) {
  check_nesting(depth, file);
  if (n.is_null()) return;
  const std::string type = get_or<std::string>(n, "type", "");
  NormalizerStep step;
  if (type == "BertNormalizer") {
    const json& sa = n.contains("strip_accents") ? n["strip_accents"] : json();
    steps.push_back(bert_step(get_or(n, "clean_text", true), get_or(n, "handle_chinese_chars", true),
                              sa.is_null() ? std::nullopt : std::optional<bool>(sa.get<bool>()),
                              get_or(n, "lowercase", true)));
    return;
  }
  if (type == "Sequence") {
    for (const json& inner : n.at("normalizers")) parse_normalizer(inner, file, steps, depth + 1);
    return;
  }
  if (type == "Lowercase") {
    step.kind = NormalizerStep::Kind::Lowercase;
  } else if (type == "StripAccents") {
    step.kind = NormalizerStep::Kind::StripAccents;
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = NormalizerStep::Kind::Form;
    step.form = type == "NFC"    ? unicode::NormalForm::NFC
                : type == "NFD"  ? unicode::NormalForm::NFD
                : type == "NFKC" ? unicode::NormalForm::NFKC
                                 : unicode::NormalForm::NFKD;
  } else if (type == "Precompiled") {
    step.kind = NormalizerStep::Kind::Precompiled;
    const std::string blob = base64_decode(n.at("precompiled_charsmap").get<std::string>(), file);
    step.charsmap = std::make_shared<const PrecompiledCharsMap>(PrecompiledCharsMap::parse(blob, file));
  } else if (type == "Strip") {
    step.kind = NormalizerStep::Kind::Strip;
    step.strip_left = get_or(n, "strip_left", true);
    step.strip_right = get_or(n, "strip_right", true);
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::Replace;
    const json& pattern = n.at("pattern");
    step.replace_to = unicode::decode_utf8(n.at("content").get<std::string>(), file);
    if (pattern.contains("String")) {
      step.replace_from = unicode::decode_utf8(pattern["String"].get<std::string>(), file);
    } else if (pattern.value("Regex", std::string()) == " {2,}") {
      step.replace_space_runs = true;
    } else {
      throw Error(
          fmt::format("{}: Replace normalizer with pattern {} is not supported (a string, or the regex "
                      "\" {{2,}}\")",
                      file, pattern.dump()));
    }
  } else {
    throw Error(
        fmt::format("{}: normalizer '{}' is not supported (BertNormalizer, Lowercase, StripAccents, NFC, "
                    "NFD, NFKC, NFKD, Precompiled, Strip, Replace, Sequence)",
                    file, type));
  }
  steps.push_back(step);
}

void parse_pre_tokenizer(const json& p, const std::string& file, HfTokenizer::Impl& impl, int depth = 0) {
  check_nesting(depth, file);
  if (p.is_null()) return;
  const std::string type = get_or<std::string>(p, "type", "");
  if (type == "BertPreTokenizer") {
    impl.pre_tokenizer = HfTokenizer::Impl::PreTokenizer::Bert;
  } else if (type == "ByteLevel") {
    impl.pre_tokenizer = HfTokenizer::Impl::PreTokenizer::ByteLevel;
    impl.add_prefix_space = get_or(p, "add_prefix_space", true);
    impl.use_regex = get_or(p, "use_regex", true);
  } else if (type == "Metaspace") {
    impl.pre_tokenizer = HfTokenizer::Impl::PreTokenizer::Metaspace;
    const std::u32string replacement = unicode::decode_utf8(get_or<std::string>(p, "replacement", "\u2581"), file);
    if (replacement.size() != 1) throw Error(fmt::format("{}: Metaspace replacement must be one character", file));
    impl.metaspace_replacement = replacement[0];
    using Prepend = HfTokenizer::Impl::Prepend;
    const std::string scheme = p.contains("prepend_scheme")
                                   ? p["prepend_scheme"].get<std::string>()
                                   : (get_or(p, "add_prefix_space", true) ? "always" : "never");
    if (scheme == "always") {
      impl.metaspace_prepend = Prepend::Always;
    } else if (scheme == "first") {
      impl.metaspace_prepend = Prepend::First;
    } else if (scheme == "never") {
      impl.metaspace_prepend = Prepend::Never;
    } else {
      throw Error(fmt::format("{}: Metaspace prepend_scheme '{}' is not supported", file, scheme));
    }
    impl.metaspace_split = get_or(p, "split", true);
  } else if (type == "Sequence" && p.at("pretokenizers").size() == 1) {
    parse_pre_tokenizer(p["pretokenizers"][0], file, impl, depth + 1);
  } else {
    throw Error(
        fmt::format("{}: pre_tokenizer '{}' is not supported (BertPreTokenizer, ByteLevel, Metaspace)", file, type));
  }
}

// One of TemplateProcessing's templates ("single" or "pair"): special tokens and sequences. Each
// sequence may appear once (truncation leaves room for the special tokens only, so a second copy
// would exceed max_length); "single" holds A only, "pair" A and B (the library drops one it
// lacks). A problem is returned as a message, empty when there is none.
std::string parse_template(const json& items, const json& specials, const std::string& file, const std::string& key,
                           std::vector<TemplatePiece>& pieces) {
  pieces.clear();
  if (!items.is_array()) return fmt::format("{}: post_processor's '{}' template is not a list", file, key);
  for (const json& item : items) {
    TemplatePiece piece;
    if (item.contains("Sequence")) {
      const std::string id = item["Sequence"].value("id", std::string("A"));
      if (id != "A" && (id != "B" || key == "single"))
        return fmt::format("{}: post_processor's '{}' template uses sequence '{}'; only {} an input", file, key, id,
                           key == "single" ? "A is" : "A and B are");
      piece.sequence = true;
      piece.second = id == "B";
      for (const TemplatePiece& earlier : pieces)
        if (earlier.sequence && earlier.second == piece.second)
          return fmt::format("{}: post_processor's '{}' template holds the sequence more than once", file, key);
      piece.type_id = integer_or(item.at("Sequence"), "type_id", 0, file, 0, kInt64Max);
    } else {
      const json& s = item.at("SpecialToken");
      const std::string name = s.at("id").get<std::string>();
      if (!specials.contains(name))
        throw Error(fmt::format("{}: post_processor uses special token '{}' that it does not define", file, name));
      const json& ids = specials[name].at("ids");
      if (!ids.is_array())
        throw Error(fmt::format("{}: post_processor special token '{}': ids is not an array", file, name));
      for (const json& id : ids)
        piece.ids.push_back(json_integer(id, file, "post_processor special token id", 0, kInt64Max));
      piece.type_id = integer_or(s, "type_id", 0, file, 0, kInt64Max);
    }
    pieces.push_back(piece);
  }
  return "";
}

// TemplateProcessing / RobertaProcessing / BertProcessing / ByteLevel → the single and pair
// templates.
void parse_post_processor(const json& p, const std::string& file, HfTokenizer::Impl& impl, int depth = 0) {
  check_nesting(depth, file);
  if (p.is_null()) return;
  const std::string type = get_or<std::string>(p, "type", "");
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const int64_t cls = json_integer(p.at("cls").at(1), file, "post_processor cls id", 0, kInt64Max);
    const int64_t sep = json_integer(p.at("sep").at(1), file, "post_processor sep id", 0, kInt64Max);
    impl.single_template = wrap_template(cls, sep);
    impl.pair_template = type == "BertProcessing" ? bert_pair_template(cls, sep) : roberta_pair_template(cls, sep);
    impl.pair_template_error.clear();
  } else if (type == "TemplateProcessing") {
    const json& specials = p.at("special_tokens");
    if (const std::string error = parse_template(p.at("single"), specials, file, "single", impl.single_template);
        !error.empty())
      throw Error(error);
    // A bad pair template does not stop single inputs; pairs are refused with its message.
    impl.pair_template_error = p.contains("pair")
                                   ? parse_template(p["pair"], specials, file, "pair", impl.pair_template)
                                   : fmt::format("{}: post_processor has no 'pair' template", file);
  } else if (type == "Sequence") {
    for (const json& inner : p.at("processors")) parse_post_processor(inner, file, impl, depth + 1);
  } else if (type != "ByteLevel") {  // ByteLevel post-processing only trims offsets
    throw Error(fmt::format(
        "{}: post_processor '{}' is not supported (TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel)",
        file, type));
  }
}

void parse_tokenizer_json(HfTokenizer::Impl& impl, const Configs& c, const json& doc, const std::string& file) {
  try {
    const json& model = doc.at("model");
    const std::string type = get_or<std::string>(model, "type", "");
    if (type == "Unigram") {
      impl.model = HfTokenizer::Impl::Model::Unigram;
      if (get_or(model, "byte_fallback", false))
        throw Error(fmt::format("{}: Unigram with byte_fallback is not supported", file));
      for (const json& entry : model.at("vocab"))
        impl.unigram.add(entry.at(0).get<std::string>(), entry.at(1).get<double>());
      impl.unigram.finish();
      const json unk = model.value("unk_id", json());
      if (!unk.is_number_integer() || unk.get<int64_t>() < 0 ||
          unk.get<int64_t>() >= static_cast<int64_t>(impl.unigram.scores.size()))
        throw Error(fmt::format("{}: Unigram model without a valid unk_id", file));
      impl.unigram.unk_id = unk.get<int64_t>();
    } else if (type == "WordPiece") {
      impl.model = HfTokenizer::Impl::Model::WordPiece;
      WordPiece& wp = impl.wordpiece;
      wp.vocab = read_vocab_object(model.at("vocab"), file);
      wp.unk_token = get_or<std::string>(model, "unk_token", "[UNK]");
      wp.unk_id = vocab_id(wp.vocab, wp.unk_token, file);
      wp.continuing_subword_prefix = get_or<std::string>(model, "continuing_subword_prefix", "##");
      wp.max_input_chars_per_word = integer_or(model, "max_input_chars_per_word", 100, file, 0, kInt64Max);
    } else if (type == "BPE") {
      impl.model = HfTokenizer::Impl::Model::BytePair;
      BytePairEncoding& bpe = impl.bpe;
      bpe.vocab = read_vocab_object(model.at("vocab"), file);
      if (!get_or<std::string>(model, "continuing_subword_prefix", "").empty() ||
          !get_or<std::string>(model, "end_of_word_suffix", "").empty() || !model.value("dropout", json()).is_null() ||
          get_or(model, "byte_fallback", false))
        throw Error(
            fmt::format("{}: BPE with continuing_subword_prefix, end_of_word_suffix, dropout or byte_fallback "
                        "is not supported",
                        file));
      if (const auto unk = get_or<std::string>(model, "unk_token", ""); !unk.empty())
        bpe.unk_id = vocab_id(bpe.vocab, unk, file);
      bpe.fuse_unk = get_or(model, "fuse_unk", false);
      bpe.ignore_merges = get_or(model, "ignore_merges", false);
      int64_t rank = 0;
      for (const json& merge : model.at("merges")) {
        std::string left, right;
        if (merge.is_string()) {
          const std::string s = merge.get<std::string>();
          const size_t space = s.find(' ');
          if (space == std::string::npos) throw Error(fmt::format("{}: merge {} '{}' has no space", file, rank + 1, s));
          left = s.substr(0, space);
          right = s.substr(space + 1);
        } else {
          left = merge.at(0).get<std::string>();
          right = merge.at(1).get<std::string>();
        }
        bpe.add_merge(left, right, rank++, file);
      }
    } else {
      throw Error(fmt::format("{}: model type '{}' is not supported (WordPiece, BPE, Unigram)", file, type));
    }
    parse_normalizer(doc.value("normalizer", json()), file, impl.normalizers);
    parse_pre_tokenizer(doc.value("pre_tokenizer", json()), file, impl);
    using PT = HfTokenizer::Impl::PreTokenizer;
    if (impl.model == HfTokenizer::Impl::Model::WordPiece && impl.pre_tokenizer != PT::Bert)
      throw Error(fmt::format("{}: a WordPiece model is supported behind the BertPreTokenizer only", file));
    if (impl.model == HfTokenizer::Impl::Model::BytePair && impl.pre_tokenizer != PT::ByteLevel)
      throw Error(fmt::format("{}: a BPE model is supported behind the ByteLevel pre-tokenizer only", file));
    if (impl.model == HfTokenizer::Impl::Model::Unigram && impl.pre_tokenizer != PT::Metaspace &&
        impl.pre_tokenizer != PT::None)
      throw Error(fmt::format("{}: a Unigram model is supported behind the Metaspace pre-tokenizer only", file));
    parse_post_processor(doc.value("post_processor", json()), file, impl);

    // transformers' BertTokenizerFast / RobertaTokenizerFast re-apply their own arguments
    // (from tokenizer_config.json, else their defaults) over tokenizer.json's.
    const json& tc = c.tokenizer_config;
    if (is_bert_like(c) && impl.normalizers.size() == 1 && impl.normalizers[0].kind == NormalizerStep::Kind::Bert) {
      const bool lower = get_or(tc, "do_lower_case", true);
      const json sa = tc.value("strip_accents", json());
      impl.normalizers[0] = bert_step(impl.normalizers[0].bert.clean_text, get_or(tc, "tokenize_chinese_chars", true),
                                      sa.is_null() ? std::nullopt : std::optional<bool>(sa.get<bool>()), lower);
    }
    if (is_roberta_like(c) && impl.pre_tokenizer == PT::ByteLevel)
      impl.add_prefix_space = get_or(tc, "add_prefix_space", false);

    for (const json& t : doc.value("added_tokens", json::array())) {
      AddedToken token;
      token.content = unicode::decode_utf8(t.at("content").get<std::string>(), file);
      token.id = json_integer(t.at("id"), file, "added_tokens id", 0, kInt64Max);
      token.single_word = get_or(t, "single_word", false);
      token.lstrip = get_or(t, "lstrip", false);
      token.rstrip = get_or(t, "rstrip", false);
      token.normalized = get_or(t, "normalized", false);
      if (token.normalized) token.content = impl.normalize(token.content);
      if (!token.content.empty()) impl.added_tokens.push_back(token);
    }
    if (doc.contains("padding") && doc["padding"].is_object())
      impl.pad_id = integer_or(doc["padding"], "pad_id", 0, file, 0, kInt64Max);
    impl.description = (type == "WordPiece" ? "WordPiece ("
                        : type == "BPE"     ? "byte-level BPE ("
                                            : "Unigram (") +
                       file + ")";
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: {}", file, e.what()));
  }
}

void load_tokenizer_json(HfTokenizer::Impl& impl, const Configs& c) {
  const fs::path path = c.dir / "tokenizer.json";
  parse_tokenizer_json(impl, c, read_json(path), path.string());
}

// The pad token's id: tokenizer_config.json / special_tokens_map.json name it.
void resolve_pad(HfTokenizer::Impl& impl, const Configs& c, bool from_tokenizer_json) {
  using M = HfTokenizer::Impl::Model;
  const auto named = config_token(c, "pad_token");
  if (!named && (from_tokenizer_json || impl.model == M::SentencePiece)) return;  // keep what the file said
  const std::string pad = named.value_or(impl.model == M::WordPiece ? "[PAD]" : "<pad>");
  const std::u32string content = unicode::decode_utf8(pad, "pad_token");
  for (const AddedToken& t : impl.added_tokens)
    if (t.content == content) {
      impl.pad_id = t.id;
      return;
    }
  const auto& vocab = impl.model == M::WordPiece ? impl.wordpiece.vocab
                      : impl.model == M::Unigram ? impl.unigram.ids
                                                 : impl.bpe.vocab;
  if (impl.model != M::SentencePiece) {
    if (const auto it = vocab.find(pad); it != vocab.end()) {
      impl.pad_id = it->second;
      return;
    }
  } else if (const int64_t id = impl.sentencepiece->piece_id(pad); id >= 0) {
    impl.pad_id = id;
    return;
  }
  throw Error(fmt::format("{}: pad token '{}' is not in the vocabulary", c.dir.string(), pad));
}

// transformers' model_input_names: tokenizer_config.json's, else the tokenizer class's.
bool resolve_token_types(const HfTokenizer::Impl& impl, const Configs& c) {
  if (const auto it = c.tokenizer_config.find("model_input_names"); it != c.tokenizer_config.end() && it->is_array())
    return std::find(it->begin(), it->end(), "token_type_ids") != it->end();
  if (!c.tokenizer_class.empty())
    return !class_is(c, {"DistilBertTokenizer", "RobertaTokenizer", "XLMRobertaTokenizer", "CamembertTokenizer",
                         "GPT2Tokenizer", "MPNetTokenizer", "BartTokenizer", "LongformerTokenizer"});
  if (!c.model_type.empty()) return c.model_type == "bert";
  return impl.model == HfTokenizer::Impl::Model::WordPiece;
}

int64_t resolve_max_length(const Configs& c) {
  if (const auto it = c.tokenizer_config.find("model_max_length"); it != c.tokenizer_config.end() && it->is_number()) {
    const double v = it->get<double>();
    if (v >= 1 && v < 1e18) return static_cast<int64_t>(v);  // transformers: >= 1e20 means "none"
  }
  if (const auto it = c.model_config.find("max_position_embeddings");
      it != c.model_config.end() && it->is_number_integer()) {
    const std::string config = (c.dir / "config.json").string();
    int64_t n = json_integer(*it, config, "max_position_embeddings", 0, kInt64Max / 2);
    // RoBERTa-style models number positions from padding_idx + 1.
    if (c.model_type == "roberta" || c.model_type == "xlm-roberta" || c.model_type == "camembert")
      n -= integer_or(c.model_config, "pad_token_id", 1, config, -1, kInt64Max / 2) + 1;
    if (n >= 1) return n;
  }
  return kNoLimit;
}

}  // namespace

HfTokenizer HfTokenizer::load(const fs::path& model_dir) {
  std::error_code ec;
  if (!fs::exists(model_dir, ec)) throw Error(fmt::format("{}: no such directory", model_dir.string()));
  if (!fs::is_directory(model_dir, ec)) throw Error(fmt::format("{}: not a directory", model_dir.string()));
  Configs c;
  c.dir = model_dir;
  c.tokenizer_config = read_optional_json(model_dir / "tokenizer_config.json");
  c.special_tokens = read_optional_json(model_dir / "special_tokens_map.json");
  c.model_config = read_optional_json(model_dir / "config.json");
  try {
    c.tokenizer_class = get_or<std::string>(c.tokenizer_config, "tokenizer_class", "");
    c.model_type = get_or<std::string>(c.model_config, "model_type", "");
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: tokenizer_class or model_type is not a string ({})", model_dir.string(), e.what()));
  }
  if (c.tokenizer_class.ends_with("Fast")) c.tokenizer_class.resize(c.tokenizer_class.size() - 4);

  auto impl = std::make_shared<Impl>();
  impl->source = model_dir.string();
  const bool from_json = fs::exists(model_dir / "tokenizer.json");
  try {
    if (from_json) {
      try {
        load_tokenizer_json(*impl, c);
      } catch (const Error&) {
        // A tokenizer.json that cabm does not run, beside the SentencePiece model it came from.
        if (!fs::exists(model_dir / "sentencepiece.bpe.model")) throw;
        *impl = Impl();
        impl->source = model_dir.string();
        load_sentencepiece(*impl, c);
      }
    } else if (fs::exists(model_dir / "vocab.txt")) {
      load_vocab_txt(*impl, c);
    } else if (fs::exists(model_dir / "vocab.json") && fs::exists(model_dir / "merges.txt")) {
      load_bpe_files(*impl, c);
    } else if (fs::exists(model_dir / "sentencepiece.bpe.model")) {
      load_sentencepiece(*impl, c);
    } else {
      throw Error(
          fmt::format("{}: no tokenizer files (tokenizer.json, vocab.txt, vocab.json + merges.txt or "
                      "sentencepiece.bpe.model)",
                      model_dir.string()));
    }
    if (!from_json) apply_added_tokens_decoder(*impl, c);
    resolve_pad(*impl, c, from_json);
    impl->token_types = resolve_token_types(*impl, c);
    impl->max_length = resolve_max_length(c);
  } catch (const json::exception& e) {  // a config value of the wrong JSON type
    throw Error(fmt::format("{}: unexpected value in a tokenizer file ({})", model_dir.string(), e.what()));
  }
  return finish(std::move(impl));
}

HfTokenizer HfTokenizer::from_tokenizer_json(std::string_view text, const std::string& source) {
  Configs c;
  c.dir = source;
  auto impl = std::make_shared<Impl>();
  impl->source = source;
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", source, e.what()));
  }
  if (!doc.is_object()) throw Error(fmt::format("{}: not a JSON object", source));
  parse_tokenizer_json(*impl, c, doc, source);
  impl->token_types = resolve_token_types(*impl, c);
  impl->max_length = kNoLimit;
  return finish(std::move(impl));
}

HfTokenizer HfTokenizer::finish(std::shared_ptr<Impl> impl) {
  // Longest first: the leftmost match is the longest one (tokenizers' LeftmostLongest).
  std::stable_sort(impl->added_tokens.begin(), impl->added_tokens.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (const auto* pieces : {&impl->single_template, &impl->pair_template})
    for (const TemplatePiece& piece : *pieces)
      for (const int64_t id : piece.ids)
        if (id < 0) throw Error(fmt::format("{}: special token id {} is negative", impl->source, id));
  HfTokenizer tokenizer;
  tokenizer.impl_ = std::move(impl);
  return tokenizer;
}

}  // namespace cabm
