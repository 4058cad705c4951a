// Text corpora for character-level language modelling: loading, a deterministic held-out
// split, and fixed-length training/evaluation windows over the byte stream (tokens are bytes;
// see cabm/io/tokenizer.h).
//
// The default corpus is Debian's fortunes: every plain file in /usr/share/games/fortunes
// (the .dat indexes, the .u8 symlinks and subdirectories such as off/ are skipped), split into
// entries on lines holding only "%". Entries are cleaned (backspace overstrikes resolved, other
// control characters except tab and newline removed), and an entry goes to the validation split
// iff a hash of its text says so: the split does not depend on file order, and duplicated
// entries never straddle it. Each split is its entries joined as "entry\n%\n", the fortune
// file format, so a model learns where a fortune ends.
//
// Any UTF-8 file (--data) is split by position instead: the last `validation_fraction` of it,
// starting at a line boundary, is held out.
#pragma once

#include "cabm/core/rng.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cabm {

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

struct TextSplit {
  std::string source;           // directory or file it came from
  std::string train;            // UTF-8 bytes
  std::string validation;       // UTF-8 bytes
  int64_t train_documents = 0;  // fortunes: entries; files: 1
  int64_t validation_documents = 0;
};

// Whole file as bytes, or a cabm::Error naming the path: missing, a directory, a device
// (/dev/zero), unreadable, larger than the memory this process may use, or changed while being
// read. Never a part of the file. A pipe or socket is read to its end, up to 1 GiB.
std::string read_file_bytes(const std::string& path);

// A UTF-8 text file: errors for missing/unreadable/empty files and for invalid UTF-8 (naming
// the byte offset).
std::string read_utf8_file(const std::string& path);
// The same checks on text already in memory; `source` names it in errors.
void check_utf8_text(std::string_view text, const std::string& source);

// The cleaned entries of one fortune file / every fortune file of a directory (sorted by file
// name). Errors when the directory has no fortune file.
std::vector<std::string> parse_fortunes(std::string_view text);
std::vector<std::string> read_fortune_entries(const std::string& dir);

// Stable hash of an entry (FNV-1a, 64 bits): decides its split.
uint64_t text_hash(std::string_view text);

TextSplit split_documents(const std::vector<std::string>& documents, double validation_fraction,
                          const std::string& source);
TextSplit load_fortunes(const std::string& dir = kFortunesDir, double validation_fraction = 0.05);
TextSplit load_text_file(const std::string& path, double validation_fraction = 0.1);
// load_text_file's split of a file's bytes already in memory (checked as read_utf8_file does).
TextSplit split_text(std::string text, double validation_fraction, const std::string& source);

// B windows of T + 1 bytes at uniform random offsets of `text` (which must hold at least
// T + 1 bytes): inputs[b, t] = text[o_b + t], targets[b, t] = text[o_b + t + 1]. Consumes
// exactly B numbers from `rng`, so (seed, position) is the whole data position.
void sample_windows(std::string_view text, int64_t B, int64_t T, Rng& rng, int64_t* inputs, int64_t* targets);

// Start offsets of up to `max_windows` evaluation windows of T + 1 bytes, spread evenly over
// `text` (non-overlapping when the text is long enough); the same every call.
std::vector<int64_t> evaluation_offsets(std::string_view text, int64_t T, int64_t max_windows);

// inputs/targets [count, T] for the windows at offsets[first, first + count).
void gather_windows(std::string_view text, const std::vector<int64_t>& offsets, int64_t first, int64_t count, int64_t T,
                    int64_t* inputs, int64_t* targets);

}  // namespace cabm
