// The SentencePiece pipeline as Hugging Face's `tokenizers` runs it from tokenizer.json (what
// transformers' fast XLM-R tokenizer is): the Precompiled normalizer (SentencePiece's
// character map, a darts-clone double-array trie), the Metaspace pre-tokenizer and the Unigram
// model's best segmentation (Kudo 2018), by Viterbi over the pieces' log-probabilities.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cabm {

// SentencePiece's precompiled character map: a little-endian u32 trie size in bytes, the
// double-array trie (keys: UTF-8 sequences; values: offsets into the strings), then the
// replacement strings, each ending in NUL.
class PrecompiledCharsMap {
 public:
  // `blob` as stored (tokenizer.json has it in base64); errors name `source`.
  static PrecompiledCharsMap parse(std::string_view blob, const std::string& source);

  // tokenizers' Precompiled normalizer: each grapheme cluster shorter than 6 bytes is replaced
  // whole when a prefix of it is a key (by the shortest such key's string); otherwise each of
  // its characters is replaced on its own when it is a key.
  std::u32string normalize(std::u32string_view text) const;

 private:
  std::optional<std::string_view> transform(std::string_view chunk) const;  // none: no key is a prefix
  std::vector<uint32_t> units_;
  std::string strings_;
};

std::string base64_decode(std::string_view text, const std::string& source);

// Metaspace: ' ' → replacement; prepend it when the text does not start with it (`prepend`);
// with `split`, each replacement starts a new piece (MergedWithNext).
std::vector<std::u32string> metaspace_pre_tokenize(std::u32string_view text, char32_t replacement, bool prepend,
                                                   bool split);

struct UnigramModel {
  std::unordered_map<std::string, int64_t> ids;  // piece → id
  std::vector<double> scores;                    // by id
  size_t max_piece_bytes = 0;
  int64_t unk_id = 0;
  double unk_score = 0;  // the lowest score − 10, as tokenizers' Unigram

  void add(const std::string& piece, double score);  // in id order
  void finish();                                     // after the last add
  // Best segmentation of one piece; characters no piece covers are unk, consecutive unks one.
  void tokenize(std::string_view text, std::vector<int64_t>& ids_out) const;
};

}  // namespace cabm
