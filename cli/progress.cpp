#include "cli/progress.h"

#include "cabm/io/tokenizer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace cabm::cli {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string format_count(double n) {
  std::string digits = fmt::format("{:.0f}", n);
  std::string out;
  const size_t start = digits[0] == '-' ? 1 : 0;
  for (size_t i = 0; i < digits.size(); ++i) {
    out.push_back(digits[i]);
    const size_t left = digits.size() - 1 - i;
    if (i >= start && left > 0 && left % 3 == 0) out.push_back(',');
  }
  return out;
}

bool Progress::stderr_is_terminal() {
  return ::isatty(STDERR_FILENO) != 0;
}

Progress::Progress(int64_t total_steps, int64_t first_step, bool live, int64_t log_interval)
    : total_(total_steps),
      first_step_(first_step),
      step_(first_step),
      live_(live),
      log_interval_(log_interval > 0 ? log_interval : 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  finish();
}

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(const ProgressUpdate& u) {
  step_ = u.step;
  lr_ = u.lr;
  loss_ema_ = have_loss_ ? 0.9 * loss_ema_ + 0.1 * u.loss : u.loss;
  have_loss_ = true;
  tokens_ += static_cast<double>(u.tokens);
  seconds_ += u.seconds;
  interval_loss_ += u.loss;
  interval_steps_ += 1;
  interval_tokens_ += static_cast<double>(u.tokens);
  interval_seconds_ += u.seconds;
  if (live_) {
    const auto now = std::chrono::steady_clock::now();
    // Redraw at most 10 times a second (and always on the last step).
    if (u.step == total_ || std::chrono::duration<double>(now - last_draw_).count() >= 0.1) {
      last_draw_ = now;
      draw();
    }
    return;
  }
  if (u.step % log_interval_ == 0 || u.step == total_) {
    const double rate = interval_seconds_ > 0 ? interval_tokens_ / interval_seconds_ : 0;
    const double per_step = elapsed_seconds() / static_cast<double>(step_ - first_step_);
    std::printf("step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %s tok/s | elapsed %s | eta %s\n",
                static_cast<long long>(u.step), static_cast<long long>(total_),
                interval_loss_ / static_cast<double>(interval_steps_), u.lr, static_cast<double>(u.grad_norm),
                format_count(rate).c_str(), format_duration(elapsed_seconds()).c_str(),
                format_duration(per_step * static_cast<double>(total_ - step_)).c_str());
    std::fflush(stdout);
    interval_loss_ = 0;
    interval_steps_ = 0;
    interval_tokens_ = 0;
    interval_seconds_ = 0;
  }
}

void Progress::draw() {
  constexpr int kWidth = 24;
  const double fraction = total_ > 0 ? static_cast<double>(step_) / static_cast<double>(total_) : 1.0;
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  const double elapsed = elapsed_seconds();
  const int64_t done = step_ - first_step_;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - step_) : NAN;
  const double rate = seconds_ > 0 ? tokens_ / seconds_ : 0;
  std::fprintf(stderr, "\r\033[K[%s] %lld/%lld loss %.4f lr %.2e %s tok/s ETA %s", bar.c_str(),
               static_cast<long long>(step_), static_cast<long long>(total_), loss_ema_, lr_,
               format_count(rate).c_str(), format_duration(eta).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::clear() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

void Progress::line(const std::string& text) {
  const bool redraw = drawn_;
  clear();
  std::fflush(stderr);
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
  if (redraw && live_) draw();
}

void Progress::finish() {
  clear();
}

void stream_generate(const CausalLM& model, const std::vector<int64_t>& prompt, int64_t count,
                     const SamplingOptions& options, Rng& rng) {
  Utf8Stream utf8;
  generate(model, prompt, count, options, rng, [&](int64_t token) {
    // Control bytes other than tab and newline (an undertrained model emits them) could drive
    // the terminal (ESC sequences): print them as U+FFFD.
    const bool control = (token < 0x20 && token != '\n' && token != '\t') || token == 0x7F;
    const std::string text = control ? utf8.finish() + "\xEF\xBF\xBD" : utf8.push(static_cast<uint8_t>(token));
    if (!text.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
  });
  const std::string rest = utf8.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fflush(stdout);
}

std::string format_confusion(const std::vector<std::string>& labels,
                             const std::vector<std::vector<int64_t>>& confusion) {
  size_t width = 9;
  for (const auto& l : labels) width = std::max(width, l.size() + 1);
  std::string out = fmt::format("confusion matrix (rows: true language, columns: predicted)\n{:<{}}", "", width);
  for (const auto& l : labels) out += fmt::format("{:>{}}", l, width);
  out += fmt::format("{:>{}}\n", "recall", width);
  for (size_t r = 0; r < labels.size(); ++r) {
    out += fmt::format("{:<{}}", labels[r], width);
    int64_t total = 0;
    for (size_t c = 0; c < labels.size(); ++c) {
      out += fmt::format("{:>{}}", confusion[r][c], width);
      total += confusion[r][c];
    }
    const double recall = total > 0 ? 100.0 * static_cast<double>(confusion[r][r]) / static_cast<double>(total) : 0.0;
    out += fmt::format("{:>{}.1f}%\n", recall, width - 1);
  }
  return out;
}

}  // namespace cabm::cli
