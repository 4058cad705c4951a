#include "cabm/train/train_config.h"

#include "cabm/core/error.h"

namespace cabm {

std::string task_name(TrainTask task) {
  return task == TrainTask::kLanguageModel ? "lm" : "langid";
}

TrainTask parse_task(const std::string& name) {
  if (name == "lm") return TrainTask::kLanguageModel;
  if (name == "langid") return TrainTask::kLanguageId;
  throw Error(fmt::format("unknown task '{}' (expected lm or langid)", name));
}

TrainConfig default_train_config(TrainTask task) {
  TrainConfig c;
  c.task = task;
  if (task == TrainTask::kLanguageModel) {
    c.out_dir = "runs/lm";
    c.layers = 4;
    c.heads = 4;
    c.d_model = 128;
    c.d_ff = 512;
    c.dropout = 0.0f;
    c.norm_first = true;
    c.steps = 1800;
    c.batch_size = 16;
    c.seq_len = 64;
    c.schedule.kind = ScheduleKind::kCosine;
    c.schedule.lr = 2e-3;
    c.schedule.warmup = 100;
    c.eval_interval = 250;
    c.eval_windows = 64;
    c.log_interval = 50;
  } else {
    c.out_dir = "runs/langid";
    c.layers = 2;
    c.heads = 4;
    c.d_model = 64;
    c.d_ff = 256;
    c.dropout = 0.1f;
    c.norm_first = false;  // the seed's post-norm encoder layer
    c.steps = 1500;
    c.batch_size = 64;
    c.seq_len = 24;  // longest word, in bytes
    c.schedule.kind = ScheduleKind::kCosine;
    c.schedule.lr = 2e-3;
    c.schedule.warmup = 100;
    c.eval_interval = 500;
    c.eval_windows = 2000;  // held-out words per language
    c.log_interval = 100;
  }
  return c;
}

nlohmann::json to_json(const TrainConfig& c) {
  return {{"task", task_name(c.task)},
          {"data", c.data},
          {"init", c.init},
          {"out", c.out_dir},
          {"layers", c.layers},
          {"heads", c.heads},
          {"d_model", c.d_model},
          {"d_ff", c.d_ff},
          {"dropout", c.dropout},
          {"norm_first", c.norm_first},
          {"steps", c.steps},
          {"batch_size", c.batch_size},
          {"seq_len", c.seq_len},
          {"accum", c.accum},
          {"schedule", schedule_name(c.schedule.kind)},
          {"lr", c.schedule.lr},
          {"warmup", c.schedule.warmup},
          {"min_lr_ratio", c.schedule.min_lr_ratio},
          {"beta1", c.adamw.beta1},
          {"beta2", c.adamw.beta2},
          {"eps", c.adamw.eps},
          {"weight_decay", c.adamw.weight_decay},
          {"clip", c.clip},
          {"seed", c.seed},
          {"precision", precision_name(c.precision)},
          {"eval_interval", c.eval_interval},
          {"eval_windows", c.eval_windows},
          {"checkpoint_interval", c.checkpoint_interval},
          {"keep_checkpoints", c.keep_checkpoints},
          {"log_interval", c.log_interval},
          {"sample_tokens", c.sample_tokens}};
}

TrainConfig train_config_from_json(const nlohmann::json& j) {
  TrainConfig c;
  const auto get = [&](const char* key, auto& value) {
    if (!j.contains(key)) throw Error(fmt::format("training configuration lacks '{}'", key));
    try {
      j.at(key).get_to(value);
    } catch (const nlohmann::json::exception&) {
      throw Error(fmt::format("training configuration: '{}' has the wrong type", key));
    }
  };
  std::string task, schedule;
  get("task", task);
  c.task = parse_task(task);
  get("data", c.data);
  get("init", c.init);
  get("out", c.out_dir);
  get("layers", c.layers);
  get("heads", c.heads);
  get("d_model", c.d_model);
  get("d_ff", c.d_ff);
  get("dropout", c.dropout);
  get("norm_first", c.norm_first);
  get("steps", c.steps);
  get("batch_size", c.batch_size);
  get("seq_len", c.seq_len);
  get("accum", c.accum);
  get("schedule", schedule);
  c.schedule.kind = parse_schedule(schedule);
  get("lr", c.schedule.lr);
  get("warmup", c.schedule.warmup);
  get("min_lr_ratio", c.schedule.min_lr_ratio);
  get("beta1", c.adamw.beta1);
  get("beta2", c.adamw.beta2);
  get("eps", c.adamw.eps);
  get("weight_decay", c.adamw.weight_decay);
  get("clip", c.clip);
  get("seed", c.seed);
  // Absent in checkpoints written before mixed precision existed: those ran in fp32.
  std::string precision = "fp32";
  if (j.contains("precision")) get("precision", precision);
  c.precision = parse_precision(precision);
  get("eval_interval", c.eval_interval);
  get("eval_windows", c.eval_windows);
  get("checkpoint_interval", c.checkpoint_interval);
  get("keep_checkpoints", c.keep_checkpoints);
  get("log_interval", c.log_interval);
  get("sample_tokens", c.sample_tokens);
  return c;
}

void validate(const TrainConfig& c) {
  const auto positive = [](int64_t v, const char* flag) {
    if (v <= 0) throw Error(fmt::format("{} must be positive, got {}", flag, v));
  };
  positive(c.layers, "--layers");
  positive(c.heads, "--heads");
  positive(c.d_model, "--d-model");
  positive(c.d_ff, "--d-ff");
  positive(c.steps, "--steps");
  positive(c.batch_size, "--batch-size");
  positive(c.seq_len, "--seq-len");
  positive(c.accum, "--accum");
  positive(c.keep_checkpoints, "--keep");
  if (c.d_model % c.heads != 0)
    throw Error(fmt::format("--d-model ({}) must be divisible by --heads ({})", c.d_model, c.heads));
  if (!(c.dropout >= 0.0f && c.dropout < 1.0f))
    throw Error(fmt::format("--dropout must lie in [0, 1), got {}", c.dropout));
  if (!(c.schedule.lr > 0.0)) throw Error(fmt::format("--lr must be positive, got {}", c.schedule.lr));
  if (c.schedule.warmup < 0) throw Error(fmt::format("--warmup must be >= 0, got {}", c.schedule.warmup));
  if (c.schedule.kind == ScheduleKind::kWarmup && c.schedule.warmup == 0)
    throw Error("--schedule warmup needs --warmup > 0");
  if (c.eval_interval < 0) throw Error(fmt::format("--eval-interval must be >= 0, got {}", c.eval_interval));
  if (c.checkpoint_interval < 0)
    throw Error(fmt::format("--checkpoint-interval must be >= 0, got {}", c.checkpoint_interval));
  if (c.eval_windows <= 0) throw Error(fmt::format("--eval-windows must be positive, got {}", c.eval_windows));
  if (c.stop_at < 0) throw Error(fmt::format("--stop-at must be >= 0, got {}", c.stop_at));
  if (c.adamw.weight_decay < 0) throw Error(fmt::format("--weight-decay must be >= 0, got {}", c.adamw.weight_decay));
}

}  // namespace cabm
