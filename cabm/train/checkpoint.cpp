#include "cabm/train/checkpoint.h"

#include "cabm/core/checked.h"
#include "cabm/core/error.h"
#include "cabm/interop/state_dict.h"
#include "cabm/io/text_data.h"
#include "cabm/train/json_reader.h"
#include "cabm/train/train_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

namespace cabm {

namespace fs = std::filesystem;

namespace {

std::string errno_str() {
  return std::strerror(errno);
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("{}: cannot open to flush: {}", path, errno_str()));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error(fmt::format("{}: cannot flush to disk: {}", path, errno_str()));
}

std::string step_name(int64_t step) {
  return fmt::format("step-{:08d}", step);
}

}  // namespace

std::optional<int64_t> checkpoint_name_step(const std::string& name) {
  // kMaxSteps has 13 digits; the parse below cannot overflow.
  if (name.size() < 13 || name.size() > 18 || name.compare(0, 5, "step-") != 0) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  if (step > kMaxSteps || step_name(step) != name) return std::nullopt;
  return step;
}

namespace {

// A fresh hidden directory for a checkpoint being written. mkdir(2) applies the umask, so the
// finished checkpoint has the permissions of any directory the user creates (mkdtemp's are
// always 0700: another user of a shared run directory could not read them).
std::string make_temp_dir(const std::string& run_dir, const std::string& name) {
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string temp =
        (fs::path(run_dir) / fmt::format(".tmp-{}-{}-{}", name, ::getpid(), counter.fetch_add(1))).string();
    if (::mkdir(temp.c_str(), 0777) == 0) return temp;
    if (errno != EEXIST)
      throw Error(fmt::format("{}: cannot create a temporary checkpoint directory: {}", run_dir, errno_str()));
  }
  throw Error(fmt::format("{}: cannot create a temporary checkpoint directory (names taken)", run_dir));
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

bool is_save_leftover(const std::string& name) {
  return name.rfind(".tmp-step-", 0) == 0 || name.rfind(".old-step-", 0) == 0 ||
         name.rfind(std::string(kLatestFile) + kAtomicTempInfix, 0) == 0;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string temp = fmt::format("{}{}{}", path, kAtomicTempInfix, ::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw Error(fmt::format("{}: cannot create: {}", temp, errno_str()));
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t put = ::write(fd, p, left);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) {
      ::close(fd);
      ::unlink(temp.c_str());
      throw Error(fmt::format("{}: write error: {}", temp, errno_str()));
    }
    p += put;
    left -= static_cast<size_t>(put);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(temp.c_str());
    throw Error(fmt::format("{}: cannot flush to disk: {}", temp, errno_str()));
  }
  // SQLite's practice: the directory is flushed before the rename (the temporary file's entry
  // is on disk) and after it (the rename is), so a power loss, not only a kill, leaves either
  // the old file or the new one.
  const std::string dir = fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string();
  try {
    fsync_path(dir, true);
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    ::unlink(temp.c_str());
    throw Error(fmt::format("{}: cannot rename {} to it: {}", path, temp, errno_str()));
  }
  fsync_path(dir, true);
}

std::map<std::string, Tensor> adamw_state_tensors(const AdamW& opt) {
  std::map<std::string, Tensor> out;
  for (size_t i = 0; i < opt.names.size(); ++i) {
    out.emplace("exp_avg." + opt.names[i], opt.exp_avg[i]);
    out.emplace("exp_avg_sq." + opt.names[i], opt.exp_avg_sq[i]);
  }
  return out;
}

std::map<std::string, std::string> adamw_state_metadata(const AdamW& opt) {
  const auto num = [](double v) { return fmt::format("{}", v); };  // shortest round-trip form
  return {{"optimizer", "AdamW"},           {"step", std::to_string(opt.step)},
          {"beta1", num(opt.config.beta1)}, {"beta2", num(opt.config.beta2)},
          {"eps", num(opt.config.eps)},     {"weight_decay", num(opt.config.weight_decay)}};
}

