// A whole training run as one library call: what `cabm train` does, without the command line.
//
//   set-up    validate the config; a fresh run replaces the checkpoints of an earlier run in
//             config.out_dir, a resumed one continues the run saved there bit for bit
//   loop      until config.steps: one optimizer step; validation at every eval_interval
//             and at the end; a checkpoint at every checkpoint_interval (else eval_interval),
//             at the end, at config.stop_at and when the caller asks to stop
//
// The caller sees the run through callbacks (all optional) and gets a TrainResult back. The
// command line adds the progress bar, Ctrl-C (stop_requested) and the final sample. Every
// logged step is also a line of out_dir/metrics.jsonl (cabm/train/metrics_log.h).
//
// Data parallelism (cabm/train/distributed.h): started by `mpirun -np K`, every process calls
// train() with the same config; config.batch_size is per process, so a step sees K·batch_size
// sequences, the same ones, in the same order, as one process with K times the batch. Rank 0
// alone evaluates, writes checkpoints and metrics.jsonl, and receives the callbacks (but
// stop_requested, polled on every rank: any rank's request stops all). A resumed run needs the
// same K and the run directory readable by every rank. An error on one rank is thrown on that
// rank only: end the job then (abort_job), or the others wait in their next collective.
#pragma once

#include "cabm/io/text_data.h"
#include "cabm/io/word_lists.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/classifier.h"
#include "cabm/train/checkpoint.h"
#include "cabm/train/train_config.h"
#include "cabm/train/training_state.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace cabm {

// One validation: mean loss (nats per byte or per word); accuracy and confusion for langid.
struct EvalReport {
  int64_t step = 0;
  double loss = 0;
  std::optional<double> accuracy;
  std::vector<std::vector<int64_t>> confusion;  // [true class][predicted class]
  nlohmann::json metrics;                       // as saved in the checkpoint's state.json
};

// What the run is about to do, after set-up (the pointers live until the run returns).
struct TrainStart {
  const TrainConfig* config = nullptr;
  int64_t parameters = 0;
  int64_t step = 0;                  // the step it continues after (0: fresh)
  std::string resumed_from;          // checkpoint directory, when resumed
  bool replaced_earlier_run = false;  // a fresh run removed checkpoints in out_dir
  int world_size = 1;                // processes of a data-parallel run (mpirun -np K)
  const TextSplit* text = nullptr;   // task lm
  const WordDataset* words = nullptr;  // task langid
};

enum class TrainStop { kFinished, kStopAt, kStopRequested };

struct TrainResult {
  TrainStop stop = TrainStop::kFinished;
  int64_t step = 0;                     // the last step taken
  std::optional<EvalReport> last_eval;  // the newest validation, if any ran
  std::string checkpoint;               // the newest checkpoint written ("" if none)
};

// The trained model, for on_end (valid during the call only).
struct TrainedModel {
  const CausalLM* lm = nullptr;
  const Classifier* classifier = nullptr;
  const WordDataset* words = nullptr;
};

struct TrainCallbacks {
  std::function<void(const TrainStart&)> on_start;
  std::function<void(const StepStats&)> on_step;
  std::function<void(const EvalReport&)> on_eval;
  std::function<void(int64_t step, const std::string& dir)> on_checkpoint;
  std::function<bool()> stop_requested;  // polled after every step: true saves and stops
  std::function<void(const TrainResult&, const TrainedModel&)> on_end;
};

// Runs training. resume = false: a fresh run from config (config.init or random weights);
// resume = true: continues the run saved in config.out_dir, whose saved configuration (see
// saved_train_config) `config` must equal except for the keys changeable_on_resume allows.
// Errors (bad config, unreadable data or checkpoint, divergence) are cabm::Error.
TrainResult train(const TrainConfig& config, const TrainCallbacks& callbacks = {}, bool resume = false);

// The configuration of the run saved in checkpoint (state.json "config"); errors name the file.
TrainConfig saved_train_config(const LoadedCheckpoint& checkpoint);
// Keys of to_json(TrainConfig) that a resumed run may change: steps, intervals, keep, out, ...
bool changeable_on_resume(const std::string& key);
// Throws cabm::Error naming the first key where `requested` differs from `saved` and may not.
void check_resume_config(const TrainConfig& saved, const TrainConfig& requested);

// When `init_path` holds a cabm model file of the task's kind, sets c's architecture (layers,
// heads, widths, context, norm placement) from its metadata; a plain state_dict leaves c.
void adopt_init_architecture(const std::string& init_path, TrainTask task, TrainConfig& c);

}  // namespace cabm
