#include "cabm/train/train_config.h"

#include "cabm/core/error.h"
#include "cabm/train/json_reader.h"

#include <limits>

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
          {"kv_heads", c.kv_heads},
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
          {"positional", positional_name(c.positional)},
          {"eval_interval", c.eval_interval},
          {"eval_windows", c.eval_windows},
          {"checkpoint_interval", c.checkpoint_interval},
          {"keep_checkpoints", c.keep_checkpoints},
          {"log_interval", c.log_interval},
          {"sample_tokens", c.sample_tokens}};
}

namespace {

constexpr double kHuge = std::numeric_limits<double>::max();
constexpr double kFloatHuge = 1e30;  // float settings: narrowing stays finite

}  // namespace

const std::vector<IntSetting>& int_settings() {
  static const std::vector<IntSetting> settings = {
      {"--layers", "layers", 1, kMaxLayers, [](TrainConfig& c) -> int64_t& { return c.layers; }},
      {"--heads", "heads", 1, kMaxHeads, [](TrainConfig& c) -> int64_t& { return c.heads; }},
      {"--kv-heads", "kv_heads", 0, kMaxHeads, [](TrainConfig& c) -> int64_t& { return c.kv_heads; }},
      {"--d-model", "d_model", 1, kMaxWidth, [](TrainConfig& c) -> int64_t& { return c.d_model; }},
      {"--d-ff", "d_ff", 1, kMaxWidth, [](TrainConfig& c) -> int64_t& { return c.d_ff; }},
      {"--steps", "steps", 1, kMaxSteps, [](TrainConfig& c) -> int64_t& { return c.steps; }},
      {"--batch-size", "batch_size", 1, kMaxBatch, [](TrainConfig& c) -> int64_t& { return c.batch_size; }},
      {"--seq-len", "seq_len", 1, kMaxSeqLen, [](TrainConfig& c) -> int64_t& { return c.seq_len; }},
      {"--accum", "accum", 1, kMaxAccum, [](TrainConfig& c) -> int64_t& { return c.accum; }},
      {"--warmup", "warmup", 0, kMaxSteps, [](TrainConfig& c) -> int64_t& { return c.schedule.warmup; }},
      {"--eval-interval", "eval_interval", 0, kMaxSteps, [](TrainConfig& c) -> int64_t& { return c.eval_interval; }},
      {"--eval-windows", "eval_windows", 1, kMaxCount, [](TrainConfig& c) -> int64_t& { return c.eval_windows; }},
      {"--checkpoint-interval", "checkpoint_interval", 0, kMaxSteps,
       [](TrainConfig& c) -> int64_t& { return c.checkpoint_interval; }},
      {"--keep", "keep_checkpoints", 1, kMaxCount, [](TrainConfig& c) -> int64_t& { return c.keep_checkpoints; }},
      {"--log-interval", "log_interval", 0, kMaxSteps, [](TrainConfig& c) -> int64_t& { return c.log_interval; }},
      {"--stop-at", "stop_at", 0, kMaxSteps, [](TrainConfig& c) -> int64_t& { return c.stop_at; }},
      {"--sample-tokens", "sample_tokens", 0, kMaxCount, [](TrainConfig& c) -> int64_t& { return c.sample_tokens; }},
  };
  return settings;
}

const std::vector<RealSetting>& real_settings() {
  static const std::vector<RealSetting> settings = {
      {"--dropout", "dropout", {0, 1, false, true}, [](const TrainConfig& c) -> double { return c.dropout; }},
      {"--lr", "lr", {0, kHuge, true, false}, [](const TrainConfig& c) { return c.schedule.lr; }},
      {"--min-lr-ratio", "min_lr_ratio", {0, 1}, [](const TrainConfig& c) { return c.schedule.min_lr_ratio; }},
      {"--weight-decay", "weight_decay", {0, kHuge}, [](const TrainConfig& c) { return c.adamw.weight_decay; }},
      {"--clip", "clip", {0, kFloatHuge}, [](const TrainConfig& c) -> double { return c.clip; }},
      {"", "beta1", {0, 1, false, true}, [](const TrainConfig& c) { return c.adamw.beta1; }},
      {"", "beta2", {0, 1, false, true}, [](const TrainConfig& c) { return c.adamw.beta2; }},
      {"", "eps", {0, kHuge, true, false}, [](const TrainConfig& c) { return c.adamw.eps; }},
  };
  return settings;
}

