// What `cabm embed` and `cabm classify` share (cli/cmd_embed.cpp, cli/cmd_classify.cpp): loading a
// Hugging Face model directory with its tokenizer, reading and tokenising TEXTS, and a progress
// line for long inputs.
#pragma once

#include "cabm/interop/hf_pipeline.h"
#include "cabm/io/hf_tokenizer.h"
#include "cabm/nn/mixed_precision.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace cabm::cli {

// The most --max-length / --batch-size accept.
inline constexpr int64_t kHfMaxLength = int64_t{1} << 24;
inline constexpr int64_t kHfMaxBatch = int64_t{1} << 20;

struct HfJob {
  HfEncoder model;
  HfTokenizer tokenizer;
  std::vector<HfSequence> sequences;  // one per input line, in input order
};

// The inputs of a Hugging Face command: the lines of --input and, with --pair-input, the second
// text of each (line i of TEXTS_B pairs with line i of TEXTS).
struct HfTexts {
  std::vector<std::string> texts;
  std::vector<std::string> pairs;  // empty without --pair-input
  std::string source;              // --input as errors name it ("standard input" for '-')
};

// Reads --input and --pair-input ("": none) with read_text_lines' rules. Both '-' is a usage
// error (standard input can be read once); a different number of lines is an error naming both
// files and both counts.
HfTexts read_hf_texts(const std::string& input, const std::string& pair_input);
// The usage error of read_hf_texts, on its own: commands check it before loading anything.
void check_pair_input(const std::string& input, const std::string& pair_input);

// The --pair-input option of tokenize, embed and classify.
void add_pair_input_option(CLI::App* cmd, std::string& pair_input);

// Loads DIR (model, then tokenizer), reads TEXTS (and TEXTS_B, `pair_input`, "" for none) and
// tokenises each input, truncated to max_length (<= 0: `default_length` when positive, else the
// tokenizer's own maximum). A max_length beyond the model's positions or below the tokenizer's
// special tokens (of a pair, with TEXTS_B) is a usage error naming --max-length.
HfJob load_hf_job(const std::string& model_dir, const std::string& input, const std::string& pair_input,
                  int64_t max_length, int64_t default_length, Precision precision);

// "embed: 1,234/10,000 texts | 512 texts/s | eta 12s", redrawn in place on stderr at most ten
// times a second while `live` (stderr is a terminal and there is more than one batch); cleared
// by finish() or the destructor. Silent otherwise, so logs and pipes stay clean.
class CountProgress {
 public:
  CountProgress(std::string what, int64_t total, bool live);
  ~CountProgress();
  void update(int64_t done);
  void finish();

 private:
  std::string what_;
  int64_t total_;
  bool live_, drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace cabm::cli
