// Bytes → the word lists of `cabm train --task langid`, on buffers (parse_word_lists, what
// load_word_lists does after reading): lowercasing, the apostrophe, length and UTF-8 filters,
// the cross-list deduplication, the hash split and balanced sampling. Byte 0 picks max_bytes
// (--seq-len), byte 1 validation_per_language (--eval-windows) and the held-out fraction; the
// rest is up to 32 lists separated by 0xFF (a byte no UTF-8 line holds). A data set that loads
// must keep what word_lists.h promises.
#include "cabm/io/tokenizer.h"
#include "cabm/io/word_lists.h"
#include "tests/fuzz/fuzz_util.h"

#include <fmt/format.h>

#include <unordered_map>

namespace {

using cabm::fuzz::invariant_failed;

void check_dataset(const cabm::WordDataset& data, const cabm::WordListOptions& options, size_t L) {
  if (data.languages.size() != L || data.train.size() != L || data.validation.size() != L)
    invariant_failed("a class is missing");
  std::unordered_map<std::string, size_t> owner;  // word → its class
  for (size_t c = 0; c < L; ++c) {
    if (data.train[c].empty() || data.validation[c].empty()) invariant_failed("an empty class was accepted");
    if (static_cast<int64_t>(data.validation[c].size()) > options.validation_per_language)
      invariant_failed("more validation words than validation_per_language");
    for (const auto* split : {&data.train[c], &data.validation[c]})
      for (const std::string& w : *split) {
        if (w.empty() || static_cast<int64_t>(w.size()) > options.max_bytes)
          invariant_failed("a word is empty or longer than max_bytes");
        if (cabm::find_invalid_utf8(w)) invariant_failed("a word is not valid UTF-8");
        if (w.find('\'') != std::string::npos || w.find("\xE2\x80\x99") != std::string::npos)
          invariant_failed("a word has an apostrophe");
        if (cabm::lowercase_word(w) != w) invariant_failed("a word is not lowercase (lowercase_word not idempotent)");
        // A word is in one class, once: in its training or its validation words.
        if (!owner.emplace(w, c).second) invariant_failed("a word appears twice (in two classes or both splits)");
      }
  }
  std::vector<std::string> words;
  std::vector<int64_t> labels;
  cabm::Rng rng(3);
  cabm::sample_words(data, 16, rng, words, labels);
  for (size_t b = 0; b < words.size(); ++b) {
    if (labels[b] < 0 || labels[b] >= static_cast<int64_t>(L)) invariant_failed("a sampled label is out of range");
    const auto it = owner.find(words[b]);
    if (it == owner.end() || it->second != static_cast<size_t>(labels[b]))
      invariant_failed("a sampled word is not a training word of its label");
  }
}

void word_lists(std::string_view bytes) {
  if (bytes.size() < 2) return;
  cabm::WordListOptions options;
  options.max_bytes = 1 + static_cast<unsigned char>(bytes[0]) % 64;
  options.validation_per_language = 1 + static_cast<unsigned char>(bytes[1]) % 16;
  options.validation_fraction = (static_cast<unsigned char>(bytes[1]) & 0x10) != 0 ? 0.5 : 0.1;
  bytes.remove_prefix(2);

  std::vector<cabm::WordListSource> sources;
  std::vector<std::string> texts;
  while (sources.size() < 32) {
    const size_t end = bytes.find('\xFF');
    sources.push_back({fmt::format("lang{}", sources.size()), fmt::format("fuzz/list{}.txt", sources.size())});
    texts.emplace_back(bytes.substr(0, end));
    if (end == std::string_view::npos) break;
    bytes.remove_prefix(end + 1);
  }
  const cabm::WordDataset data = cabm::parse_word_lists(sources, texts, options);
  check_dataset(data, options, sources.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return cabm::fuzz::run([&] { word_lists(cabm::fuzz::as_text(data, size)); });
}
