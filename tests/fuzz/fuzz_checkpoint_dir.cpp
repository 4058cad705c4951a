// Bytes → a run directory on disk, then checkpoint resolution and loading as `cabm eval
// --checkpoint`, `cabm generate` and `cabm train --resume` do them: resolve_checkpoint (the
// `latest` file, step-N directories, a checkpoint directory given directly), load_checkpoint
// (with and without for_resume, which also removes what an interrupted save left) and
// restore_optimizer_and_data; optionally save_checkpoint first (its keep policy and clean-up
// on the same tree). The tree is built in a per-process directory (on /dev/shm when there is
// one: the saves' fsyncs cost nothing there) and rebuilt for every input.
//
// Input: byte 0 flags, byte 1 keep, bytes 2..7 a step (little-endian, taken modulo
// kMaxSteps + 1); then the bytes of `latest` up to a NUL; then one entry per line, made in
// order: a kind byte and a relative name (components not empty, ".", "..", at most 64 bytes):
//   c NAME   a complete checkpoint (model, optimizer and state of a real save at step 3)
//   m NAME   a directory with only model.safetensors      o NAME   model and optimizer
//   s NAME   model and state.json                         d NAME   an empty directory
//   f NAME   an empty file                                l NAME>TARGET   a symbolic link
// Flags: 1 for_resume, 2 write `latest`, 4 save a checkpoint at the step first, 8 load the
// first entry's path instead of the run directory, 16 add a trailing '/' to the path.
#include "cabm/interop/state_dict.h"
#include "cabm/train/checkpoint.h"
#include "cabm/train/train_config.h"
#include "cabm/train/training_state.h"
#include "tests/fuzz/fuzz_util.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace {

namespace fs = std::filesystem;
using cabm::fuzz::invariant_failed;

constexpr int64_t kTemplateStep = 3;

cabm::NamedTensors make_params() {
  cabm::NamedTensors params = {{"l.weight", cabm::Tensor::zeros({3, 4})}, {"l.bias", cabm::Tensor::zeros({4})}};
  for (const auto& [name, t] : params)
    for (int64_t j = 0; j < t.numel(); ++j) t.data<float>()[j] = 0.1f * static_cast<float>(j % 5) - 0.2f;
  return params;
}

// A run after kTemplateStep steps, as the trainers write it: parameters, optimizer, state.
struct Template {
  cabm::NamedTensors params = make_params();
  cabm::AdamW opt = cabm::make_adamw(params, cabm::AdamWConfig{});
  nlohmann::json state;

  cabm::CheckpointWrite write(int64_t step) {
    cabm::CheckpointWrite w;
    w.step = step;
    w.params = &params;
    w.model_metadata = {{"model", "fuzz"}};
    w.optimizer = &opt;
    opt.step = step;
    state = {{"format", 1}, {"step", step}, {"seed", 1}, {"data_rng", {{"seed", 5}, {"position", 40 + step}}}};
    w.state = state;
    return w;
  }
};

struct Workspace {
  std::string root;      // per process
  std::string files;     // the template checkpoint's files
  std::string run;       // rebuilt for every input
  Template tmpl;

  Workspace() {
    const char* base = fs::is_directory("/dev/shm") ? "/dev/shm" : nullptr;
    std::string pattern = (base != nullptr ? fs::path(base) : fs::temp_directory_path()).string() +
                          "/cabm-fuzz-checkpoint-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("fuzz_checkpoint_dir: mkdtemp");
      std::abort();
    }
    root = pattern;
    files = cabm::save_checkpoint(root + "/template", tmpl.write(kTemplateStep), 1);
    run = root + "/run";
  }
  ~Workspace() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

Workspace& workspace() {
  static Workspace w;  // destroyed at exit: the directory goes with the process
  return w;
}

bool safe_name(std::string_view name) {
  if (name.empty() || name.size() > 200 || name.front() == '/') return false;
  size_t start = 0;
  for (int parts = 0; start <= name.size(); ++parts) {
    if (parts == 3) return false;
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    const std::string_view part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == ".." || part.size() > 64 || part.find('\0') != std::string_view::npos)
      return false;
    start = end + 1;
  }
  return true;
}

void copy_files(const Workspace& w, const fs::path& dir, std::initializer_list<const char*> names) {
  fs::create_directories(dir);
  for (const char* name : names) fs::copy_file(fs::path(w.files) / name, dir / name, fs::copy_options::overwrite_existing);
}

// Makes one entry (kind, then NAME or NAME>TARGET); one the tree cannot hold (a parent is a
// file, the name is taken) is skipped. Returns its name.
std::string make_entry(const Workspace& w, char kind, std::string_view rest) {
  const size_t arrow = rest.find('>');
  const std::string_view name = rest.substr(0, arrow);
  const std::string_view target = arrow == std::string_view::npos ? std::string_view() : rest.substr(arrow + 1);
  if (!safe_name(name) || (kind == 'l' && !safe_name(target))) return {};
  const fs::path path = fs::path(w.run) / std::string(name);
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return std::string(name);
  try {
    switch (kind) {
      case 'c': copy_files(w, path, {cabm::kModelFile, cabm::kOptimizerFile, cabm::kStateFile}); break;
      case 'm': copy_files(w, path, {cabm::kModelFile}); break;
      case 'o': copy_files(w, path, {cabm::kModelFile, cabm::kOptimizerFile}); break;
      case 's': copy_files(w, path, {cabm::kModelFile, cabm::kStateFile}); break;
      case 'd': fs::create_directories(path); break;
      case 'f': std::ofstream(path, std::ios::binary); break;
      case 'l': fs::create_symlink(std::string(target), path); break;
      default: break;
    }
  } catch (const fs::filesystem_error&) {
  }
  return std::string(name);
}

