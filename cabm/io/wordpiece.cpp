#include "cabm/io/wordpiece.h"

#include "cabm/core/error.h"
#include "cabm/io/text_data.h"
#include "cabm/io/unicode_text.h"

namespace cabm {

bool is_bert_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

namespace {

bool is_bert_whitespace(char32_t c) {
  return c == U'\t' || c == U'\n' || c == U'\r' || unicode::is_whitespace(c);
}
bool is_bert_control(char32_t c) {
  return c != U'\t' && c != U'\n' && c != U'\r' && unicode::is_other(c);
}

// Rust's char::is_ascii_punctuation: !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~
bool is_ascii_punctuation(char32_t c) {
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
}

}  // namespace

std::u32string bert_normalize(std::u32string_view text, const BertNormalizerOptions& options) {
  std::u32string out;
  out.reserve(text.size());
  for (const char32_t c : text) {
    if (options.clean_text) {
      if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
      if (is_bert_whitespace(c)) {
        out.push_back(U' ');
        continue;
      }
    }
    if (options.handle_chinese_chars && is_bert_chinese_char(c)) {
      out.push_back(U' ');
      out.push_back(c);
      out.push_back(U' ');
      continue;
    }
    out.push_back(c);
  }
  if (options.strip_accents) {
    std::u32string decomposed = unicode::normalize(out, unicode::NormalForm::NFD);
    out.clear();
    for (const char32_t c : decomposed)
      if (!unicode::is_mark_nonspacing(c)) out.push_back(c);
  }
  if (options.lowercase) {
    std::u32string lower;
    lower.reserve(out.size());
    for (const char32_t c : out) unicode::append_lowercase(lower, c);
    out = std::move(lower);
  }
  return out;
}

std::vector<std::u32string> bert_pre_tokenize(std::u32string_view text) {
  std::vector<std::u32string> words;
  std::u32string word;
  for (const char32_t c : text) {
    if (unicode::is_whitespace(c)) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else if (is_ascii_punctuation(c) || unicode::is_punctuation(c)) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
      words.emplace_back(1, c);
    } else {
      word.push_back(c);
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

void WordPiece::tokenize(std::u32string_view word, std::vector<int64_t>& ids) const {
  if (static_cast<int64_t>(word.size()) > max_input_chars_per_word) {
    ids.push_back(unk_id);
    return;
  }
  const size_t first = ids.size();
  std::string piece;
  size_t start = 0;
  while (start < word.size()) {
    int64_t found = -1;
    size_t end = word.size();
    for (; end > start; --end) {
      piece = start > 0 ? continuing_subword_prefix : std::string();
      for (size_t i = start; i < end; ++i) unicode::append_utf8(piece, word[i]);
      if (const auto it = vocab.find(piece); it != vocab.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {  // no piece fits at `start`: the whole word is unknown
      ids.resize(first);
      ids.push_back(unk_id);
      return;
    }
    ids.push_back(found);
    start = end;
  }
}

std::unordered_map<std::string, int64_t> read_wordpiece_vocab(const std::string& path) {
  const std::string text = read_file_bytes(path);
  check_utf8_text(text, path);
  std::unordered_map<std::string, int64_t> vocab;
  int64_t id = 0;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string token = text.substr(at, end - at);
    if (!token.empty() && token.back() == '\r') token.pop_back();
    // transformers' load_vocab: token.rstrip("\n"); a repeated token keeps its last id.
    vocab[token] = id++;
    at = end + 1;
  }
  if (vocab.empty()) throw Error(fmt::format("{}: no tokens", path));
  return vocab;
}

}  // namespace cabm
