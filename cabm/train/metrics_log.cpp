#include "cabm/train/metrics_log.h"

#include "cabm/core/error.h"
#include "cabm/train/checkpoint.h"

#include <fmt/format.h>

#include <filesystem>

namespace cabm {

namespace fs = std::filesystem;

namespace {

// The lines of an earlier log with step <= last_step; a torn last line (a kill mid-write) or
// anything unreadable is dropped, since the resumed run writes those steps again.
std::string kept_lines(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.is_object() || !record.contains("step") ||
        !record["step"].is_number_integer())
      continue;
    if (record["step"].get<int64_t>() <= last_step) kept += line + "\n";
  }
  return kept;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& out_dir, int64_t resumed_step) : path_((fs::path(out_dir) / kMetricsFile).string()) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create the run directory: {}", out_dir, ec.message()));
  // Both cases replace the file atomically (a kill leaves the old one or the new one).
  write_file_atomic(path_, resumed_step < 0 ? std::string() : kept_lines(path_, resumed_step));
  out_.open(path_, std::ios::app);
  if (!out_) throw Error(fmt::format("{}: cannot open for appending", path_));
}

void MetricsLog::write(const nlohmann::ordered_json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw Error(fmt::format("{}: write failed (disk full?)", path_));
}

}  // namespace cabm
