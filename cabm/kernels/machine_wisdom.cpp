#include "cabm/kernels/machine_wisdom.h"

#include <cblas.h>
#include <dnnl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

namespace cabm {

namespace {

namespace fs = std::filesystem;

// The CPU by its model name, family and model number (virtual machines often report one name,
// "AMD EPYC", for a Zen 3 and a Zen 4, whose best routes differ), and the two libraries' builds:
// oneDNN's with the instruction set it runs (dnnl_cpu_isa_t's bits: ONEDNN_MAX_CPU_ISA changes it,
// and with it the speed of every route), OpenBLAS's with its kernels (OPENBLAS_CORETYPE).
std::string machine_id() {
  std::string cpu = "unknown CPU", family = "?", model = "?";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line) && !line.empty();) {  // the first processor's lines
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string field = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const std::string value = line.substr(std::min(line.size(), colon + 2));
    if (field == "model name") cpu = value;
    if (field == "cpu family") family = value;
    if (field == "model") model = value;
  }
  const dnnl_version_t* v = dnnl_version();
  std::string id =
      fmt::format("{} (family {} model {}) | oneDNN {}.{}.{} isa {:#x} | OpenBLAS {}", cpu, family, model, v->major,
                  v->minor, v->patch, static_cast<unsigned>(dnnl_get_effective_cpu_isa()), openblas_get_config());
  std::replace(id.begin(), id.end(), '\t', ' ');
  return id;
}

std::string environment_path() {
  if (const char* path = std::getenv("CABM_GEMM_WISDOM")) return path;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/cabm/gemm_routes.tsv";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/cabm/gemm_routes.tsv";
  return "off";
}

struct MachineValue {
  double value;
  bool from_file;
};

struct State {
  std::mutex mutex;                 // guards the override and the values, not the file
  std::optional<std::string> path;  // the tests' override
  std::map<std::string, MachineValue> values;
};

State& state() {
  static State s;
  return s;
}

std::string current_path(const State& s) {
  return s.path ? *s.path : environment_path();
}

bool off(const std::string& path) {
  return path.empty() || path == "off";
}

// A value field of the file: a finite number, the whole field.
std::optional<double> parse_value(const std::string& field) {
  if (field.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(field.c_str(), &end);
  if (end != field.c_str() + field.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<std::vector<std::string>> first_in(const std::string& path, const std::string& key, size_t field_count,
                                                 const std::function<bool(const std::vector<std::string>&)>& usable) {
  if (off(path)) return std::nullopt;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::stringstream ss(line);
    for (std::string f; std::getline(ss, f, '\t');) fields.push_back(f);
    if (fields.size() != field_count + 2 || fields[0] != wisdom::machine() || fields[1] != key) continue;
    fields.erase(fields.begin(), fields.begin() + 2);
    if (!usable || usable(fields)) return fields;
  }
  return std::nullopt;
}

void append_to(const std::string& path, const std::string& key, const std::vector<std::string>& fields) {
  if (off(path)) return;
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  std::string line = wisdom::machine() + "\t" + key;
  for (const std::string& f : fields) line += "\t" + f;
  line += "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  [[maybe_unused]] const ssize_t written = ::write(fd, line.data(), line.size());
  ::close(fd);
}

}  // namespace

namespace wisdom {

std::string path() {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  return current_path(s);
}

const std::string& machine() {
  static const std::string id = machine_id();
  return id;
}

std::optional<std::vector<std::string>> first(const std::string& key, size_t field_count,
                                              const std::function<bool(const std::vector<std::string>&)>& usable) {
  return first_in(path(), key, field_count, usable);
}

void append(const std::string& key, const std::vector<std::string>& fields) {
  append_to(path(), key, fields);
}

void reset(const std::optional<std::string>& path) {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.path = path;
  s.values.clear();
}

}  // namespace wisdom

double machine_value(const std::string& name, const std::function<double()>& measure) {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (const auto it = s.values.find(name); it != s.values.end()) return it->second.value;
  const std::string path = current_path(s), key = "value " + name;
  const auto usable = [](const std::vector<std::string>& f) { return parse_value(f[0]).has_value(); };
  if (const auto found = first_in(path, key, 1, usable)) {
    const MachineValue v{*parse_value((*found)[0]), true};
    s.values[name] = v;
    return v.value;
  }
  // The value as the file keeps it (6 digits), so that this process and the next take the same.
  const std::string written = fmt::format("{:.6g}", measure());
  MachineValue v{parse_value(written).value_or(0.0), false};
  append_to(path, key, {written});
  // Another process may have measured at the same time: the line that reached the file first wins.
  if (const auto found = first_in(path, key, 1, usable); found && (*found)[0] != written)
    v = {*parse_value((*found)[0]), true};
  s.values[name] = v;
  return v.value;
}

std::string machine_values_summary() {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  std::string list;
  for (const auto& [name, v] : s.values)
    list += fmt::format("{}{} {:.3g} ({})", list.empty() ? "" : ", ", name, v.value,
                        v.from_file ? "from the file" : "measured here");
  return fmt::format("machine values ({}): {}", current_path(s), list.empty() ? "none asked for" : list);
}

}  // namespace cabm
