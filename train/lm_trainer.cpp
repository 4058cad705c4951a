#include "train/lm_trainer.h"

#include "core/error.h"
#include "io/state_dict.h"
#include "io/tokenizer.h"
#include "nn/init.h"
#include "nn/parameters.h"
#include "train/grad_clip.h"
#include "train/model_config.h"
#include "train/schedule.h"

#include <chrono>
#include <cmath>

namespace cabm {

uint64_t data_seed(uint64_t seed) {
  return splitmix64(seed ^ 0xDA7A5EEDull);
}

CausalLMConfig lm_model_config(const TrainConfig& c) {
  CausalLMConfig m;
  m.vocab_size = kByteVocabSize;
  m.max_seq_len = c.seq_len;
  m.d_model = c.d_model;
  m.nhead = c.heads;
  m.num_layers = c.layers;
  m.dim_feedforward = c.d_ff;
  m.dropout = c.dropout;
  m.activation = Activation::kGelu;
  m.norm_first = c.norm_first;
  m.tie_head = true;
  m.positional = PositionalKind::kLearned;
  return m;
}

LmTrainer::LmTrainer(const TrainConfig& config, TextSplit data)
    : config_(config), data_(std::move(data)), data_rng_(data_seed(config.seed)) {
  validate(config_);
  const int64_t T = config_.seq_len;
  if (static_cast<int64_t>(data_.train.size()) < T + 1)
    throw Error(fmt::format("{}: training text has {} bytes, fewer than one window of --seq-len {} + 1", data_.source,
                            data_.train.size(), T));
  if (static_cast<int64_t>(data_.validation.size()) < T + 1)
    throw Error(
        fmt::format("{}: held-out text has {} bytes, fewer than one window of --seq-len {} + 1 (use a "
                    "larger file or a smaller --seq-len)",
                    data_.source, data_.validation.size(), T));
  const CausalLMConfig mc = lm_model_config(config_);
  model_ = make_causal_lm(mc);
  grad_model_ = make_causal_lm(mc);
  params_ = named_parameters(model_);
  grads_ = named_parameters(grad_model_);
  if (config_.init.empty()) {
    Rng init_rng(config_.seed);
    init_parameters(model_, init_rng);
  } else {
    load_parameters(read_safetensors(config_.init), params_);
  }
  set_precision(model_, config_.precision);  // bf16 copies of the initial weights
  opt_ = make_adamw(params_, config_.adamw);
  config_.schedule.total_steps = config_.steps;
  config_.schedule.d_model = config_.d_model;
  if (config_.schedule.kind == ScheduleKind::kWarmup)
    config_.schedule.scale = warmup_scale_for_peak(config_.schedule.lr, config_.d_model, config_.schedule.warmup);
  for (int64_t micro = 0; micro < config_.accum; ++micro) {
    inputs_.push_back(Tensor::empty({config_.batch_size, T}, DType::I64));
    targets_.push_back(Tensor::empty({config_.batch_size, T}, DType::I64));
  }
}

void LmTrainer::restore(const LoadedCheckpoint& checkpoint) {
  load_parameters(checkpoint.model, params_);
  refresh_bf16_weights(model_);
  if (!checkpoint.optimizer) throw Error(fmt::format("{}: no optimizer state to resume from", checkpoint.dir));
  load_adamw_state(*checkpoint.optimizer, opt_);
  try {
    const auto& data = checkpoint.state.at("data_rng");
    const uint64_t seed = data.at("seed").get<uint64_t>();
    const uint64_t position = data.at("position").get<uint64_t>();
    data_rng_ = Rng(seed, position);
    if (checkpoint.state.at("step").get<int64_t>() != opt_.step)
      throw Error(fmt::format("{}: state.json step {} differs from the optimizer's step {}", checkpoint.dir,
                              checkpoint.state.at("step").get<int64_t>(), opt_.step));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}/{}: malformed training state: {}", checkpoint.dir, kStateFile, e.what()));
  }
}

