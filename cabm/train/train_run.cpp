#include "cabm/train/train_run.h"

#include "cabm/core/error.h"
#include "cabm/train/json_reader.h"
#include "cabm/train/langid_trainer.h"
#include "cabm/train/lm_trainer.h"
#include "cabm/train/distributed.h"
#include "cabm/train/metrics_log.h"
#include "cabm/train/model_config.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <tuple>
#include <vector>

namespace cabm {

namespace {

namespace fs = std::filesystem;

// Removes the checkpoints of an earlier run in `dir` (a fresh run replaces them); true if any.
bool clear_previous_run(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  // `latest` goes first (a kill after it leaves no pointer to a checkpoint being deleted), then
  // each old checkpoint is renamed to a save leftover before it is deleted (a kill during the
  // deletion leaves only a leftover, which the next save removes, never a half-deleted step-N).
  bool removed = fs::remove(fs::path(dir) / kLatestFile, ec);
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // An entry that cannot be examined (a symbolic link loop, no permission) is left alone.
    if ((name.rfind("step-", 0) == 0 && entry.is_directory(ec)) || is_save_leftover(name)) doomed.push_back(entry.path());
  }
  for (const fs::path& path : doomed) {
    const std::string name = path.filename().string();
    fs::path target = path;
    if (!is_save_leftover(name)) {
      target = path.parent_path() / fmt::format(".old-{}-{}", name, ::getpid());
      if (fs::rename(path, target, ec); ec) target = path;
    }
    fs::remove_all(target, ec);
    removed = true;
  }
  return removed;
}

bool should_eval(const TrainConfig& c, int64_t step) {
  return step == c.steps || (c.eval_interval > 0 && step % c.eval_interval == 0);
}
bool should_save(const TrainConfig& c, int64_t step) {
  const int64_t every = c.checkpoint_interval > 0 ? c.checkpoint_interval : c.eval_interval;
  return step == c.steps || (every > 0 && step % every == 0);
}

int64_t count_parameters(const NamedTensors& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.tensor.numel();
  return n;
}

EvalReport evaluate_run(LmTrainer& trainer) {
  EvalReport r;
  r.loss = trainer.evaluate();
  r.metrics = {{"val_loss", r.loss}, {"val_bits_per_byte", r.loss / std::log(2.0)}};
  return r;
}
EvalReport evaluate_run(LangIdTrainer& trainer) {
  const ClassifierEval e = trainer.evaluate();
  EvalReport r;
  r.loss = e.loss;
  r.accuracy = e.accuracy;
  r.confusion = e.confusion;
  r.metrics = {{"val_loss", e.loss}, {"val_accuracy", e.accuracy}};
  return r;
}

TrainedModel trained_model(const LmTrainer& trainer) {
  return {&trainer.model(), nullptr, nullptr};
}
TrainedModel trained_model(const LangIdTrainer& trainer) {
  return {nullptr, &trainer.model(), &trainer.data()};
}

bool should_log(const TrainConfig& c, int64_t step) {
  return step % std::max<int64_t>(1, c.log_interval) == 0 || step == c.steps;
}

nlohmann::ordered_json metrics_record(const StepStats& s, const std::optional<EvalReport>& eval) {
  nlohmann::ordered_json r = {{"step", s.step},
                      {"loss", s.loss},
                      {"lr", s.lr},
                      {"grad_norm", s.grad_norm},
                      {"tokens_per_s", s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0.0},
                      {"tokens", s.tokens},
                      {"seconds", s.seconds},
                      {"comm_seconds", s.comm_seconds}};
  if (eval) {
    r["val_loss"] = eval->loss;
    if (eval->accuracy) r["val_accuracy"] = *eval->accuracy;
  }
  return r;
}

// The loop shared by both tasks: step, evaluate, checkpoint, stop. In a data-parallel run every
// rank steps; rank 0 alone evaluates, logs, saves and calls back (`lead`), and the decisions
// to save and stop are the same on all ranks.
template <typename Trainer>
TrainResult run_loop(Trainer& trainer, const TrainConfig& c, const TrainCallbacks& cb, MetricsLog* log) {
  const bool lead = world().rank == 0;
  TrainResult result;
  result.step = trainer.step();
  nlohmann::json metrics = nlohmann::json::object();
  while (trainer.step() < c.steps) {
    const StepStats s = trainer.train_step();
    result.step = s.step;
    if (lead && cb.on_step) cb.on_step(s);
    metrics["train_loss"] = s.loss;
    std::optional<EvalReport> eval;
    if (lead && should_eval(c, s.step)) {
      eval = evaluate_run(trainer);
      eval->step = s.step;
      metrics.update(eval->metrics);
      if (cb.on_eval) cb.on_eval(*eval);
      result.last_eval = eval;
    }
    const bool requested = any_rank(cb.stop_requested && cb.stop_requested());
    const bool stop_at = c.stop_at > 0 && s.step >= c.stop_at;
    if (log && (should_log(c, s.step) || eval || requested || stop_at)) log->write(metrics_record(s, eval));
    if (should_save(c, s.step) || requested || stop_at) {
      check_same_on_all_ranks(named_parameters(trainer.model()), "weights");
      if (lead) {
        result.checkpoint = trainer.save(metrics);
        if (cb.on_checkpoint) cb.on_checkpoint(s.step, result.checkpoint);
      }
    }
    if (requested || stop_at) {
      result.stop = requested ? TrainStop::kStopRequested : TrainStop::kStopAt;
      break;
    }
  }
  if (lead && cb.on_end) cb.on_end(result, trained_model(trainer));
  return result;
}

template <typename Trainer, typename Data>
TrainResult run(const TrainConfig& c, Data data, const LoadedCheckpoint* resume_from, bool replaced,
                const TrainCallbacks& cb) {
  Trainer trainer(c, std::move(data));
  if (resume_from) trainer.restore(*resume_from);
  trainer.synchronize_ranks();
  std::unique_ptr<MetricsLog> log;
  if (world().rank == 0) {
    log = std::make_unique<MetricsLog>(c.out_dir, resume_from ? trainer.step() : -1);
    if (cb.on_start) {
      TrainStart start;
      start.config = &c;
      start.parameters = count_parameters(named_parameters(trainer.model()));
      start.step = trainer.step();
      start.resumed_from = resume_from ? resume_from->dir : "";
      start.replaced_earlier_run = replaced;
      start.world_size = world().size;
      if constexpr (std::is_same_v<Data, TextSplit>)
        start.text = &trainer.data();
      else
        start.words = &trainer.data();
      cb.on_start(start);
    }
  }
  return run_loop(trainer, c, cb, log.get());
}

// A resumed run must have the K of the run it continues: the data each rank draws, the
// dropout streams and the global batch all depend on it.
void check_resume_world_size(const LoadedCheckpoint& checkpoint) {
  const JsonReader state(checkpoint.state, state_file_path(checkpoint));
  const int64_t saved = state.has("world_size") ? state.integer("world_size", 1, 1 << 24) : 1;
  const int now = world().size;
  if (saved != now)
    throw UsageError(fmt::format(
        "--resume: the run in {} was trained by {} process{} (mpirun -np {}), this one has {}: resume it with "
        "the same number of processes (the global batch and the data each process draws depend on it)",
        checkpoint.dir, saved, saved == 1 ? "" : "es", saved, now));
}

}  // namespace

