// Terminal output of the training commands.
//
// Progress of a training run: a live one-line bar on a terminal (step/total, loss, lr,
// tokens/s, ETA, redrawn in place on stderr), otherwise one plain log line per `log_interval`
// steps on stdout, so logs in files and CI stay readable.
#pragma once

#include "cabm/nn/causal_lm.h"
#include "cabm/train/generate.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace cabm::cli {

struct ProgressUpdate {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  float grad_norm = 0;
  int64_t tokens = 0;  // processed by this step
  double seconds = 0;  // this step's wall time
};

class Progress {
 public:
  // live: draw a bar on stderr (pass isatty(stderr)); first_step: the step a resumed run
  // starts after (ETA and rates count from there).
  Progress(int64_t total_steps, int64_t first_step, bool live, int64_t log_interval);
  ~Progress();

  void update(const ProgressUpdate& u);
  // Prints a whole line on stdout without garbling the bar (cleared, then redrawn).
  void line(const std::string& text);
  // Clears the bar (end of run).
  void finish();

  static bool stderr_is_terminal();
  double elapsed_seconds() const;
  // Training throughput so far: tokens over the summed step times (evaluation and
  // checkpoints excluded).
  double tokens_per_second() const { return seconds_ > 0 ? tokens_ / seconds_ : 0.0; }

 private:
  void draw();
  void clear();

  int64_t total_, first_step_, step_ = 0;
  bool live_;
  int64_t log_interval_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  double loss_ema_ = 0;
  bool have_loss_ = false;
  double lr_ = 0;
  double tokens_ = 0, seconds_ = 0;  // totals since start
  double interval_loss_ = 0;
  int64_t interval_steps_ = 0;
  double interval_tokens_ = 0, interval_seconds_ = 0;
  bool drawn_ = false;
};

// Generates `count` bytes after `prompt` and prints them to stdout as they come (complete
// UTF-8 characters only; ill-formed byte sequences print as U+FFFD).
void stream_generate(const CausalLM& model, const std::vector<int64_t>& prompt, int64_t count,
                     const SamplingOptions& options, Rng& rng);

// A confusion matrix as an aligned text table (rows: true class, columns: predicted), with
// per-class recall.
std::string format_confusion(const std::vector<std::string>& labels,
                             const std::vector<std::vector<int64_t>>& confusion);

std::string format_duration(double seconds);  // "1h02m", "3m07s", "42s"
std::string format_count(double n);           // "12,345"

}  // namespace cabm::cli
