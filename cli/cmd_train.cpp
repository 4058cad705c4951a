// `cabm train`: the README's main job (a character-level causal language model on the
// fortunes corpus) and, with --task langid, the encoder demo (language identification of
// single words). Periodic validation and checkpoints; --resume continues a run bit for bit.
#include "cli/commands.h"
#include "cli/progress.h"
#include "cabm/core/error.h"
#include "cabm/core/threads.h"
#include "cabm/io/text_data.h"
#include "cabm/io/tokenizer.h"
#include "cabm/io/word_lists.h"
#include "cabm/train/checkpoint.h"
#include "cabm/train/generate.h"
#include "cabm/train/langid_trainer.h"
#include "cabm/train/lm_trainer.h"
#include "cabm/train/model_config.h"

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <tuple>

namespace cabm::cli {

namespace {

namespace fs = std::filesystem;

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int) {
  g_interrupted = 1;
}

// Flags whose value may differ from the checkpoint's when resuming.
bool changeable_on_resume(const std::string& key) {
  return key == "steps" || key == "eval_interval" || key == "checkpoint_interval" || key == "log_interval" ||
         key == "keep_checkpoints" || key == "sample_tokens" || key == "out";
}

struct Flags {
  std::string task = "lm", out, init, data, schedule, precision;
  int64_t steps = 0, batch_size = 0, seq_len = 0, layers = 0, heads = 0, d_model = 0, d_ff = 0, warmup = 0, accum = 0,
          eval_interval = 0, eval_windows = 0, checkpoint_interval = 0, keep = 0, log_interval = 0, stop_at = 0,
          sample_tokens = 0;
  float dropout = 0, clip = 0;
  double lr = 0, weight_decay = 0, min_lr_ratio = 0;
  uint64_t seed = 0;
  int threads = 0;
  bool resume = false, post_norm = false;
  std::map<std::string, CLI::Option*> options;
};

template <typename T>
void set_if(const Flags& f, const char* name, const T& value, T& field) {
  if (f.options.at(name)->count() > 0) field = value;
}

TrainConfig apply_flags(const Flags& f, TrainConfig c) {
  set_if(f, "--out", f.out, c.out_dir);
  set_if(f, "--init", f.init, c.init);
  // Checkpoints record where the data came from; an absolute path keeps `cabm eval` working
  // from any directory.
  if (f.options.at("--data")->count() > 0 && !f.data.empty()) c.data = fs::absolute(f.data).lexically_normal().string();
  set_if(f, "--steps", f.steps, c.steps);
  set_if(f, "--batch-size", f.batch_size, c.batch_size);
  set_if(f, "--seq-len", f.seq_len, c.seq_len);
  set_if(f, "--layers", f.layers, c.layers);
  set_if(f, "--heads", f.heads, c.heads);
  set_if(f, "--d-model", f.d_model, c.d_model);
  set_if(f, "--d-ff", f.d_ff, c.d_ff);
  set_if(f, "--dropout", f.dropout, c.dropout);
  set_if(f, "--lr", f.lr, c.schedule.lr);
  set_if(f, "--warmup", f.warmup, c.schedule.warmup);
  set_if(f, "--min-lr-ratio", f.min_lr_ratio, c.schedule.min_lr_ratio);
  if (f.options.at("--schedule")->count() > 0) c.schedule.kind = parse_schedule(f.schedule);
  set_if(f, "--weight-decay", f.weight_decay, c.adamw.weight_decay);
  set_if(f, "--clip", f.clip, c.clip);
  set_if(f, "--seed", f.seed, c.seed);
  set_if(f, "--accum", f.accum, c.accum);
  set_if(f, "--eval-interval", f.eval_interval, c.eval_interval);
  set_if(f, "--eval-windows", f.eval_windows, c.eval_windows);
  set_if(f, "--checkpoint-interval", f.checkpoint_interval, c.checkpoint_interval);
  set_if(f, "--keep", f.keep, c.keep_checkpoints);
  set_if(f, "--log-interval", f.log_interval, c.log_interval);
  set_if(f, "--stop-at", f.stop_at, c.stop_at);
  set_if(f, "--sample-tokens", f.sample_tokens, c.sample_tokens);
  if (f.options.at("--post-norm")->count() > 0) c.norm_first = !f.post_norm;
  if (f.options.at("--precision")->count() > 0) c.precision = parse_precision(f.precision);
  return c;
}

// The flags that were given, as the keys of to_json(TrainConfig).
void check_resume_flags(const TrainConfig& saved, const TrainConfig& requested) {
  const nlohmann::json a = to_json(saved), b = to_json(requested);
  for (const auto& [key, value] : b.items()) {
    if (changeable_on_resume(key) || a.value(key, nlohmann::json()) == value) continue;
    throw Error(
        fmt::format("--resume continues the saved run, whose {} is {}; it cannot become {} (drop that flag "
                    "or start a new run with another --out)",
                    key, a.value(key, nlohmann::json()).dump(), value.dump()));
  }
}

// Removes the checkpoints of an earlier run in `dir` (a fresh run replaces them).
void clear_previous_run(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  bool removed = false;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == kLatestFile || (entry.is_directory() && name.rfind("step-", 0) == 0) ||
        name.rfind(".tmp-step-", 0) == 0) {
      fs::remove_all(entry.path(), ec);
      removed = true;
    }
  }
  if (removed)
    std::printf("note: %s held an earlier run; its checkpoints are replaced (use --resume to continue one)\n",
                dir.c_str());
}