namespace {

// Adam's first moment is bounded by its second whatever the gradients. From zero moments,
// m_t = (1−β1) Σ_k β1^k g_{t−k} and v_t = (1−β2) Σ_k β2^k g_{t−k}², and Cauchy–Schwarz applied to
// Σ_k (β1^k β2^{−k/2})·(β2^{k/2} g_{t−k}) gives
//   m_t² ≤ (1−β1)² / ((1−β2)(1 − β1²/β2)) · v_t      when β1² < β2
// (|m| ≤ 7.27·√v for the default betas 0.9, 0.999). The check allows twice that constant (fp32
// rounding of m and v over many steps; a run resumed with betas slightly different from those
// that made the state), and adds the optimizer's eps to √v: a tiny m whose v underflowed to 0
// in fp32 (a gradient of 1e-30 squares to 0) stays legal, and the first update
// lr·m̂/(√v̂ + eps) stays bounded by about lr·C/(1−β1) either way. With β1² ≥ β2 the series
// Σ (β1²/β2)^k diverges and no such bound exists: nullopt, nothing to check.
std::optional<double> adam_moment_bound(double beta1, double beta2) {
  if (!(beta1 * beta1 < beta2)) return std::nullopt;
  constexpr double kSafety = 2;
  return kSafety * (1 - beta1) / std::sqrt((1 - beta2) * (1 - beta1 * beta1 / beta2));
}

struct MomentBound {
  double c, beta1, beta2;  // |m| <= c·(√v + eps), from the betas (beta1, beta2)
};

// The bound a loaded state must obey: the betas that made it (the file's metadata) decide what it
// can hold, and the run's may differ (a resumed run given other betas), so the looser of the two
// bounds, and none where either pair has none. Betas in the metadata must be numbers in [0, 1).
std::optional<MomentBound> loaded_state_bound(const SafetensorsFile& file, const AdamWConfig& run) {
  std::optional<MomentBound> bound;
  if (const auto c = adam_moment_bound(run.beta1, run.beta2)) bound = MomentBound{*c, run.beta1, run.beta2};
  const std::string *b1 = file.find_metadata("beta1"), *b2 = file.find_metadata("beta2");
  if (b1 == nullptr || b2 == nullptr) return bound;  // a state without them: the run's betas alone
  const RealRange unit{0.0, 1.0, false, true};
  const double beta1 = parse_real(*b1, unit, fmt::format("{}: metadata 'beta1'", file.path));
  const double beta2 = parse_real(*b2, unit, fmt::format("{}: metadata 'beta2'", file.path));
  const auto c = adam_moment_bound(beta1, beta2);
  if (!c) return std::nullopt;
  if (bound && *c > bound->c) bound = MomentBound{*c, beta1, beta2};
  return bound;
}

}  // namespace

void load_adamw_state(const SafetensorsFile& file, AdamW& opt) {
  const std::string* kind = file.find_metadata("optimizer");
  if (kind == nullptr || *kind != "AdamW")
    throw Error(fmt::format("{}: not an AdamW state (metadata 'optimizer')", file.path));
  const int64_t step =
      parse_integer(file.get_metadata("step"), 0, kMaxSteps, fmt::format("{}: metadata 'step'", file.path));
  // m must be finite, v finite and >= 0 (a mean of squares), and |m| within the bound above:
  // otherwise the first update writes NaN, ±inf or a huge step into the weights, and the run
  // later stops as "diverged (try a lower --lr)", blaming the learning rate for a damaged file.
  const std::optional<MomentBound> bound = loaded_state_bound(file, opt.config);
  const double eps = opt.config.eps;
  const auto check_values = [&](const std::string& name, const Tensor& m, const Tensor& v) {
    const std::string m_name = "exp_avg." + name, v_name = "exp_avg_sq." + name;
    const float* mp = m.data<float>();
    const float* vp = v.data<float>();
    for (int64_t j = 0; j < m.numel(); ++j) {
      if (!std::isfinite(mp[j]))
        throw Error(fmt::format("{}: tensor '{}' holds {} at element {} (expected a finite value)", file.path, m_name,
                                mp[j], j));
      if (!std::isfinite(vp[j]) || vp[j] < 0.0f)
        throw Error(fmt::format("{}: tensor '{}' holds {} at element {} (expected a finite, non-negative value)",
                                file.path, v_name, vp[j], j));
      if (bound && std::abs(static_cast<double>(mp[j])) > bound->c * (std::sqrt(static_cast<double>(vp[j])) + eps))
        throw Error(fmt::format(
            "{}: tensor '{}' holds {} at element {} where '{}' holds {}, beyond AdamW's bound |exp_avg| <= "
            "{:.3g}·(√exp_avg_sq + eps {}) for betas ({}, {}): not a state AdamW produces, and the first update "
            "from it would be unbounded",
            file.path, m_name, mp[j], j, v_name, vp[j], bound->c, eps, bound->beta1, bound->beta2));
    }
  };
  for (size_t i = 0; i < opt.names.size(); ++i) {
    const Shape& shape = opt.exp_avg[i].shape();
    const Tensor& m_file = file.get("exp_avg." + opt.names[i], DType::F32, shape);
    const Tensor& v_file = file.get("exp_avg_sq." + opt.names[i], DType::F32, shape);
    check_values(opt.names[i], m_file, v_file);
    opt.exp_avg[i].copy_from(m_file);
    opt.exp_avg_sq[i].copy_from(v_file);
  }
  if (file.tensors.size() != 2 * opt.names.size())
    throw Error(fmt::format("{}: holds {} tensors, expected {} (the model's parameters differ)", file.path,
                            file.tensors.size(), 2 * opt.names.size()));
  opt.step = step;
}