StepStats LmTrainer::train_step() {
  const int64_t B = config_.batch_size, T = config_.seq_len;
  for (int64_t micro = 0; micro < config_.accum; ++micro) {
    Tensor& inputs = inputs_[static_cast<size_t>(micro)];
    Tensor& targets = targets_[static_cast<size_t>(micro)];
    sample_windows(data_.train, B, T, data_rng_, inputs.data<int64_t>(), targets.data<int64_t>());
  }
  return train_step_on(inputs_, targets_);
}

StepStats LmTrainer::train_step_on(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets) {
  CABM_CHECK(!inputs.empty() && inputs.size() == targets.size(), "a step needs matching, non-empty micro-batches");
  const auto start = std::chrono::steady_clock::now();
  const auto micro_batches = static_cast<int64_t>(inputs.size());
  zero_tensors(grads_);
  double loss_sum = 0.0;
  int64_t tokens = 0;
  LossOptions loss_options;
  loss_options.grad_scale = 1.0f / static_cast<float>(micro_batches);
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    ForwardMode mode;
    mode.training = true;
    mode.seed = config_.seed;
    mode.step = static_cast<uint64_t>(opt_.step * micro_batches + micro);
    causal_lm_forward(model_, inputs[static_cast<size_t>(micro)], cache_, mode);
    const CrossEntropyResult r = causal_lm_loss(targets[static_cast<size_t>(micro)], loss_options, cache_);
    loss_sum += r.loss;
    causal_lm_backward(model_, cache_, grad_model_);
    tokens += inputs[static_cast<size_t>(micro)].numel();
  }
  StepStats stats;
  stats.step = opt_.step + 1;
  stats.loss = loss_sum / static_cast<double>(micro_batches);
  if (!std::isfinite(stats.loss))
    throw Error(fmt::format("training diverged: loss is {} at step {} (try a lower --lr)", stats.loss, stats.step));
  stats.grad_norm = clip_grad_norm(grads_, config_.clip);
  stats.lr = learning_rate(config_.schedule, stats.step);
  adamw_step(opt_, params_, grads_, stats.lr);
  refresh_bf16_weights(model_);  // mixed precision: the next products see the new weights
  stats.tokens = tokens;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

double evaluate_lm(const CausalLM& model, std::string_view text, int64_t T, int64_t max_windows, int64_t B) {
  const std::vector<int64_t> offsets = evaluation_offsets(text, T, max_windows);
  const auto count = static_cast<int64_t>(offsets.size());
  CausalLMCache cache;
  LossOptions options;
  options.compute_grad = false;
  double total = 0.0;
  for (int64_t first = 0; first < count; first += B) {
    const int64_t n = std::min(B, count - first);
    Tensor inputs = Tensor::empty({n, T}, DType::I64), targets = Tensor::empty({n, T}, DType::I64);
    gather_windows(text, offsets, first, n, T, inputs.data<int64_t>(), targets.data<int64_t>());
    causal_lm_forward(model, inputs, cache);
    total += static_cast<double>(causal_lm_loss(targets, options, cache).loss) * static_cast<double>(n);
  }
  return total / static_cast<double>(count);
}

double LmTrainer::evaluate() {
  return evaluate_lm(model_, data_.validation, config_.seq_len, config_.eval_windows, config_.batch_size);
}

std::string LmTrainer::save(const nlohmann::json& metrics) {
  CheckpointWrite w;
  w.step = opt_.step;
  w.params = &params_;
  w.model_metadata = causal_lm_metadata(model_.config);
  w.optimizer = &opt_;
  w.state = {
      {"format", 1},
      {"task", task_name(config_.task)},
      {"step", opt_.step},
      {"seed", config_.seed},
      {"data_rng", {{"seed", data_rng_.seed()}, {"position", data_rng_.position()}}},
      {"data",
       {{"source", data_.source}, {"train_bytes", data_.train.size()}, {"validation_bytes", data_.validation.size()}}},
      {"tokenizer", "bytes"},
      {"config", to_json(config_)},
      {"metrics", metrics.is_null() ? nlohmann::json::object() : metrics}};
  return save_checkpoint(config_.out_dir, w, config_.keep_checkpoints);
}

}  // namespace cabm
