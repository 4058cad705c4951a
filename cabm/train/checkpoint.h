// Training checkpoints: everything needed to continue a run bit for bit, or to use its model.
//
// A run directory (--out) holds numbered checkpoint directories and a pointer to the newest:
//
//   runs/lm/latest                       text: "step-00001000" (8 digits or more)
//   runs/lm/step-00001000/model.safetensors       parameters, PyTorch names; the model's
//                                                  configuration in __metadata__ (strings)
//   runs/lm/step-00001000/optimizer.safetensors   "exp_avg.<name>", "exp_avg_sq.<name>";
//                                                  step and hyper-parameters in __metadata__
//   runs/lm/step-00001000/state.json             step, RNG seed/position, data position,
//                                                  training configuration, last metrics
//
// Crash safety: a checkpoint is written into a fresh hidden directory (.tmp-step-N-PID-K, with
// the umask's permissions), every file flushed to disk, the run directory flushed, and the
// directory renamed to step-N (one atomic rename), then `latest` is replaced atomically
// (latest.tmp.PID + rename, the directory flushed before and after). A crash at any moment
// leaves `latest` naming a complete checkpoint (the previous one until the new one is whole);
// what a killed save leaves (.tmp-step-*, .old-step-*, latest.tmp.*) is ignored and removed by
// the next save, a fresh run or a resume (load_checkpoint for_resume). Older checkpoints beyond
// `keep` are deleted only after `latest` points at the new one, each renamed to .old-step-* first
// so that a kill during the deletion never leaves a half-deleted step-N.
#pragma once

#include "cabm/io/safetensors.h"
#include "cabm/nn/parameters.h"
#include "cabm/train/adamw.h"

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>

namespace cabm {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kStateFile = "state.json";
inline constexpr const char* kLatestFile = "latest";
inline constexpr const char* kAtomicTempInfix = ".tmp.";  // write_file_atomic: PATH.tmp.PID

// Whether a run directory entry is what an interrupted save leaves behind.
bool is_save_leftover(const std::string& name);
// The step of a checkpoint directory name as save_checkpoint writes it ("step-" and the step
// zero-padded to 8 digits, more from step 10^8 on, at most kMaxSteps); nullopt for any other.
std::optional<int64_t> checkpoint_name_step(const std::string& name);

struct CheckpointWrite {
  int64_t step = 0;
  const NamedTensors* params = nullptr;               // the model's parameters
  std::map<std::string, std::string> model_metadata;  // the model's configuration
  const AdamW* optimizer = nullptr;                   // optional
  nlohmann::json state = nlohmann::json::object();    // training state (JSON object)
};

// Writes checkpoint step-<step> into run_dir (created if missing) as described above and
// returns its directory. keep >= 1 checkpoints are kept (the newest ones).
std::string save_checkpoint(const std::string& run_dir, const CheckpointWrite& checkpoint, int64_t keep = 2);

// `path` is a checkpoint directory (has model.safetensors) or a run directory (has `latest`);
// returns the checkpoint directory. Errors are one clear line naming the path.
std::string resolve_checkpoint(const std::string& path);

// Whether `run_dir` has a `latest` checkpoint to resume from.
bool has_checkpoint(const std::string& run_dir);

struct LoadedCheckpoint {
  std::string dir;
  SafetensorsFile model;
  std::optional<SafetensorsFile> optimizer;  // when present and asked for
  nlohmann::json state;                      // {} when state.json is absent and not required
};

// Reads a checkpoint (resolve_checkpoint first). With `for_resume`, optimizer.safetensors
// and state.json are required. A state.json that is not a JSON object, or whose "step" is not
// a step count, is an error naming the file.
LoadedCheckpoint load_checkpoint(const std::string& path, bool for_resume);

std::string state_file_path(const LoadedCheckpoint& checkpoint);  // DIR/state.json
// state.json's "step" (0 when it has none), range-checked.
int64_t checkpoint_step(const LoadedCheckpoint& checkpoint);

// Optimizer state as tensors + metadata, and back (checks every name and shape against `opt`,
// which must have been made for the same parameters, and every value: m finite, v finite and
// >= 0, and |m| <= C·(√v + eps), the bound that Adam's moments obey whatever the gradients, for
// opt's betas and eps; see checkpoint.cpp).
std::map<std::string, Tensor> adamw_state_tensors(const AdamW& opt);
std::map<std::string, std::string> adamw_state_metadata(const AdamW& opt);
void load_adamw_state(const SafetensorsFile& file, AdamW& opt);

// Writes `text` to `path` atomically and durably (temporary file PATH.tmp.PID in the same
// directory, fsync, directory fsync, rename, directory fsync).
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace cabm