std::string save_checkpoint(const std::string& run_dir, const CheckpointWrite& checkpoint, int64_t keep) {
  CABM_CHECK(checkpoint.params != nullptr, "save_checkpoint needs the parameters");
  CABM_CHECK(keep >= 1, "keep at least one checkpoint");
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create the run directory: {}", run_dir, ec.message()));
  if (!fs::is_directory(run_dir)) throw Error(fmt::format("{}: not a directory", run_dir));

  const std::string name = step_name(checkpoint.step);
  const std::string temp = make_temp_dir(run_dir, name);
  try {
    // write_safetensors itself writes a temporary file, flushes and renames.
    write_safetensors((fs::path(temp) / kModelFile).string(), to_tensor_map(*checkpoint.params),
                      checkpoint.model_metadata);
    if (checkpoint.optimizer != nullptr)
      write_safetensors((fs::path(temp) / kOptimizerFile).string(), adamw_state_tensors(*checkpoint.optimizer),
                        adamw_state_metadata(*checkpoint.optimizer));
    write_file_atomic((fs::path(temp) / kStateFile).string(), checkpoint.state.dump(2) + "\n");
    fsync_path(temp, true);
    fsync_path(run_dir, true);  // the temporary directory's entry, before it is renamed

    const std::string final_dir = (fs::path(run_dir) / name).string();
    if (fs::exists(final_dir)) {
      // Re-saving a step (a resumed run passing the same step again). If `latest` names it, it
      // must not disappear before the replacement is in place: move it aside first.
      const std::string old = (fs::path(run_dir) / fmt::format(".old-{}-{}", name, ::getpid())).string();
      fs::remove_all(old, ec);
      fs::rename(final_dir, old);
      fs::rename(temp, final_dir);
      fs::remove_all(old, ec);
    } else {
      fs::rename(temp, final_dir);
    }
    fsync_path(run_dir, true);
    write_file_atomic((fs::path(run_dir) / kLatestFile).string(), name + "\n");  // flushes run_dir too
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(temp, ec);
    throw Error(fmt::format("{}: cannot save checkpoint: {}", run_dir, e.what()));
  } catch (...) {
    fs::remove_all(temp, ec);
    throw;
  }

  // Housekeeping: what a killed save left behind and checkpoints beyond `keep`.
  std::vector<std::pair<int64_t, std::string>> steps;  // (step, name)
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    const std::string n = entry.path().filename().string();
    if (is_save_leftover(n)) {
      fs::remove_all(entry.path(), ec);
    } else if (const std::optional<int64_t> s = checkpoint_name_step(n); s && entry.is_directory(ec)) {
      // An entry that cannot be examined (a symbolic link loop, no permission) is not a
      // checkpoint this save may delete: left alone, and the save stands.
      steps.emplace_back(*s, n);
    }
  }
  // Keep the newest `keep` by step number (not by name: step-100000000 sorts before
  // step-99999999), and always the one just written.
  std::sort(steps.begin(), steps.end());
  int64_t kept = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (it->second == name || kept < keep - 1) {
      if (it->second != name) ++kept;
      continue;
    }
    // Renamed out of the step-* names first (one atomic rename), then deleted: a kill inside
    // remove_all would otherwise leave a step-N directory with some of its files gone, which
    // `cabm eval --checkpoint DIR/step-N` then refuses (tests/cli/test_cli_crash_safety.cpp
    // found an empty one). What a kill leaves now is a .old-step-* leftover, which the next save
    // or fresh run removes.
    const fs::path doomed = fs::path(run_dir) / fmt::format(".old-{}-{}", it->second, ::getpid());
    fs::remove_all(doomed, ec);
    fs::rename(fs::path(run_dir) / it->second, doomed, ec);
    fs::remove_all(ec ? fs::path(run_dir) / it->second : doomed, ec);
  }
  return (fs::path(run_dir) / name).string();
}

