// Word lists for the language-identification demo: classify a single word as English, German,
// French, Spanish or Italian from its spelling. Sources are the Debian word lists in
// /usr/share/dict (wamerican, wngerman, wfrench, wspanish, witalian).
//
// Decisions (documented in docs/training.md):
//  - Words are lowercased (ASCII and Latin-1/Latin Extended-A capitals): otherwise German's
//    capitalised nouns and English's proper names make the task a capital-letter detector.
//  - Words with an apostrophe (English possessives "cat's", Italian elisions "dell'") are
//    dropped: they are inflections, and the apostrophe alone gives the language away.
//  - A (lowercased) word found in more than one list is dropped everywhere: its label would be
//    ambiguous ("die", "pain", "casa"...).
//  - Words longer than `max_bytes` UTF-8 bytes are dropped (long German compounds), so batches
//    stay short; invalid UTF-8 lines are skipped.
//  - Held-out split by a hash of the word (10%), so it does not depend on file order.
//  - Training samples are balanced: a language uniformly, then a word of it uniformly.
//    Validation uses up to `validation_per_language` held-out words of each language.
#pragma once

#include "cabm/core/rng.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cabm {

struct WordListSource {
  std::string language;
  std::string path;
};

// english, german, french, spanish, italian from /usr/share/dict.
std::vector<WordListSource> default_word_lists();

struct WordListOptions {
  double validation_fraction = 0.1;
  int64_t max_bytes = 24;
  int64_t validation_per_language = 2000;
};

struct WordDataset {
  std::vector<std::string> languages;                // class names; class c = index
  std::vector<std::vector<std::string>> train;       // [class][word]
  std::vector<std::vector<std::string>> validation;  // [class][word], balanced
  int64_t dropped_shared = 0;                        // words in several lists
  int64_t dropped_apostrophe = 0;
  int64_t dropped_long = 0;
};

// Lowercases ASCII, Latin-1 (À..Þ except ×) and Latin Extended-A pairs (Œ → œ ...).
std::string lowercase_word(std::string_view word);

// Reads and cleans the lists; errors name a missing or empty list.
WordDataset load_word_lists(const std::vector<WordListSource>& sources, const WordListOptions& options = {});
// The same on lists already read: texts[c] is the content of sources[c].path (named in errors).
WordDataset parse_word_lists(const std::vector<WordListSource>& sources, const std::vector<std::string>& texts,
                             const WordListOptions& options = {});

// A batch of B words chosen as described above: words[b], labels[b].
void sample_words(const WordDataset& data, int64_t B, Rng& rng, std::vector<std::string>& words,
                  std::vector<int64_t>& labels);

}  // namespace cabm