void adopt_init_architecture(const std::string& path, TrainTask task, TrainConfig& c) {
  const SafetensorsFile file = read_safetensors(path);
  const std::string kind = model_kind(file);
  if (kind.empty()) return;  // a plain state_dict: the flags say what it is
  // The flags a model file fixes (the shape that byte_model_config, cabm/train/train_config.h, maps
  // the other way), from either model config.
  const auto adopt = [&c](const auto& m) {
    std::tie(c.layers, c.heads, c.d_model, c.d_ff, c.seq_len, c.norm_first) =
        std::tuple(m.num_layers, m.nhead, m.d_model, m.dim_feedforward, m.max_seq_len, m.norm_first);
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

TextSplit load_lm_data(const TrainConfig& c) {
  return c.data.empty() ? load_fortunes() : load_text_file(c.data);
}

std::string lm_default_prompt(const TrainConfig& c) {
  return c.data.empty() ? "%\n" : "\n";
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

void print_header(const TrainConfig& c, int64_t params, const std::string& data_line) {
  std::printf("cabm train --task %s: %lld layers, d_model %lld, %lld heads, d_ff %lld: %s parameters\n",
              task_name(c.task).c_str(), static_cast<long long>(c.layers), static_cast<long long>(c.d_model),
              static_cast<long long>(c.heads), static_cast<long long>(c.d_ff),
              format_count(static_cast<double>(params)).c_str());
  std::printf("%s\n", data_line.c_str());
  std::printf(
      "steps %lld, batch %lld x %lld%s, lr %g (%s, warmup %lld), clip %g, weight decay %g, dropout %g, "
      "seed %llu, %s, %d threads -> %s\n",
      static_cast<long long>(c.steps), static_cast<long long>(c.batch_size), static_cast<long long>(c.seq_len),
      c.accum > 1 ? fmt::format(" x {} micro-batches", c.accum).c_str() : "", c.schedule.lr,
      schedule_name(c.schedule.kind).c_str(), static_cast<long long>(c.schedule.warmup), static_cast<double>(c.clip),
      c.adamw.weight_decay, static_cast<double>(c.dropout), static_cast<unsigned long long>(c.seed),
      c.precision == Precision::kBf16 ? "bf16 mixed precision (fp32 master weights)" : "fp32", num_threads(),
      c.out_dir.c_str());
  std::fflush(stdout);
}

// The common loop: step, report, evaluate, checkpoint, stop on --stop-at or Ctrl-C.
template <typename Trainer, typename EvalFn>
bool run_loop(Trainer& trainer, const TrainConfig& c, EvalFn&& eval_and_report) {
  Progress progress(c.steps, trainer.step(), Progress::stderr_is_terminal(), c.log_interval);
  nlohmann::json metrics = nlohmann::json::object();
  while (trainer.step() < c.steps) {
    const StepStats s = trainer.train_step();
    progress.update({s.step, s.loss, s.lr, s.grad_norm, s.tokens, s.seconds});
    metrics["train_loss"] = s.loss;
    if (should_eval(c, s.step)) metrics.update(eval_and_report(progress, s.step));
    const bool stop = g_interrupted != 0 || (c.stop_at > 0 && s.step >= c.stop_at);
    if (should_save(c, s.step) || stop) {
      const std::string dir = trainer.save(metrics);
      progress.line(fmt::format("step {}: checkpoint {}", s.step, dir));
    }
    if (stop) {
      progress.finish();
      if (g_interrupted)
        throw Error(
            fmt::format("interrupted at step {} of {}; checkpoint saved, continue with: cabm train --resume "
                        "--out {}",
                        s.step, c.steps, c.out_dir));
      std::printf("stopped at step %lld of %lld (--stop-at); continue with: cabm train --resume --out %s\n",
                  static_cast<long long>(s.step), static_cast<long long>(c.steps), c.out_dir.c_str());
      return false;
    }
  }
  progress.finish();
  std::printf("trained %lld steps in %s (%s tokens/s in training steps)\n", static_cast<long long>(c.steps),
              format_duration(progress.elapsed_seconds()).c_str(), format_count(progress.tokens_per_second()).c_str());
  return true;
}

void train_lm(const TrainConfig& c, const LoadedCheckpoint* resume_from) {
  TextSplit data = load_lm_data(c);
  const std::string data_line =
      fmt::format("data: {}: {} {} ({} bytes) for training, {} held out ({} bytes)", data.source,
                  format_count(static_cast<double>(data.train_documents)), c.data.empty() ? "fortunes" : "file",
                  format_count(static_cast<double>(data.train.size())),
                  format_count(static_cast<double>(data.validation_documents)),
                  format_count(static_cast<double>(data.validation.size())));
  LmTrainer trainer(c, std::move(data));
  if (resume_from) trainer.restore(*resume_from);
  print_header(c, count_parameters(trainer.parameters()), data_line);
  if (resume_from)
    std::printf("resuming from %s at step %lld\n", resume_from->dir.c_str(), static_cast<long long>(trainer.step()));

  const bool finished = run_loop(trainer, c, [&](Progress& progress, int64_t step) {
    const double val = trainer.evaluate();
    progress.line(fmt::format("step {}: validation loss {:.4f} ({:.3f} bits/byte)", step, val, val / std::log(2.0)));
    return nlohmann::json{{"val_loss", val}, {"val_bits_per_byte", val / std::log(2.0)}};
  });
  if (!finished) return;
  if (c.sample_tokens > 0) {
    std::printf("--- sample (%lld bytes, temperature 0.8, seed %llu) ---\n", static_cast<long long>(c.sample_tokens),
                static_cast<unsigned long long>(c.seed));
    std::fflush(stdout);
    Rng rng(c.seed);
    SamplingOptions options;
    stream_generate(trainer.model(), encode_bytes(lm_default_prompt(c)), c.sample_tokens, options, rng);
    std::printf("\n---\n");
    std::printf("generate more with: cabm generate --checkpoint %s\n", c.out_dir.c_str());
  }
}

void train_langid(const TrainConfig& c, const LoadedCheckpoint* resume_from) {
  WordListOptions options;
  options.max_bytes = c.seq_len;
  options.validation_per_language = c.eval_windows;
  WordDataset data = load_word_lists(default_word_lists(), options);
  std::string data_line = "data: word lists:";
  for (size_t i = 0; i < data.languages.size(); ++i)
    data_line += fmt::format(" {} {}/{}", data.languages[i], format_count(static_cast<double>(data.train[i].size())),
                             data.validation[i].size());
  data_line += fmt::format(" (train/held out; dropped {} shared, {} with apostrophes, {} longer than {} bytes)",
                           format_count(static_cast<double>(data.dropped_shared)),
                           format_count(static_cast<double>(data.dropped_apostrophe)),
                           format_count(static_cast<double>(data.dropped_long)), c.seq_len);
  LangIdTrainer trainer(c, std::move(data));
  if (resume_from) trainer.restore(*resume_from);
  int64_t params = 0;
  for (const auto& p : named_parameters(trainer.model())) params += p.tensor.numel();
  print_header(c, params, data_line);
  if (resume_from)
    std::printf("resuming from %s at step %lld\n", resume_from->dir.c_str(), static_cast<long long>(trainer.step()));

  ClassifierEval last;
  const bool finished = run_loop(trainer, c, [&](Progress& progress, int64_t step) {
    last = trainer.evaluate();
    progress.line(
        fmt::format("step {}: validation loss {:.4f}, accuracy {:.2f}%", step, last.loss, 100.0 * last.accuracy));
    return nlohmann::json{{"val_loss", last.loss}, {"val_accuracy", last.accuracy}};
  });
  if (!finished) return;
  std::printf("%s", format_confusion(trainer.data().languages, last.confusion).c_str());
}

}  // namespace

void register_train(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("train",
                                     "Train a model: a character-level causal LM (default) or a word "
                                     "language identifier (--task langid)");
  auto f = std::make_shared<Flags>();
  auto& o = f->options;
  o["--task"] =
      cmd->add_option("--task", f->task, "lm (default): causal LM on text; langid: classify words by language");
  o["--data"] = cmd->add_option(
      "--data", f->data, "UTF-8 text file to train on (default: the fortunes corpus in /usr/share/games/fortunes)");
  o["--out"] = cmd->add_option("--out", f->out, "run directory for checkpoints (default runs/lm or runs/langid)");
  o["--init"] = cmd->add_option("--init", f->init, "safetensors file of initial weights (PyTorch names)");
  o["--resume"] = cmd->add_flag("--resume", f->resume, "continue the run saved in --out");
  o["--steps"] = cmd->add_option("--steps", f->steps, "optimizer steps (default: lm 1800, langid 1500)");
  o["--batch-size"] =
      cmd->add_option("--batch-size", f->batch_size, "sequences (words) per micro-batch (default: lm 16, langid 64)");
  o["--seq-len"] = cmd->add_option("--seq-len", f->seq_len,
                                   "context length in bytes (langid: longest word; default: lm 64, langid 24)");
  o["--accum"] = cmd->add_option("--accum", f->accum, "micro-batches accumulated per optimizer step (default 1)");
  o["--layers"] = cmd->add_option("--layers", f->layers, "encoder layers (default: lm 4, langid 2)");
  o["--heads"] = cmd->add_option("--heads", f->heads, "attention heads (default 4)");
  o["--d-model"] = cmd->add_option("--d-model", f->d_model, "model width E (default: lm 128, langid 64)");
  o["--d-ff"] = cmd->add_option("--d-ff", f->d_ff, "feed-forward width F (default: lm 512, langid 256)");
  o["--dropout"] = cmd->add_option("--dropout", f->dropout, "dropout probability (default: lm 0, langid 0.1)");
  o["--post-norm"] = cmd->add_flag("--post-norm,!--pre-norm", f->post_norm,
                                   "post-norm layers (the seed's; langid default) instead of pre-norm (lm default)");
  o["--lr"] = cmd->add_option(
      "--lr", f->lr, "peak learning rate (default 2e-3); for --schedule warmup the scale is lr*sqrt(E*warmup)");
  o["--schedule"] = cmd->add_option("--schedule", f->schedule,
                                    "cosine (default: linear warm-up, cosine decay to 0.1 lr), warmup (the seed's "
                                    "E^-0.5 min(t^-0.5, t warmup^-1.5)), constant");
  o["--warmup"] = cmd->add_option("--warmup", f->warmup, "warm-up steps (default 100)");
  o["--min-lr-ratio"] =
      cmd->add_option("--min-lr-ratio", f->min_lr_ratio, "cosine: final lr as a fraction of --lr (default 0.1)");
  o["--weight-decay"] =
      cmd->add_option("--weight-decay", f->weight_decay, "AdamW decoupled weight decay on matrices (default 0.01)");
  o["--clip"] = cmd->add_option("--clip", f->clip, "max global gradient norm, 0 disables (default 1.0)");
  o["--seed"] = cmd->add_option("--seed", f->seed,
                                "seed for initialisation, data order, dropout and the final sample (default 1337)");
  o["--threads"] = cmd->add_option("--threads", f->threads, "threads (default: CABM_NUM_THREADS or all cores)");
  o["--precision"] = cmd->add_option("--precision", f->precision,
                                     "fp32 (default) or bf16: bf16 matrix products and attention with fp32 "
                                     "accumulation, fp32 master weights, optimizer state and checkpoints");
  o["--eval-interval"] =
      cmd->add_option("--eval-interval", f->eval_interval,
                      "steps between validations and checkpoints (default: lm 250, langid 500; 0: at the end)");
  o["--eval-windows"] = cmd->add_option(
      "--eval-windows", f->eval_windows,
      "lm: validation windows of --seq-len bytes (default 64); langid: held-out words per language (default 2000)");
  o["--checkpoint-interval"] = cmd->add_option("--checkpoint-interval", f->checkpoint_interval,
                                               "steps between checkpoints (default: --eval-interval)");
  o["--keep"] = cmd->add_option("--keep", f->keep, "checkpoints kept in --out (default 2)");
  o["--log-interval"] = cmd->add_option("--log-interval", f->log_interval,
                                        "steps between log lines when not on a terminal (default: lm 50, langid 100)");
  o["--stop-at"] = cmd->add_option("--stop-at", f->stop_at,
                                   "stop with a checkpoint after this step, as if interrupted (--resume continues)");
  o["--sample-tokens"] = cmd->add_option("--sample-tokens", f->sample_tokens,
                                         "lm: bytes of text sampled at the end (default 300; 0: none)");

  cmd->callback([f] {
    if (f->options.at("--threads")->count() > 0) {
      if (f->threads < 1) throw Error(fmt::format("--threads must be at least 1, got {}", f->threads));
      set_num_threads(f->threads);
    }
    const TrainTask task = parse_task(f->task);
    TrainConfig defaults = default_train_config(task);
    // --init with a cabm model file: its architecture is the default for the flags not given.
    if (!f->resume && f->options.at("--init")->count() > 0) adopt_init_architecture(f->init, task, defaults);
    TrainConfig config = apply_flags(*f, defaults);
    std::unique_ptr<LoadedCheckpoint> checkpoint;
    if (f->resume) {
      if (!has_checkpoint(config.out_dir))
        throw Error(fmt::format("{}: no checkpoint to resume from (no '{}' file); train without --resume first",
                                config.out_dir, kLatestFile));
      checkpoint = std::make_unique<LoadedCheckpoint>(load_checkpoint(config.out_dir, true));
      TrainConfig saved;
      try {
        saved = train_config_from_json(checkpoint->state.at("config"));
      } catch (const nlohmann::json::exception&) {
        throw Error(fmt::format("{}/{}: no training configuration", checkpoint->dir, kStateFile));
      } catch (const Error& e) {
        throw Error(fmt::format("{}/{}: {}", checkpoint->dir, kStateFile, e.what()));
      }
      if (saved.task != task && f->options.at("--task")->count() > 0)
        throw Error(fmt::format("--resume: the run in {} is --task {}", config.out_dir, task_name(saved.task)));
      TrainConfig resumed = apply_flags(*f, saved);
      resumed.out_dir = config.out_dir;  // where it was found, even if the directory moved
      check_resume_flags(saved, resumed);
      config = resumed;
    }
    validate(config);
    if (!config.data.empty() && config.task == TrainTask::kLanguageId)
      throw Error("--data applies to --task lm; langid uses the word lists in /usr/share/dict");
    if (!f->resume) clear_previous_run(config.out_dir);

    // Ctrl-C (or SIGTERM) finishes the current step, saves a checkpoint and exits non-zero.
    g_interrupted = 0;
    std::signal(SIGINT, on_interrupt);
    std::signal(SIGTERM, on_interrupt);
    struct RestoreSignals {
      ~RestoreSignals() {
        std::signal(SIGINT, SIG_DFL);
        std::signal(SIGTERM, SIG_DFL);
      }
    } restore_signals;
    if (config.task == TrainTask::kLanguageModel)
      train_lm(config, checkpoint.get());
    else
      train_langid(config, checkpoint.get());
  });
}

}  // namespace cabm::cli
