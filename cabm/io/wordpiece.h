// BERT's tokenisation as Hugging Face's `tokenizers` runs it: the BertNormalizer, the
// BertPreTokenizer and the WordPiece model (Devlin et al. 2019; Wu et al. 2016), on code points.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cabm {

// BertNormalizer, in this order: clean_text drops NUL, U+FFFD and Cc/Cf/Co characters except
// \t \n \r, and turns whitespace into ' '; handle_chinese_chars puts ' ' around CJK
// ideographs; strip_accents is NFD then dropping Mn; lowercase is per-character to_lowercase.
// (tokenizer.json's "strip_accents": null means "as lowercase"; the loader resolves it.)
struct BertNormalizerOptions {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  bool strip_accents = true;
  bool lowercase = true;
};
std::u32string bert_normalize(std::u32string_view text, const BertNormalizerOptions& options);

// The CJK ideograph blocks BERT puts spaces around (not Hangul, Hiragana or Katakana).
bool is_bert_chinese_char(char32_t c);

// BertPreTokenizer: split on whitespace (dropped), and every punctuation character (ASCII
// punctuation or Unicode P*) is a word of its own.
std::vector<std::u32string> bert_pre_tokenize(std::u32string_view text);

// Greedy longest-match-first WordPiece: a word longer than max_input_chars_per_word characters,
// or one with a position where no vocabulary entry matches, is the one unknown token. Pieces
// after the first carry continuing_subword_prefix ("##").
struct WordPiece {
  std::unordered_map<std::string, int64_t> vocab;  // UTF-8 token → id
  int64_t unk_id = -1;
  std::string unk_token = "[UNK]";
  std::string continuing_subword_prefix = "##";
  int64_t max_input_chars_per_word = 100;

  void tokenize(std::u32string_view word, std::vector<int64_t>& ids) const;  // appends
};

// vocab.txt: one token per line, id = line number (a trailing '\r' is dropped; an empty line
// is a token, as transformers' load_vocab reads it, except a final empty line). Errors name the
// path.
std::unordered_map<std::string, int64_t> read_wordpiece_vocab(const std::string& path);

}  // namespace cabm
