#include "cabm/io/byte_bpe.h"

#include "cabm/core/error.h"
#include "cabm/io/unicode_text.h"

#include <array>
#include <queue>

namespace cabm {

char32_t byte_to_unicode(uint8_t byte) {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table[byte];
}

namespace {

enum class Kind { Letter, Number, Space, Other };

Kind kind_of(char32_t c) {
  if (unicode::is_whitespace(c)) return Kind::Space;
  if (unicode::is_letter(c)) return Kind::Letter;
  if (unicode::is_number(c)) return Kind::Number;
  return Kind::Other;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at text[at], or 0.
size_t contraction_at(std::u32string_view text, size_t at) {
  if (text[at] != U'\'' || at + 1 >= text.size()) return 0;
  const char32_t a = text[at + 1];
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if (at + 2 >= text.size()) return 0;
  const char32_t b = text[at + 2];
  if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  return 0;
}

// Length of the match of the pattern at text[at] (at < size: some alternative always matches).
size_t match_at(std::u32string_view text, size_t at) {
  const size_t n = text.size();
  if (const size_t len = contraction_at(text, at)) return len;
  // " ?X+" for X in letters, numbers, other: an optional U+0020 then a run of one kind.
  size_t body = at;
  if (text[at] == U' ' && at + 1 < n && kind_of(text[at + 1]) != Kind::Space) body = at + 1;
  const Kind kind = kind_of(text[body]);
  if (kind != Kind::Space) {
    size_t end = body + 1;
    while (end < n && kind_of(text[end]) == kind) ++end;
    return end - at;
  }
  // \s+(?!\S): the whitespace run, less its last character when a non-space follows; else \s+.
  size_t end = at + 1;
  while (end < n && kind_of(text[end]) == Kind::Space) ++end;
  if (end < n && end - at > 1) return end - at - 1;
  return end - at;
}

}  // namespace

std::vector<std::u32string> byte_level_pre_tokenize(std::u32string_view text, bool add_prefix_space) {
  std::u32string prefixed;
  if (add_prefix_space && (text.empty() || text.front() != U' ')) {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(U' ');
    prefixed.append(text);
    text = prefixed;
  }
  std::vector<std::u32string> pieces;
  std::string bytes;
  for (size_t at = 0; at < text.size();) {
    const size_t len = match_at(text, at);
    bytes = unicode::encode_utf8(text.substr(at, len));
    std::u32string piece;
    piece.reserve(bytes.size());
    for (const char b : bytes) piece.push_back(byte_to_unicode(static_cast<uint8_t>(b)));
    pieces.push_back(std::move(piece));
    at += len;
  }
  return pieces;
}

void BytePairEncoding::add_merge(std::string_view left, std::string_view right, int64_t rank,
                                 const std::string& source) {
  const auto a = vocab.find(std::string(left));
  const auto b = vocab.find(std::string(right));
  const auto merged = vocab.find(std::string(left) + std::string(right));
  if (a == vocab.end() || b == vocab.end() || merged == vocab.end())
    throw Error(
        fmt::format("{}: merge {} '{} {}' uses a token that is not in the vocabulary", source, rank + 1, left, right));
  const uint64_t key = (static_cast<uint64_t>(a->second) << 32) | static_cast<uint64_t>(b->second);
  merges.emplace(key, std::make_pair(rank, merged->second));  // a repeated merge keeps its first rank
}

void BytePairEncoding::tokenize(std::u32string_view piece, std::vector<int64_t>& ids) const {
  std::string text = unicode::encode_utf8(piece);
  if (ignore_merges) {
    if (const auto it = vocab.find(text); it != vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  // Symbols: one per character, as a doubly linked list over `symbols`.
  struct Symbol {
    int64_t id;
    int64_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  std::string ch;
  bool last_unk = false;
  for (const char32_t c : piece) {
    ch.clear();
    unicode::append_utf8(ch, c);
    if (const auto it = vocab.find(ch); it != vocab.end()) {
      symbols.push_back({it->second, 0, 0, true});
      last_unk = false;
    } else if (unk_id) {
      if (!(fuse_unk && last_unk)) symbols.push_back({*unk_id, 0, 0, true});
      last_unk = true;
    }
  }
  const int64_t n = static_cast<int64_t>(symbols.size());
  for (int64_t i = 0; i < n; ++i) {
    symbols[static_cast<size_t>(i)].prev = i - 1;
    symbols[static_cast<size_t>(i)].next = i + 1 < n ? i + 1 : -1;
  }
  // Lowest rank first, then leftmost: (rank, position of the left symbol, merged id).
  using Candidate = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // rank, left, right id, merged
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push_pair = [&](int64_t left) {
    if (left < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    if (l.next < 0) return;
    const Symbol& r = symbols[static_cast<size_t>(l.next)];
    const uint64_t key = (static_cast<uint64_t>(l.id) << 32) | static_cast<uint64_t>(r.id);
    if (const auto it = merges.find(key); it != merges.end())
      queue.emplace(it->second.first, left, r.id, it->second.second);
  };
  for (int64_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    const auto [rank, left, right_id, merged] = queue.top();
    queue.pop();
    Symbol& l = symbols[static_cast<size_t>(left)];
    // Stale: the left symbol was merged away or changed, or its right neighbour changed.
    if (!l.alive || l.next < 0) continue;
    Symbol& r = symbols[static_cast<size_t>(l.next)];
    const uint64_t key = (static_cast<uint64_t>(l.id) << 32) | static_cast<uint64_t>(r.id);
    const auto it = merges.find(key);
    if (it == merges.end() || it->second.first != rank || r.id != right_id) continue;
    l.id = merged;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = left;
    push_pair(l.prev);
    push_pair(left);
  }
  for (int64_t i = n > 0 ? 0 : -1; i >= 0; i = symbols[static_cast<size_t>(i)].next)
    ids.push_back(symbols[static_cast<size_t>(i)].id);
}

}  // namespace cabm
