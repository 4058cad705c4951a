#include "cabm/io/word_lists.h"

#include "cabm/core/error.h"
#include "cabm/io/text_data.h"
#include "cabm/io/tokenizer.h"

#include <algorithm>
#include <bit>
#include <unordered_map>

namespace cabm {

std::vector<WordListSource> default_word_lists() {
  return {{"english", "/usr/share/dict/american-english"},
          {"german", "/usr/share/dict/ngerman"},
          {"french", "/usr/share/dict/french"},
          {"spanish", "/usr/share/dict/spanish"},
          {"italian", "/usr/share/dict/italian"}};
}

namespace {

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// What parse_word_lists needs of the sources, checked before any list is read: a bad call is
// refused without reading (up to 32 lists of) megabytes first.
void check_sources(const std::vector<WordListSource>& sources) {
  CABM_CHECK(!sources.empty(), "no word lists given");
  CABM_CHECK(sources.size() <= 32, "at most 32 languages");  // a bit set per word
}

}  // namespace

std::string lowercase_word(std::string_view word) {
  std::string out;
  out.reserve(word.size());
  size_t i = 0;
  while (i < word.size()) {
    const auto b0 = static_cast<uint8_t>(word[i]);
    if (b0 < 0x80) {
      out.push_back(static_cast<char>(b0 >= 'A' && b0 <= 'Z' ? b0 + 32 : b0));
      ++i;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < word.size()) {
      uint32_t cp = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(word[i + 1]) & 0x3Fu);
      if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7)
        cp += 0x20;  // Latin-1 capitals
      else if (cp == 0x178)
        cp = 0xFF;  // Ÿ → ÿ
      else if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x138 && cp != 0x149 && cp != 0x17F) {
        // Latin Extended-A alternates capital/small; the parity flips after U+0138 and U+0149.
        const bool odd_capital = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
        if (odd_capital ? (cp % 2 == 1) : (cp % 2 == 0)) cp += 1;
      }
      append_utf8(cp, out);
      i += 2;
    } else {
      out.push_back(static_cast<char>(b0));
      ++i;
    }
  }
  return out;
}

WordDataset load_word_lists(const std::vector<WordListSource>& sources, const WordListOptions& options) {
  check_sources(sources);
  std::vector<std::string> texts;
  texts.reserve(sources.size());
  for (const WordListSource& source : sources) texts.push_back(read_file_bytes(source.path));
  return parse_word_lists(sources, texts, options);
}

WordDataset parse_word_lists(const std::vector<WordListSource>& sources, const std::vector<std::string>& texts,
                             const WordListOptions& options) {
  check_sources(sources);
  CABM_CHECK(texts.size() == sources.size(), "one text per word list");
  WordDataset data;
  const size_t L = sources.size();
  // word → bit set of the languages whose list has it.
  std::unordered_map<std::string, uint32_t> membership;
  std::vector<std::vector<std::string>> words(L);
  for (size_t c = 0; c < L; ++c) {
    data.languages.push_back(sources[c].language);
    const std::string& text = texts[c];
    size_t pos = 0, kept = 0;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      std::string_view line(text.data() + pos, end - pos);
      pos = end + 1;
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
      if (line.empty() || find_invalid_utf8(line)) continue;
      if (line.find('\'') != std::string_view::npos || line.find("\xE2\x80\x99") != std::string_view::npos) {
        ++data.dropped_apostrophe;
        continue;
      }
      if (static_cast<int64_t>(line.size()) > options.max_bytes) {
        ++data.dropped_long;
        continue;
      }
      std::string w = lowercase_word(line);
      uint32_t& bits = membership[w];
      if ((bits & (1u << c)) == 0) words[c].push_back(std::move(w));
      bits |= 1u << c;
      ++kept;
    }
    if (kept == 0)
      throw Error(fmt::format("{}: no usable words in the {} word list", sources[c].path, sources[c].language));
  }
  data.train.resize(L);
  data.validation.resize(L);
  const auto threshold = static_cast<uint64_t>(options.validation_fraction * 1e6);
  for (size_t c = 0; c < L; ++c) {
    std::vector<std::string> held_out;
    for (auto& w : words[c]) {
      if (std::popcount(membership[w]) > 1) {
        ++data.dropped_shared;
        continue;
      }
      uint64_t h = text_hash(w);
      h ^= h >> 33;
      h *= 0xff51afd7ed558ccdull;
      h ^= h >> 33;
      ((h % 1000000) < threshold ? held_out : data.train[c]).push_back(std::move(w));
    }
    // Balanced validation: the first (in hash order) validation_per_language held-out words.
    std::sort(held_out.begin(), held_out.end(),
              [](const std::string& a, const std::string& b) { return text_hash(a) < text_hash(b); });
    if (static_cast<int64_t>(held_out.size()) > options.validation_per_language)
      held_out.resize(static_cast<size_t>(options.validation_per_language));
    data.validation[c] = std::move(held_out);
    if (data.train[c].empty() || data.validation[c].empty())
      throw Error(fmt::format("{}: too few distinct words for a {} class", sources[c].path, sources[c].language));
  }
  return data;
}

void sample_words(const WordDataset& data, int64_t B, Rng& rng, std::vector<std::string>& words,
                  std::vector<int64_t>& labels) {
  words.resize(static_cast<size_t>(B));
  labels.resize(static_cast<size_t>(B));
  const auto L = static_cast<uint64_t>(data.train.size());
  for (int64_t b = 0; b < B; ++b) {
    const auto c = static_cast<size_t>((static_cast<uint64_t>(rng.next_u32()) * L) >> 32);
    const auto n = static_cast<uint64_t>(data.train[c].size());
    const auto i = static_cast<size_t>((static_cast<uint64_t>(rng.next_u32()) * n) >> 32);
    words[static_cast<size_t>(b)] = data.train[c][i];
    labels[static_cast<size_t>(b)] = static_cast<int64_t>(c);
  }
}

}  // namespace cabm
