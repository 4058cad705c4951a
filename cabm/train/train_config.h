// The hyper-parameters of a training run (the `cabm train` flags), shared by both tasks, and
// their JSON form in a checkpoint's state.json (so --resume continues with the same ones).
#pragma once

#include "cabm/core/checked.h"
#include "cabm/io/tokenizer.h"
#include "cabm/nn/mixed_precision.h"
#include "cabm/train/adamw.h"
#include "cabm/train/schedule.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace cabm {

enum class TrainTask { kLanguageModel, kLanguageId };

struct TrainConfig {
  TrainTask task = TrainTask::kLanguageModel;
  std::string data;  // LM: a UTF-8 file; "" = the fortunes corpus
  std::string init;  // safetensors to start from ("" = random init from seed)
  std::string out_dir = "runs/lm";

  // Model.
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t kv_heads = 0;  // key/value heads (grouped-query attention); 0 = heads
  int64_t d_model = 128;
  int64_t d_ff = 512;
  float dropout = 0.0f;
  bool norm_first = true;  // LM default; the classifier uses post-norm (the seed's layer)

  // Optimisation.
  int64_t steps = 1800;
  int64_t batch_size = 16;  // sequences (LM) or words (langid) per micro-batch
  int64_t seq_len = 64;     // LM context T; langid: longest word in bytes
  int64_t accum = 1;        // micro-batches per optimizer step
  ScheduleConfig schedule;  // lr, warmup, kind; total_steps = steps
  AdamWConfig adamw;
  float clip = 1.0f;  // max global gradient norm; <= 0 disables
  uint64_t seed = 1337;
  // fp32, or bf16 mixed precision (cabm/nn/mixed_precision.h): bf16 products with fp32 master
  // weights, AdamW state and checkpoints. Recorded in state.json; --resume keeps it.
  Precision precision = Precision::kFp32;
  // Positions: learned embeddings (the default), sinusoidal, or rotary (RoPE in every layer:
  // neox layout, θ 10000, the whole head dim; no position table, so no context limit of its own).
  PositionalKind positional = PositionalKind::kLearned;

  // Bookkeeping.
  int64_t eval_interval = 250;      // steps between validations (0: only at the end)
  int64_t eval_windows = 64;        // LM validation windows of seq_len (langid: words per language)
  int64_t checkpoint_interval = 0;  // 0: same as eval_interval
  int64_t keep_checkpoints = 2;
  int64_t log_interval = 50;    // log lines when stdout is not a terminal
  int64_t stop_at = 0;          // > 0: stop after this step (as if interrupted)
  int64_t sample_tokens = 300;  // LM: bytes sampled at the end
};

// The `cabm train` defaults of a task (the member initialisers above are only a base):
//   lm:     4 layers, E 128, 4 heads, F 512, pre-norm, dropout 0, 1800 steps of 16 × 64 bytes,
//           lr 2e-3 cosine with 100 warm-up steps — about 3 minutes on 2 cores
//   langid: 2 layers, E 64, 4 heads, F 256, post-norm, dropout 0.1, 1500 steps of 64 words
//           of up to 24 bytes, lr 2e-3 cosine with 100 warm-up steps
TrainConfig default_train_config(TrainTask task);

std::string task_name(TrainTask task);  // "lm" | "langid"
TrainTask parse_task(const std::string& name);

// The ranges of the integer settings, shared by the `cabm train` flags, validate() and
// state.json's "config" (docs/reliability.md lists them). The upper bounds are far above any
// model this CPU library trains (the default LM: L 4, E 128, F 512, T 64, B 16) and low enough
// that the products the code forms (B·T·E, L·E·F, steps · accum, ...) cannot overflow int64.
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr int64_t kMaxHeads = 1024;
inline constexpr int64_t kMaxWidth = 65536;        // d_model, d_ff
inline constexpr int64_t kMaxSeqLen = 65536;       // context T (bytes)
inline constexpr int64_t kMaxBatch = 65536;        // sequences (words) per micro-batch
inline constexpr int64_t kMaxBatchTokens = 1 << 24;  // batch_size · seq_len
inline constexpr int64_t kMaxAccum = 4096;         // micro-batches per step
inline constexpr int64_t kMaxSteps = int64_t{1} << 40;  // steps, warm-up, intervals, stop-at
inline constexpr int64_t kMaxCount = 1 << 24;      // eval windows, checkpoints kept, sample bytes

struct IntSetting {
  const char* flag;  // "--layers"
  const char* key;   // "layers" in to_json
  int64_t min, max;
  int64_t& (*field)(TrainConfig&);
};
// Every integer setting of TrainConfig but the seed (any uint64): flag, JSON key and range.
const std::vector<IntSetting>& int_settings();
const IntSetting& int_setting(const std::string& flag);  // by flag name

// The ranges of the real-valued settings (finite; NaN is never in range).
struct RealSetting {
  const char* flag;
  const char* key;
  RealRange range;
  double (*get)(const TrainConfig&);
};
const std::vector<RealSetting>& real_settings();
const RealSetting& real_setting(const std::string& flag);

nlohmann::json to_json(const TrainConfig& config);
// Throws cabm::Error naming `where` and the key ("'config.steps'") when something is missing,
// has the wrong type or is out of its range above.
TrainConfig train_config_from_json(const nlohmann::json& j, const std::string& where = "training configuration",
                                   const std::string& prefix = "");

// Checks the ranges above and the relations between settings (E divisible by H, B·T) with
// one-line cabm::UsageError messages naming the flag.
void validate(const TrainConfig& config);

// The model the flags describe, over byte tokens (V = 256, T_max = seq_len). ModelConfig is
// CausalLMConfig or ClassifierConfig; what the flags do not set (activation, head, positions,
// classes) keeps the model config's default, for the task's trainer to choose.
template <typename ModelConfig>
ModelConfig byte_model_config(const TrainConfig& c) {
  ModelConfig m;
  m.vocab_size = kByteVocabSize;
  m.max_seq_len = c.seq_len;
  m.d_model = c.d_model;
  m.nhead = c.heads;
  m.num_kv_heads = c.kv_heads == 0 ? c.heads : c.kv_heads;
  m.num_layers = c.layers;
  m.dim_feedforward = c.d_ff;
  m.dropout = c.dropout;
  m.norm_first = c.norm_first;
  m.positional = c.positional;
  if (c.positional == PositionalKind::kRotary) m.rope = {RopeStyle::kNeox, 10000.0f, 0};
  return m;
}

}  // namespace cabm