bool changeable_on_resume(const std::string& key) {
  return key == "steps" || key == "eval_interval" || key == "checkpoint_interval" || key == "log_interval" ||
         key == "keep_checkpoints" || key == "sample_tokens" || key == "out";
}

void check_resume_config(const TrainConfig& saved, const TrainConfig& requested) {
  const nlohmann::json a = to_json(saved), b = to_json(requested);
  for (const auto& [key, value] : b.items()) {
    if (changeable_on_resume(key) || a.value(key, nlohmann::json()) == value) continue;
    throw UsageError(
        fmt::format("--resume continues the saved run, whose {} is {}; it cannot become {} (drop that flag "
                    "or start a new run with another --out)",
                    key, a.value(key, nlohmann::json()).dump(), value.dump()));
  }
}

TrainConfig saved_train_config(const LoadedCheckpoint& checkpoint) {
  const JsonReader state(checkpoint.state, state_file_path(checkpoint));
  const TrainConfig config = train_config_from_json(state.at("config"), state.where(), "config.");
  try {
    validate(config);
  } catch (const Error& e) {  // named by flag, but the file is at fault: not a usage error
    throw Error(fmt::format("{}: 'config': {}", state.where(), e.what()));
  }
  return config;
}

namespace {

// The saved configuration must describe the model in the checkpoint's model file: a state.json
// edited (or copied from another run) to, say, a thousand layers is refused before the
// trainer allocates them. The model file's own sizes are checked against its tensors by
// causal_lm_config_from / classifier_config_from.
template <typename ModelConfig>
void check_same_architecture(const LoadedCheckpoint& checkpoint, const TrainConfig& c, const ModelConfig& m) {
  const std::vector<std::tuple<const char*, int64_t, const char*, int64_t>> pairs = {
      {"layers", c.layers, "num_layers", m.num_layers},
      {"heads", c.heads, "nhead", m.nhead},
      {"kv_heads", c.kv_heads == 0 ? c.heads : c.kv_heads, "num_kv_heads", m.num_kv_heads},
      {"d_model", c.d_model, "d_model", m.d_model},
      {"d_ff", c.d_ff, "dim_feedforward", m.dim_feedforward},
      {"seq_len", c.seq_len, "max_seq_len", m.max_seq_len},
      {"norm_first", c.norm_first, "norm_first", m.norm_first}};
  for (const auto& [key, saved, meta, model] : pairs)
    if (saved != model)
      throw Error(fmt::format("{}: 'config.{}' is {}, but {} has {} {} (files of different runs?)",
                              state_file_path(checkpoint), key, saved, checkpoint.model.path, meta, model));
  if (c.positional != m.positional)
    throw Error(fmt::format("{}: 'config.positional' is {}, but {} has positional {} (files of different runs?)",
                            state_file_path(checkpoint), positional_name(c.positional), checkpoint.model.path,
                            positional_name(m.positional)));
}

void check_model_file(const LoadedCheckpoint& checkpoint, const TrainConfig& c) {
  std::vector<std::string> labels;
  if (c.task == TrainTask::kLanguageModel)
    check_same_architecture(checkpoint, c, causal_lm_config_from(checkpoint.model));
  else
    check_same_architecture(checkpoint, c, classifier_config_from(checkpoint.model, labels));
}

}  // namespace

