// `cabm train`: the README's main job (a character-level causal language model on the
// fortunes corpus) and, with --task langid, the encoder demo (language identification of
// single words). Periodic validation and checkpoints; --resume continues a run bit for bit.
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/progress.h"
#include "cabm/core/error.h"
#include "cabm/core/threads.h"
#include "cabm/io/tokenizer.h"
#include "cabm/train/generate.h"
#include "cabm/train/train_run.h"

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <cmath>

namespace cabm::cli {

namespace {

namespace fs = std::filesystem;

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int) {
  g_interrupted = 1;
}

struct Flags {
  std::string task = "lm", out, init, data, schedule, precision, positional;
  int64_t steps = 0, batch_size = 0, seq_len = 0, layers = 0, heads = 0, kv_heads = 0, d_model = 0, d_ff = 0, warmup = 0, accum = 0,
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
  set_if(f, "--kv-heads", f.kv_heads, c.kv_heads);
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
  if (f.options.at("--positional")->count() > 0) c.positional = parse_positional(f.positional);
  return c;
}

std::string lm_default_prompt(const TrainConfig& c) {
  return c.data.empty() ? "%\n" : "\n";
}

std::string data_line(const TrainConfig& c, const TrainStart& start) {
  if (start.text) {
    const TextSplit& data = *start.text;
    return fmt::format("data: {}: {} {} ({} bytes) for training, {} held out ({} bytes)", data.source,
                       format_count(static_cast<double>(data.train_documents)), c.data.empty() ? "fortunes" : "file",
                       format_count(static_cast<double>(data.train.size())),
                       format_count(static_cast<double>(data.validation_documents)),
                       format_count(static_cast<double>(data.validation.size())));
  }
  const WordDataset& data = *start.words;
  std::string line = "data: word lists:";
  for (size_t i = 0; i < data.languages.size(); ++i)
    line += fmt::format(" {} {}/{}", data.languages[i], format_count(static_cast<double>(data.train[i].size())),
                        data.validation[i].size());
  line += fmt::format(" (train/held out; dropped {} shared, {} with apostrophes, {} longer than {} bytes)",
                      format_count(static_cast<double>(data.dropped_shared)),
                      format_count(static_cast<double>(data.dropped_apostrophe)),
                      format_count(static_cast<double>(data.dropped_long)), c.seq_len);
  return line;
}

void print_header(const TrainConfig& c, const TrainStart& start) {
  if (start.replaced_earlier_run)
    std::printf("note: %s held an earlier run; its checkpoints are replaced (use --resume to continue one)\n",
                c.out_dir.c_str());
  const std::string kv =
      c.kv_heads != 0 && c.kv_heads != c.heads ? fmt::format(" ({} key/value)", c.kv_heads) : std::string();
  std::printf("cabm train --task %s: %lld layers, d_model %lld, %lld heads%s, d_ff %lld: %s parameters\n",
              task_name(c.task).c_str(), static_cast<long long>(c.layers), static_cast<long long>(c.d_model),
              static_cast<long long>(c.heads), kv.c_str(), static_cast<long long>(c.d_ff),
              format_count(static_cast<double>(start.parameters)).c_str());
  std::printf("%s\n", data_line(c, start).c_str());
  std::printf(
      "steps %lld, batch %lld x %lld%s, lr %g (%s, warmup %lld), clip %g, weight decay %g, dropout %g, "
      "seed %llu, %s, %d threads -> %s\n",
      static_cast<long long>(c.steps), static_cast<long long>(c.batch_size), static_cast<long long>(c.seq_len),
      c.accum > 1 ? fmt::format(" x {} micro-batches", c.accum).c_str() : "", c.schedule.lr,
      schedule_name(c.schedule.kind).c_str(), static_cast<long long>(c.schedule.warmup), static_cast<double>(c.clip),
      c.adamw.weight_decay, static_cast<double>(c.dropout), static_cast<unsigned long long>(c.seed),
      c.precision == Precision::kBf16 ? "bf16 mixed precision (fp32 master weights)" : "fp32", num_threads(),
      c.out_dir.c_str());
  if (start.world_size > 1)
    std::printf("data parallel: %d processes x batch %lld = %lld sequences per micro-batch, gradients averaged "
                "over MPI\n",
                start.world_size, static_cast<long long>(c.batch_size),
                static_cast<long long>(c.batch_size) * start.world_size);
  if (!start.resumed_from.empty())
    std::printf("resuming from %s at step %lld\n", start.resumed_from.c_str(), static_cast<long long>(start.step));
  std::fflush(stdout);
}

std::string eval_line(const EvalReport& r) {
  if (r.accuracy)
    return fmt::format("step {}: validation loss {:.4f}, accuracy {:.2f}%", r.step, r.loss, 100.0 * *r.accuracy);
  return fmt::format("step {}: validation loss {:.4f} ({:.3f} bits/byte)", r.step, r.loss, r.loss / std::log(2.0));
}

// The library's training run (cabm/train/train_run.h) with a progress bar, Ctrl-C and, at the
// end, the LM's sample or the classifier's confusion matrix.
void run_training(const TrainConfig& c, bool resume) {
  std::unique_ptr<Progress> progress;
  TrainCallbacks cb;
  cb.on_start = [&](const TrainStart& start) {
    print_header(c, start);
    progress = std::make_unique<Progress>(c.steps, start.step, Progress::stderr_is_terminal(), c.log_interval);
  };
  cb.on_step = [&](const StepStats& s) { progress->update({s.step, s.loss, s.lr, s.grad_norm, s.tokens, s.seconds}); };
  cb.on_eval = [&](const EvalReport& r) { progress->line(eval_line(r)); };
  cb.on_checkpoint = [&](int64_t step, const std::string& dir) {
    progress->line(fmt::format("step {}: checkpoint {}", step, dir));
  };
  cb.stop_requested = [] { return g_interrupted != 0; };
  cb.on_end = [&](const TrainResult& result, const TrainedModel& model) {
    progress->finish();
    if (result.stop == TrainStop::kStopRequested)
      throw Error(fmt::format("interrupted at step {} of {}; checkpoint saved, continue with: cabm train --resume "
                              "--out {}",
                              result.step, c.steps, c.out_dir));
    if (result.stop == TrainStop::kStopAt) {
      std::printf("stopped at step %lld of %lld (--stop-at); continue with: cabm train --resume --out %s\n",
                  static_cast<long long>(result.step), static_cast<long long>(c.steps), c.out_dir.c_str());
      return;
    }
    std::printf("trained %lld steps in %s (%s tokens/s in training steps)\n", static_cast<long long>(c.steps),
                format_duration(progress->elapsed_seconds()).c_str(),
                format_count(progress->tokens_per_second()).c_str());
    if (model.classifier) {
      if (result.last_eval) std::printf("%s", format_confusion(model.words->languages, result.last_eval->confusion).c_str());
      return;
    }
    if (c.sample_tokens > 0) {
      std::printf("--- sample (%lld bytes, temperature 0.8, seed %llu) ---\n", static_cast<long long>(c.sample_tokens),
                  static_cast<unsigned long long>(c.seed));
      std::fflush(stdout);
      Rng rng(c.seed);
      SamplingOptions options;
      stream_generate(*model.lm, encode_bytes(lm_default_prompt(c)), c.sample_tokens, options, rng);
      std::printf("\n---\n");
      std::printf("generate more with: cabm generate --checkpoint %s\n", c.out_dir.c_str());
    }
  };
  train(c, cb, resume);
}

}  // namespace

