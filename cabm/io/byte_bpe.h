// Byte-level BPE as GPT-2 and RoBERTa use it (Radford et al. 2019; Sennrich et al. 2016), run
// as Hugging Face's `tokenizers` runs it: the ByteLevel pre-tokenizer (GPT-2's split pattern,
// then every byte mapped to a printable code point) and the BPE model (merges applied by rank).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cabm {

// GPT-2's pattern, 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+,
// matched left to right as the regex engine would (a run of whitespace before a non-space
// leaves its last space to the next piece). With add_prefix_space a text that does not start
// with ' ' gets one. Returns the pieces, each as its bytes mapped through byte_to_unicode.
std::vector<std::u32string> byte_level_pre_tokenize(std::u32string_view text, bool add_prefix_space);

// GPT-2's reversible map from bytes to printable code points: the printable Latin-1 bytes map
// to themselves, the other 68 to U+0100 onwards, in byte order.
char32_t byte_to_unicode(uint8_t byte);

struct BytePairEncoding {
  std::unordered_map<std::string, int64_t> vocab;  // UTF-8 token → id
  // (left id << 32 | right id) → (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> merges;
  std::optional<int64_t> unk_id;  // characters outside the vocabulary: unk, or dropped if none
  bool fuse_unk = false;
  bool ignore_merges = false;  // a piece that is itself in the vocabulary is one token

  // Adds a merge "left right" of rank `rank`; errors (naming `source`) when a part or the
  // result is not in the vocabulary.
  void add_merge(std::string_view left, std::string_view right, int64_t rank, const std::string& source);
  void tokenize(std::u32string_view piece, std::vector<int64_t>& ids) const;  // appends
};

}  // namespace cabm