void adopt_init_architecture(const std::string& path, TrainTask task, TrainConfig& c) {
  const SafetensorsFile file = read_safetensors(path);
  const std::string kind = model_kind(file);
  if (kind.empty()) return;  // a plain state_dict: the flags say what it is
  // The flags a model file fixes (the shape that byte_model_config, cabm/train/train_config.h,
  // maps the other way), from either model config.
  const auto adopt = [&c](const auto& m) {
    std::tie(c.layers, c.heads, c.kv_heads, c.d_model, c.d_ff, c.seq_len, c.norm_first) = std::tuple(
        m.num_layers, m.nhead, m.num_kv_heads == m.nhead ? 0 : m.num_kv_heads, m.d_model, m.dim_feedforward,
        m.max_seq_len, m.norm_first);
    c.positional = m.positional;
  };
  std::vector<std::string> labels;
  if (task == TrainTask::kLanguageModel && kind == "CausalLM") {
    adopt(causal_lm_config_from(file));
  } else if (task == TrainTask::kLanguageId && kind == "Classifier") {
    adopt(classifier_config_from(file, labels));
  } else {
    throw Error(fmt::format("{}: holds a {} model, which --task {} cannot start from", path, kind, task_name(task)));
  }
}

TrainResult train(const TrainConfig& config, const TrainCallbacks& callbacks, bool resume) {
  validate(config);
  if (!config.data.empty() && config.task == TrainTask::kLanguageId)
    throw UsageError("--data applies to --task lm; langid uses the word lists in /usr/share/dict");
  std::unique_ptr<LoadedCheckpoint> checkpoint;
  bool replaced = false;
  if (resume) {
    if (!has_checkpoint(config.out_dir))
      throw Error(fmt::format("{}: no checkpoint to resume from (no '{}' file); train without --resume first",
                              config.out_dir, kLatestFile));
    checkpoint = std::make_unique<LoadedCheckpoint>(load_checkpoint(config.out_dir, true));
    const TrainConfig saved = saved_train_config(*checkpoint);
    if (saved.task != config.task)
      throw UsageError(fmt::format("--resume: the run in {} is --task {}", config.out_dir, task_name(saved.task)));
    check_model_file(*checkpoint, saved);
    check_resume_config(saved, config);
    check_resume_world_size(*checkpoint);
  } else if (world().rank == 0) {
    replaced = clear_previous_run(config.out_dir);
  }
  if (config.task == TrainTask::kLanguageModel) {
    TextSplit data = config.data.empty() ? load_fortunes() : load_text_file(config.data);
    return run<LmTrainer>(config, std::move(data), checkpoint.get(), replaced, callbacks);
  }
  WordListOptions options;
  options.max_bytes = config.seq_len;
  options.validation_per_language = config.eval_windows;
  return run<LangIdTrainer>(config, load_word_lists(default_word_lists(), options), checkpoint.get(), replaced,
                            callbacks);
}

}  // namespace cabm