bool has_checkpoint(const std::string& run_dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(run_dir) / kLatestFile, ec);
}

namespace {

// Whether `path` exists; an error other than "does not exist" (no permission to look) is one,
// so that another user's unreadable run is not reported as a missing file.
bool exists_checked(const fs::path& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw Error(fmt::format("{}: cannot access: {}", path.string(), ec.message()));
  return fs::exists(status);
}

}  // namespace

std::string resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!exists_checked(path)) throw Error(fmt::format("{}: no such checkpoint directory", path));
  if (!fs::is_directory(path, ec)) throw Error(fmt::format("{}: not a checkpoint directory", path));
  if (exists_checked(fs::path(path) / kModelFile)) return path;
  const fs::path latest = fs::path(path) / kLatestFile;
  if (exists_checked(latest)) {
    const std::string name = trim(read_file_bytes(latest.string()));
    if (!checkpoint_name_step(name))
      throw Error(fmt::format("{}: malformed (expected step-NNNNNNNN: the step, at least 8 digits, at most {})",
                              latest.string(), kMaxSteps));
    const fs::path dir = fs::path(path) / name;
    if (!exists_checked(dir / kModelFile))
      throw Error(fmt::format("{}: names {}, which has no {}", latest.string(), name, kModelFile));
    return dir.string();
  }
  throw Error(fmt::format("{}: not a checkpoint (no {} or {} inside)", path, kModelFile, kLatestFile));
}

std::string state_file_path(const LoadedCheckpoint& checkpoint) {
  return (fs::path(checkpoint.dir) / kStateFile).string();
}

int64_t checkpoint_step(const LoadedCheckpoint& checkpoint) {
  if (!checkpoint.state.contains("step")) return 0;
  return JsonReader(checkpoint.state, state_file_path(checkpoint)).integer("step", 0, kMaxSteps);
}

LoadedCheckpoint load_checkpoint(const std::string& path, bool for_resume) {
  LoadedCheckpoint out;
  out.dir = resolve_checkpoint(path);
  const fs::path dir(out.dir);
  out.model = read_safetensors((dir / kModelFile).string());
  const fs::path optimizer = dir / kOptimizerFile;
  if (exists_checked(optimizer)) {
    if (for_resume) out.optimizer = read_safetensors(optimizer.string());
  } else if (for_resume) {
    throw Error(fmt::format("{}: missing {} (needed to resume)", out.dir, kOptimizerFile));
  }
  const fs::path state = dir / kStateFile;
  if (exists_checked(state)) {
    const std::string text = read_file_bytes(state.string());
    try {
      out.state = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: not valid JSON: {}", state.string(), json_error_text(e)));
    }
    if (!out.state.is_object())
      throw Error(fmt::format("{}: expected a JSON object, found {}", state.string(), out.state.type_name()));
    checkpoint_step(out);  // a step that is not a step count is an error here, for every command
  } else if (for_resume) {
    throw Error(fmt::format("{}: missing {} (needed to resume)", out.dir, kStateFile));
  } else {
    out.state = nlohmann::json::object();
  }
  if (for_resume && out.dir != path) {
    // Resuming a run directory: what a killed save left is removed here too, not only by the
    // next save. A kill after the last save's `latest` update but before its housekeeping
    // leaves a finished run with latest.tmp.* or .old-step-* that no later save would remove
    // (the resumed run has no step left to train); tests/cli/test_cli_crash_safety.cpp found
    // one. Done once the checkpoint has loaded, so that a refused resume changes nothing.
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(path, ec))
      if (is_save_leftover(entry.path().filename().string())) fs::remove_all(entry.path(), ec);
  }
  return out;
}

}  // namespace cabm
