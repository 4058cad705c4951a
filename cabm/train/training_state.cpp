#include "cabm/train/training_state.h"

#include "cabm/core/error.h"
#include "cabm/core/memory.h"
#include "cabm/train/grad_clip.h"
#include "cabm/train/json_reader.h"
#include "cabm/train/schedule.h"

#include <cmath>

namespace cabm {

uint64_t data_seed(uint64_t seed) {
  return splitmix64(seed ^ 0xDA7A5EEDull);
}

void complete_schedule(TrainConfig& config) {
  config.schedule.total_steps = config.steps;
  config.schedule.d_model = config.d_model;
  if (config.schedule.kind == ScheduleKind::kWarmup)
    config.schedule.scale = warmup_scale_for_peak(config.schedule.lr, config.d_model, config.schedule.warmup);
}

namespace {
std::string architecture(const TrainConfig& c) {
  return fmt::format("--layers {} --d-model {} --d-ff {} --batch-size {} --seq-len {} --accum {}", c.layers, c.d_model,
                     c.d_ff, c.batch_size, c.seq_len, c.accum);
}
}  // namespace

void check_training_memory(const TrainConfig& c, double parameters, int64_t outputs) {
  constexpr double kF32 = 4;
  const double copies = 4 + (c.precision == Precision::kBf16 ? 0.5 : 0.0);  // weights, grads, m, v (+ bf16)
  const double tokens = static_cast<double>(c.batch_size) * static_cast<double>(c.seq_len);
  const double E = static_cast<double>(c.d_model), F = static_cast<double>(c.d_ff);
  // Per token and layer the caches keep at least q, k, v, the attention output, four residual-
  // stream rows and the feed-forward pre-activation and hidden rows: 8E + 2F floats.
  const double activations = tokens * kF32 * (static_cast<double>(c.layers) * (8 * E + 2 * F) + 2 * outputs);
  const double batches = static_cast<double>(c.accum) * tokens * 2 * 8;  // I64 inputs and targets per micro-batch
  check_fits_in_memory(parameters * kF32 * copies + activations + batches,
                       fmt::format("training {:.0f} parameters ({})", parameters, architecture(c)));
}

void rethrow_training_out_of_memory(const TrainConfig& c, const OutOfMemory& e) {
  throw OutOfMemory(fmt::format("no memory for the model of {}: {}", architecture(c), e.what()));
}

ForwardMode micro_batch_mode(const TrainConfig& config, int64_t step, int64_t micro_batches, int64_t micro) {
  ForwardMode mode;
  mode.training = true;
  const int rank = world().rank;
  mode.seed = rank == 0 ? config.seed : splitmix64(config.seed ^ (0x5EED0000ull + static_cast<uint64_t>(rank)));
  mode.step = static_cast<uint64_t>(step * micro_batches + micro);
  return mode;
}

StepStats optimizer_step(const TrainConfig& config, double loss, const NamedTensors& params, const NamedTensors& grads,
                         AdamW& opt) {
  StepStats stats;
  stats.step = opt.step + 1;
  stats.loss = loss;
  if (!std::isfinite(stats.loss))
    throw Error(fmt::format("training diverged: loss is {} at step {} (try a lower --lr)", stats.loss, stats.step));
  stats.grad_norm = clip_grad_norm(grads, config.clip);
  stats.lr = learning_rate(config.schedule, stats.step);
  adamw_step(opt, params, grads, stats.lr);
  return stats;
}

void restore_optimizer_and_data(const LoadedCheckpoint& checkpoint, AdamW& opt, Rng& data_rng) {
  if (!checkpoint.optimizer) throw Error(fmt::format("{}: no optimizer state to resume from", checkpoint.dir));
  load_adamw_state(*checkpoint.optimizer, opt);
  const JsonReader state(checkpoint.state, state_file_path(checkpoint));
  if (state.has("seed")) state.unsigned_integer("seed");  // the run's seed, also in config
  const JsonReader data = state.object("data_rng");
  const uint64_t seed = data.unsigned_integer("seed");
  const uint64_t position = data.unsigned_integer("position");
  data_rng = Rng(seed, position);
  // state.json and optimizer.safetensors must come from the same save (the data position
  // belongs to the optimizer's step).
  const int64_t step = state.integer("step", 0, kMaxSteps);
  if (step != opt.step)
    throw Error(fmt::format("{}: 'step' is {}, but {} is at step {} (files of different saves?)", state.where(), step,
                            kOptimizerFile, opt.step));
}

nlohmann::json checkpoint_state(const TrainConfig& config, int64_t step, const Rng& data_rng, nlohmann::json data,
                                const nlohmann::json& metrics) {
  return {{"format", 1},
          {"task", task_name(config.task)},
          {"step", step},
          {"seed", config.seed},
          {"world_size", world().size},
          {"data_rng", {{"seed", data_rng.seed()}, {"position", data_rng.position()}}},
          {"data", std::move(data)},
          {"tokenizer", "bytes"},
          {"config", to_json(config)},
          {"metrics", metrics.is_null() ? nlohmann::json::object() : metrics}};
}

}  // namespace cabm