const IntSetting& int_setting(const std::string& flag) {
  for (const IntSetting& s : int_settings())
    if (flag == s.flag) return s;
  throw Error(fmt::format("no integer setting {}", flag));
}

const RealSetting& real_setting(const std::string& flag) {
  for (const RealSetting& s : real_settings())
    if (flag == s.flag || flag == s.key) return s;
  throw Error(fmt::format("no real setting {}", flag));
}

TrainConfig train_config_from_json(const nlohmann::json& j, const std::string& where, const std::string& prefix) {
  const JsonReader r(j, where, prefix);
  TrainConfig c;
  const auto enum_value = [&](const char* key, auto parse) {
    try {
      return parse(r.string(key));
    } catch (const Error& e) {
      if (std::string(e.what()).rfind(where, 0) == 0) throw;  // the reader's own message
      throw Error(fmt::format("{}: {}", r.name(key), e.what()));
    }
  };
  c.task = enum_value("task", parse_task);
  c.data = r.string("data");
  c.init = r.string("init");
  c.out_dir = r.string("out");
  for (const IntSetting& s : int_settings()) {
    const std::string key = s.key;
    if (key == "stop_at") continue;                   // not saved
    if (key == "kv_heads" && !r.has(key)) continue;  // runs from before grouped-query attention
    s.field(c) = r.integer(s.key, s.min, s.max);
  }
  const auto real = [&](const char* key) { return r.real(key, real_setting(key).range); };
  c.dropout = static_cast<float>(real("dropout"));
  c.norm_first = r.boolean("norm_first");
  c.schedule.kind = enum_value("schedule", parse_schedule);
  c.schedule.lr = real("lr");
  c.schedule.min_lr_ratio = real("min_lr_ratio");
  c.adamw.beta1 = real("beta1");
  c.adamw.beta2 = real("beta2");
  c.adamw.eps = real("eps");
  c.adamw.weight_decay = real("weight_decay");
  c.clip = static_cast<float>(real("clip"));
  c.seed = r.unsigned_integer("seed");
  // Absent in checkpoints written before mixed precision existed: those ran in fp32.
  c.precision = r.has("precision") ? enum_value("precision", parse_precision) : Precision::kFp32;
  // Absent in checkpoints written before the choice existed: those had learned positions.
  c.positional = r.has("positional") ? enum_value("positional", parse_positional) : PositionalKind::kLearned;
  return c;
}

void validate(const TrainConfig& config) {
  TrainConfig c = config;  // int_settings() hands out references
  const auto usage = [](const auto& check) {
    try {
      check();
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
  };
  for (const IntSetting& s : int_settings()) usage([&] { checked_integer(s.field(c), s.min, s.max, s.flag); });
  for (const RealSetting& s : real_settings())
    usage([&] { checked_real(s.get(c), s.range, *s.flag ? s.flag : s.key); });
  if (c.d_model % c.heads != 0)
    throw UsageError(fmt::format("--d-model ({}) must be divisible by --heads ({})", c.d_model, c.heads));
  if (c.kv_heads != 0 && c.heads % c.kv_heads != 0)
    throw UsageError(fmt::format("--heads ({}) must be a multiple of --kv-heads ({})", c.heads, c.kv_heads));
  if (c.batch_size * c.seq_len > kMaxBatchTokens)
    throw UsageError(fmt::format("--batch-size {} x --seq-len {} = {} tokens per micro-batch, more than the {} allowed",
                                 c.batch_size, c.seq_len, c.batch_size * c.seq_len, kMaxBatchTokens));
  if (c.schedule.kind == ScheduleKind::kWarmup && c.schedule.warmup == 0)
    throw UsageError("--schedule warmup needs --warmup > 0");
}

}  // namespace cabm