void register_train(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("train",
                                     "Train a model: a character-level causal LM (default) or a word "
                                     "language identifier (--task langid)");
  auto f = std::make_shared<Flags>();
  auto& o = f->options;
  // Ranges: cabm/train/train_config.h (int_settings, real_settings), so that a flag, a library
  // call and a resumed state.json are held to the same ones.
  const auto add_int = [&](const char* flag, int64_t& value, const std::string& help) {
    const IntSetting& s = int_setting(flag);
    o[flag] = cmd->add_option(flag, value, help)->check(integer_in(s.min, s.max));
  };
  const auto add_real = [&](const char* flag, auto& value, const std::string& help) {
    o[flag] = cmd->add_option(flag, value, help)->check(real_in(real_setting(flag).range));
  };
  o["--task"] =
      cmd->add_option("--task", f->task, "lm (default): causal LM on text; langid: classify words by language")
          ->check(accepted_by([](const std::string& s) { parse_task(s); }, "lm or langid"));
  o["--data"] = cmd->add_option(
      "--data", f->data, "UTF-8 text file to train on (default: the fortunes corpus in /usr/share/games/fortunes)");
  o["--out"] = cmd->add_option("--out", f->out, "run directory for checkpoints (default runs/lm or runs/langid)");
  o["--init"] = cmd->add_option("--init", f->init, "safetensors file of initial weights (PyTorch names)");
  o["--resume"] = cmd->add_flag("--resume", f->resume, "continue the run saved in --out");
  add_int("--steps", f->steps, "optimizer steps (default: lm 1800, langid 1500)");
  add_int("--batch-size", f->batch_size, "sequences (words) per micro-batch (default: lm 16, langid 64)");
  add_int("--seq-len", f->seq_len, "context length in bytes (langid: longest word; default: lm 64, langid 24)");
  add_int("--accum", f->accum, "micro-batches accumulated per optimizer step (default 1)");
  add_int("--layers", f->layers, "encoder layers (default: lm 4, langid 2)");
  add_int("--heads", f->heads, "attention heads (default 4)");
  add_int("--kv-heads", f->kv_heads,
          "key/value heads for grouped-query attention (must divide --heads; default: as many as --heads; 1 = "
          "multi-query); the KV cache of generation shrinks by heads/kv-heads");
  add_int("--d-model", f->d_model, "model width E (default: lm 128, langid 64)");
  add_int("--d-ff", f->d_ff, "feed-forward width F (default: lm 512, langid 256)");
  add_real("--dropout", f->dropout, "dropout probability (default: lm 0, langid 0.1)");
  o["--post-norm"] = cmd->add_flag("--post-norm,!--pre-norm", f->post_norm,
                                   "post-norm layers (the seed's; langid default) instead of pre-norm (lm default)");
  add_real("--lr", f->lr, "peak learning rate (default 2e-3); for --schedule warmup the scale is lr*sqrt(E*warmup)");
  o["--schedule"] =
      cmd->add_option("--schedule", f->schedule,
                      "cosine (default: linear warm-up, cosine decay to 0.1 lr), warmup (the seed's "
                      "E^-0.5 min(t^-0.5, t warmup^-1.5)), constant")
          ->check(accepted_by([](const std::string& s) { parse_schedule(s); }, "cosine, warmup or constant"));
  add_int("--warmup", f->warmup, "warm-up steps (default 100)");
  add_real("--min-lr-ratio", f->min_lr_ratio, "cosine: final lr as a fraction of --lr (default 0.1)");
  add_real("--weight-decay", f->weight_decay, "AdamW decoupled weight decay on matrices (default 0.01)");
  add_real("--clip", f->clip, "max global gradient norm, 0 disables (default 1.0)");
  o["--seed"] = cmd->add_option("--seed", f->seed,
                                "seed for initialisation, data order, dropout and the final sample (default 1337)")
                    ->check(any_unsigned());
  o["--threads"] = add_threads_option(cmd, f->threads);
  o["--positional"] = cmd->add_option("--positional", f->positional,
                                      "positions: learned (default), sinusoidal, or rotary (RoPE in every layer)")
                          ->check(accepted_by([](const std::string& s) { parse_positional(s); },
                                              "learned, sinusoidal or rotary"));
  o["--precision"] = cmd->add_option("--precision", f->precision,
                                     "fp32 (default) or bf16: bf16 matrix products and attention with fp32 "
                                     "accumulation, fp32 master weights, optimizer state and checkpoints")
                         ->check(accepted_by([](const std::string& s) { parse_precision(s); }, "fp32 or bf16"));
  add_int("--eval-interval", f->eval_interval,
          "steps between validations and checkpoints (default: lm 250, langid 500; 0: at the end)");
  add_int("--eval-windows", f->eval_windows,
          "lm: validation windows of --seq-len bytes (default 64); langid: held-out words per language (default 2000)");
  add_int("--checkpoint-interval", f->checkpoint_interval, "steps between checkpoints (default: --eval-interval)");
  add_int("--keep", f->keep, "checkpoints kept in --out (default 2)");
  add_int("--log-interval", f->log_interval,
          "steps between log lines when not on a terminal (default: lm 50, langid 100)");
  add_int("--stop-at", f->stop_at, "stop with a checkpoint after this step, as if interrupted (--resume continues)");
  add_int("--sample-tokens", f->sample_tokens, "lm: bytes of text sampled at the end (default 300; 0: none)");

  cmd->callback([f] {
    apply_threads(f->options.at("--threads"), f->threads);
    const TrainTask task = parse_task(f->task);
    TrainConfig defaults = default_train_config(task);
    // --init with a cabm model file: its architecture is the default for the flags not given.
    if (!f->resume && f->options.at("--init")->count() > 0) adopt_init_architecture(f->init, task, defaults);
    TrainConfig config = apply_flags(*f, defaults);
    if (f->resume) {
      if (!has_checkpoint(config.out_dir))
        throw Error(fmt::format("{}: no checkpoint to resume from (no '{}' file); train without --resume first",
                                config.out_dir, kLatestFile));
      const TrainConfig saved = saved_train_config(load_checkpoint(config.out_dir, true));
      if (saved.task != task && f->options.at("--task")->count() > 0)
        throw UsageError(fmt::format("--resume: the run in {} is --task {}", config.out_dir, task_name(saved.task)));
      TrainConfig resumed = apply_flags(*f, saved);
      resumed.out_dir = config.out_dir;  // where it was found, even if the directory moved
      config = resumed;
    }

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
    run_training(config, f->resume);
  });
}

}  // namespace cabm::cli
