#include "cabm/io/unigram.h"

#include "cabm/core/error.h"
#include "cabm/io/unicode_text.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

namespace cabm {

std::string base64_decode(std::string_view text, const std::string& source) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t buffer = 0;
  int bits = 0;
  for (const char c : text) {
    if (c == '=') break;
    const int v = value(c);
    if (v < 0) throw Error(fmt::format("{}: not base64", source));
    buffer = (buffer << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xFF));
    }
  }
  return out;
}

PrecompiledCharsMap PrecompiledCharsMap::parse(std::string_view blob, const std::string& source) {
  if (blob.size() < 4) throw Error(fmt::format("{}: precompiled_charsmap is too short", source));
  uint32_t trie_bytes = 0;
  for (int i = 3; i >= 0; --i) trie_bytes = (trie_bytes << 8) | static_cast<uint8_t>(blob[static_cast<size_t>(i)]);
  if (trie_bytes % 4 != 0 || trie_bytes == 0 || trie_bytes > blob.size() - 4)
    throw Error(fmt::format("{}: precompiled_charsmap has a trie of {} bytes in {}", source, trie_bytes, blob.size()));
  PrecompiledCharsMap map;
  map.units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < map.units_.size(); ++i) {
    uint32_t u = 0;
    for (int b = 3; b >= 0; --b) u = (u << 8) | static_cast<uint8_t>(blob[4 + i * 4 + static_cast<size_t>(b)]);
    map.units_[i] = u;
  }
  map.strings_ = std::string(blob.substr(4 + trie_bytes));
  return map;
}

// Darts-clone's unit: bit 8 has_leaf, bits 0-7 (and 31) the label, the rest the offset to the
// children (shifted by 8 more bits when bit 9 is set); a leaf's unit holds the value in 0-30.
std::optional<std::string_view> PrecompiledCharsMap::transform(std::string_view chunk) const {
  auto offset = [](uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
  auto label = [](uint32_t u) { return u & ((1u << 31) | 0xFFu); };
  auto has_leaf = [](uint32_t u) { return ((u >> 8) & 1u) == 1u; };
  size_t pos = offset(units_[0]);
  for (const char ch : chunk) {
    const auto c = static_cast<uint8_t>(ch);
    if (c == 0) break;
    pos ^= c;
    if (pos >= units_.size()) return std::nullopt;
    const uint32_t unit = units_[pos];
    if (label(unit) != c) return std::nullopt;
    pos ^= offset(unit);
    if (pos >= units_.size()) return std::nullopt;
    if (has_leaf(unit)) {  // the first (shortest) key that is a prefix of the chunk
      const uint32_t value = units_[pos] & ((1u << 31) - 1);
      if (value >= strings_.size()) return std::nullopt;
      const size_t end = strings_.find('\0', value);
      return std::string_view(strings_).substr(value, end == std::string::npos ? std::string::npos : end - value);
    }
  }
  return std::nullopt;
}

std::u32string PrecompiledCharsMap::normalize(std::u32string_view text) const {
  std::string out;
  std::string grapheme, one;
  auto flush = [&](std::u32string_view g) {
    grapheme = unicode::encode_utf8(g);
    if (grapheme.size() < 6) {
      if (const auto s = transform(grapheme)) {
        out += *s;
        return;
      }
    }
    for (const char32_t c : g) {
      one.clear();
      unicode::append_utf8(one, c);
      const auto s = transform(one);
      out += s ? *s : std::string_view(one);
    }
  };
  size_t start = 0;
  utf8proc_int32_t state = 0;
  for (size_t i = 1; i <= text.size(); ++i) {
    if (i == text.size() || utf8proc_grapheme_break_stateful(static_cast<utf8proc_int32_t>(text[i - 1]),
                                                             static_cast<utf8proc_int32_t>(text[i]), &state)) {
      flush(text.substr(start, i - start));
      start = i;
    }
  }
  return unicode::decode_utf8(out, "precompiled_charsmap");
}

std::vector<std::u32string> metaspace_pre_tokenize(std::u32string_view text, char32_t replacement, bool prepend,
                                                   bool split) {
  if (text.empty()) return {};  // tokenizers' NormalizedString::prepend does nothing on ""
  std::u32string s;
  s.reserve(text.size() + 1);
  if (prepend && (text.empty() || (text.front() != replacement && text.front() != U' '))) s.push_back(replacement);
  for (const char32_t c : text) s.push_back(c == U' ' ? replacement : c);
  std::vector<std::u32string> pieces;
  if (!split) {
    if (!s.empty()) pieces.push_back(std::move(s));
    return pieces;
  }
  std::u32string piece;
  for (const char32_t c : s) {
    if (c == replacement && !piece.empty()) pieces.push_back(std::exchange(piece, {}));
    piece.push_back(c);
  }
  if (!piece.empty()) pieces.push_back(std::move(piece));
  return pieces;
}

void UnigramModel::add(const std::string& piece, double score) {
  ids.emplace(piece, static_cast<int64_t>(scores.size()));
  scores.push_back(score);
  max_piece_bytes = std::max(max_piece_bytes, piece.size());
}

void UnigramModel::finish() {
  const double lowest = scores.empty() ? 0.0 : *std::min_element(scores.begin(), scores.end());
  unk_score = lowest - 10.0;
}

void UnigramModel::tokenize(std::string_view text, std::vector<int64_t>& out) const {
  // best[i]: the best segmentation of text[0, i), i a character boundary.
  struct Node {
    double score = 0;
    std::optional<size_t> starts_at;
    int64_t id = 0;
  };
  const size_t n = text.size();
  std::vector<Node> best(n + 1);
  best[0].starts_at = 0;
  auto char_len = [&](size_t at) {
    const auto c = static_cast<uint8_t>(text[at]);
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  };
  for (size_t at = 0; at < n; at += static_cast<size_t>(char_len(at))) {
    if (!best[at].starts_at) continue;
    const double here = best[at].score;
    const size_t first = static_cast<size_t>(char_len(at));
    bool single = false;
    // Every piece that starts here, shortest first (the order of tokenizers' trie search).
    for (size_t len = first; len <= max_piece_bytes && at + len <= n;) {
      if (const auto it = ids.find(std::string(text.substr(at, len))); it != ids.end()) {
        Node& node = best[at + len];
        const double score = here + scores[static_cast<size_t>(it->second)];
        if (!node.starts_at || score > node.score) node = {score, at, it->second};
        single = single || len == first;
      }
      if (at + len >= n) break;
      len += static_cast<size_t>(char_len(at + len));
    }
    if (!single) {
      Node& node = best[at + first];
      const double score = here + unk_score;
      if (!node.starts_at || score > node.score) node = {score, at, unk_id};
    }
  }
  std::vector<int64_t> reversed;
  for (size_t end = n; end > 0;) {
    const Node& node = best[end];
    const bool fuse = node.id == unk_id && !reversed.empty() && reversed.back() == unk_id;
    if (!fuse) reversed.push_back(node.id);
    end = *node.starts_at;
  }
  out.insert(out.end(), reversed.rbegin(), reversed.rend());
}

}  // namespace cabm
