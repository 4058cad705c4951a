#include "cabm/train/training_state.h"

#include "cabm/core/error.h"
#include "cabm/train/grad_clip.h"
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

ForwardMode micro_batch_mode(const TrainConfig& config, int64_t step, int64_t micro_batches, int64_t micro) {
  ForwardMode mode;
  mode.training = true;
  mode.seed = config.seed;
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
  try {
    const auto& data = checkpoint.state.at("data_rng");
    const uint64_t seed = data.at("seed").get<uint64_t>();
    const uint64_t position = data.at("position").get<uint64_t>();
    data_rng = Rng(seed, position);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}/{}: malformed training state: {}", checkpoint.dir, kStateFile, e.what()));
  }
}

nlohmann::json checkpoint_state(const TrainConfig& config, int64_t step, const Rng& data_rng, nlohmann::json data,
                                const nlohmann::json& metrics) {
  return {{"format", 1},
          {"task", task_name(config.task)},
          {"step", step},
          {"seed", config.seed},
          {"data_rng", {{"seed", data_rng.seed()}, {"position", data_rng.position()}}},
          {"data", std::move(data)},
          {"tokenizer", "bytes"},
          {"config", to_json(config)},
          {"metrics", metrics.is_null() ? nlohmann::json::object() : metrics}};
}

}  // namespace cabm