std::set<std::string> top_level(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) names.insert(entry.path().filename().string());
  return names;
}

bool is_step_dir_name(const std::string& name) {
  return cabm::checkpoint_name_step(name).has_value();
}

void check_resolved(std::string path, const std::string& resolved) {
  const fs::path r(resolved);
  const bool itself = resolved == path;
  if (!path.empty() && path.back() == '/') path.pop_back();
  const bool step_of_path = r.parent_path() == fs::path(path) && is_step_dir_name(r.filename().string());
  if (!itself && !step_of_path) invariant_failed("resolve_checkpoint returned neither the path nor a step-N directory in it");
  std::error_code ec;
  if (!fs::exists(r / cabm::kModelFile, ec)) invariant_failed("the resolved checkpoint has no model file");
}

void checkpoint_dir(std::string_view bytes) {
  if (bytes.size() < 8) return;
  Workspace& w = workspace();
  const auto flags = static_cast<unsigned char>(bytes[0]);
  const int64_t keep = 1 + static_cast<unsigned char>(bytes[1]) % 4;
  uint64_t raw_step = 0;
  for (int i = 0; i < 6; ++i) raw_step |= uint64_t{static_cast<unsigned char>(bytes[2 + i])} << (8 * i);
  const auto save_step = static_cast<int64_t>(raw_step % (static_cast<uint64_t>(cabm::kMaxSteps) + 1));
  bytes.remove_prefix(8);
  const size_t nul = bytes.find('\0');
  const std::string_view latest = bytes.substr(0, nul);
  std::string_view entries = nul == std::string_view::npos ? std::string_view() : bytes.substr(nul + 1);

  std::error_code ec;
  fs::remove_all(w.run, ec);
  fs::create_directories(w.run);
  std::string first;
  for (int n = 0; !entries.empty() && n < 16; ++n) {
    const size_t end = entries.find('\n');
    const std::string_view line = entries.substr(0, end);
    entries = end == std::string_view::npos ? std::string_view() : entries.substr(end + 1);
    if (line.size() < 2) continue;
    const std::string name = make_entry(w, line[0], line.substr(1));
    if (first.empty()) first = name;
  }
  if ((flags & 2) != 0 && !fs::is_directory(fs::path(w.run) / cabm::kLatestFile, ec))
    std::ofstream(fs::path(w.run) / cabm::kLatestFile, std::ios::binary | std::ios::trunc) << latest;

  const bool for_resume = (flags & 1) != 0;
  std::string path = w.run;
  if ((flags & 8) != 0 && !first.empty()) path += "/" + first;
  if ((flags & 16) != 0) path += "/";

  if ((flags & 4) != 0) {
    // A save that succeeds is what the next resolution of the run directory finds.
    std::string saved;
    cabm::fuzz::run([&] { saved = cabm::save_checkpoint(w.run, w.tmpl.write(save_step), keep); });
    if (!saved.empty()) {
      // The run directory itself holding a model file is a checkpoint directory (resolved first).
      const fs::file_status root_model = fs::status(fs::path(w.run) / cabm::kModelFile, ec);
      const bool root_is_checkpoint = fs::exists(root_model);
      if (ec && ec != std::errc::no_such_file_or_directory) saved.clear();  // unreadable: an error is right
      if (!saved.empty()) try {
        const std::string resolved = cabm::resolve_checkpoint(w.run);
        if (resolved != (root_is_checkpoint ? w.run : saved))
          invariant_failed("the run directory does not resolve to the checkpoint just saved");
        const cabm::LoadedCheckpoint loaded = cabm::load_checkpoint(saved, true);
        if (cabm::checkpoint_step(loaded) != save_step) invariant_failed("the saved checkpoint's step changed");
      } catch (const cabm::Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        invariant_failed("a checkpoint just saved does not load");
      }
      int64_t steps = 0;
      for (const std::string& name : top_level(w.run))
        if (is_step_dir_name(name) && fs::is_directory(fs::path(w.run) / name, ec)) ++steps;
      if (steps > keep) invariant_failed("save_checkpoint kept more than `keep` checkpoints");
    }
  }

  const std::string resolved = cabm::resolve_checkpoint(path);
  check_resolved(path, resolved);
  const std::set<std::string> before = top_level(w.run);
  const cabm::LoadedCheckpoint checkpoint = cabm::load_checkpoint(path, for_resume);
  if (checkpoint.dir != resolved) invariant_failed("load_checkpoint loaded another directory than resolve_checkpoint");
  if (!fs::is_regular_file(fs::path(checkpoint.dir) / cabm::kModelFile, ec))
    invariant_failed("loading removed the checkpoint's model file");
  for (const std::string& name : before)
    if (!cabm::is_save_leftover(name) && !fs::exists(fs::symlink_status(fs::path(w.run) / name, ec)))
      invariant_failed("loading removed an entry of the run directory that is not a save's leftover");
  const int64_t step = cabm::checkpoint_step(checkpoint);
  if (step < 0 || step > cabm::kMaxSteps) invariant_failed("a step out of range was accepted");

  cabm::NamedTensors params = make_params();
  cabm::load_parameters(checkpoint.model, params);
  if (for_resume) {
    cabm::AdamW opt = cabm::make_adamw(params, cabm::AdamWConfig{});
    cabm::Rng data_rng;
    cabm::restore_optimizer_and_data(checkpoint, opt, data_rng);
    if (opt.step != step) invariant_failed("the optimizer's step differs from state.json's");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return cabm::fuzz::run([&] { checkpoint_dir(cabm::fuzz::as_text(data, size)); });
}
