#include "cli/hf_cli.h"

#include "cli/progress.h"

#include "cabm/core/error.h"
#include "cabm/io/text_lines.h"

#include <fmt/format.h>

#include <cstdio>

namespace cabm::cli {

HfJob load_hf_job(const std::string& model_dir, const std::string& input, int64_t max_length, int64_t default_length,
                  Precision precision) {
  HfEncoder model = load_hf_encoder(model_dir);
  if (max_length > model.config.max_tokens())
    throw UsageError(fmt::format("--max-length {} is more than the {} positions of {}", max_length,
                                 model.config.max_tokens(), model.config.path));
  set_precision(model, precision);
  HfTokenizer tokenizer = HfTokenizer::load(model_dir);
  if (max_length > 0 && max_length < tokenizer.special_token_count())
    throw UsageError(fmt::format("--max-length {} leaves no room for the {} special tokens of {}", max_length,
                                 tokenizer.special_token_count(), model_dir));
  const int64_t length = max_length > 0 ? max_length : default_length;
  const std::vector<std::string> lines = read_text_lines(input);
  std::vector<HfSequence> sequences =
      hf_tokenize(tokenizer, model, lines, length, input == "-" ? "standard input" : input);
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
