#include "cli/hf_cli.h"

#include "cli/progress.h"

#include "cabm/core/error.h"
#include "cabm/io/text_lines.h"

#include <fmt/format.h>

#include <cstdio>

namespace cabm::cli {

void check_pair_input(const std::string& input, const std::string& pair_input) {
  if (input == "-" && pair_input == "-")
    throw UsageError("--input and --pair-input cannot both be '-': standard input can be read only once");
}

HfTexts read_hf_texts(const std::string& input, const std::string& pair_input) {
  check_pair_input(input, pair_input);
  const auto name = [](const std::string& path) { return path == "-" ? std::string("standard input") : path; };
  HfTexts out{read_text_lines(input), {}, name(input)};
  if (pair_input.empty()) return out;
  out.pairs = read_text_lines(pair_input);
  if (out.pairs.size() != out.texts.size())
    throw Error(fmt::format("--input {} has {} lines but --pair-input {} has {}: line i of each is input i",
                            name(input), out.texts.size(), name(pair_input), out.pairs.size()));
  return out;
}

void add_pair_input_option(CLI::App* cmd, std::string& pair_input) {
  cmd->add_option("--pair-input", pair_input,
                  "UTF-8 text, the second text of each input (sentence pairs, query and passage): line i pairs with "
                  "line i of --input, as transformers' tok(texts, text_pairs); same line rules, '-': standard input "
                  "(not both); --max-length counts the pair as a whole");
}

HfJob load_hf_job(const std::string& model_dir, const std::string& input, const std::string& pair_input,
                  int64_t max_length, int64_t default_length, Precision precision) {
  check_pair_input(input, pair_input);
  const bool pair = !pair_input.empty();
  HfEncoder model = load_hf_encoder(model_dir);
  if (max_length > model.config.max_tokens())
    throw UsageError(fmt::format("--max-length {} is more than the {} positions of {}", max_length,
                                 model.config.max_tokens(), model.config.path));
  set_precision(model, precision);
  HfTokenizer tokenizer = HfTokenizer::load(model_dir);
  if (max_length > 0 && max_length < tokenizer.special_token_count(pair))
    throw UsageError(fmt::format("--max-length {} leaves no room for the {} special tokens of {}{}", max_length,
                                 tokenizer.special_token_count(pair), model_dir, pair ? " around a pair" : ""));
  const int64_t length = max_length > 0 ? max_length : default_length;
  const HfTexts texts = read_hf_texts(input, pair_input);
  std::vector<HfSequence> sequences = hf_tokenize(tokenizer, model, texts.texts, texts.pairs, length, texts.source);
  return HfJob{std::move(model), std::move(tokenizer), std::move(sequences)};
}

CountProgress::CountProgress(std::string what, int64_t total, bool live)
    : what_(std::move(what)),
      total_(total),
      live_(live),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

CountProgress::~CountProgress() {
  finish();
}

void CountProgress::update(int64_t done) {
  if (!live_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total_ && std::chrono::duration<double>(now - last_draw_).count() < 0.1) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : -1;
  std::fprintf(stderr, "\r\033[K%s: %s/%s texts | %s texts/s | eta %s", what_.c_str(),
               format_count(static_cast<double>(done)).c_str(), format_count(static_cast<double>(total_)).c_str(),
               format_count(rate).c_str(), format_duration(eta).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void CountProgress::finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace cabm::cli
