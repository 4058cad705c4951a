// metrics.jsonl: the run's metrics as data, one JSON object per line, in the run directory:
//   {"step": 250, "loss": 1.93, "lr": 0.0019, "grad_norm": 0.41, "tokens_per_s": 15230.5,
//    "tokens": 1024, "seconds": 0.067, "comm_seconds": 0, "val_loss": 1.97}
// A line is written for every logged step (each log_interval-th, the last, and every step that
// was evaluated, which adds val_loss, and val_accuracy for langid). Only rank 0 of a data-
// parallel run writes it. A fresh run starts the file anew; a resumed one keeps the lines up
// to the step it resumes from (a run killed after its last checkpoint logged steps that the
// resumed run takes again) and appends, so that no step appears twice.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <string>

namespace cabm {

inline constexpr const char* kMetricsFile = "metrics.jsonl";

class MetricsLog {
 public:
  // Opens out_dir/metrics.jsonl (creating out_dir): fresh (resumed_step < 0) or continuing a
  // run resumed at resumed_step. Errors name the file.
  MetricsLog(const std::string& out_dir, int64_t resumed_step);
  // Appends one line and flushes it.
  void write(const nlohmann::ordered_json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace cabm
