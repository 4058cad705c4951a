#include "cabm/train/lm_trainer.h"

#include "cabm/core/error.h"
#include "cabm/train/model_config.h"

#include <algorithm>

namespace cabm {

CausalLMConfig lm_model_config(const TrainConfig& c) {
  CausalLMConfig m = byte_model_config<CausalLMConfig>(c);
  m.activation = Activation::kGelu;
  m.tie_head = true;
  return m;
}

LmTrainer::LmTrainer(const TrainConfig& config, TextSplit data) : config_(config), data_(std::move(data)) {
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
  check_training_memory(config_, parameter_count(mc), mc.vocab_size);
  try {
    state_.model = make_causal_lm(mc);
    state_.grad_model = make_causal_lm(mc);
    start_training(config_, state_);
    for (int64_t micro = 0; micro < config_.accum; ++micro) {
      inputs_.push_back(Tensor::empty({config_.batch_size, T}, DType::I64));
      targets_.push_back(Tensor::empty({config_.batch_size, T}, DType::I64));
    }
  } catch (const OutOfMemory& e) {
    rethrow_training_out_of_memory(config_, e);
  }
}

void LmTrainer::restore(const LoadedCheckpoint& checkpoint) {
  restore_training(checkpoint, state_);
}

void LmTrainer::synchronize_ranks() {
  broadcast_training_state(state_);
}

StepStats LmTrainer::train_step() {
  const int64_t B = config_.batch_size, T = config_.seq_len;
  const World& w = world();
  for (int64_t micro = 0; micro < config_.accum; ++micro) {
    Tensor& inputs = inputs_[static_cast<size_t>(micro)];
    Tensor& targets = targets_[static_cast<size_t>(micro)];
    if (!w.distributed()) {
      sample_windows(data_.train, B, T, state_.data_rng, inputs.data<int64_t>(), targets.data<int64_t>());
      continue;
    }
    // Every rank draws the whole global batch of K·B windows (the same data stream as one
    // process with batch K·B) and keeps rows [rank·B, rank·B + B).
    ensure_shape(global_inputs_, {w.size * B, T}, DType::I64);
    ensure_shape(global_targets_, {w.size * B, T}, DType::I64);
    sample_windows(data_.train, w.size * B, T, state_.data_rng, global_inputs_.data<int64_t>(),
                   global_targets_.data<int64_t>());
    const int64_t first = w.rank * B * T;
    std::copy_n(global_inputs_.data<int64_t>() + first, B * T, inputs.data<int64_t>());
    std::copy_n(global_targets_.data<int64_t>() + first, B * T, targets.data<int64_t>());
  }
  return train_step_on(inputs_, targets_);
}

StepStats LmTrainer::train_step_on(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets) {
  CABM_CHECK(!inputs.empty() && inputs.size() == targets.size(), "a step needs matching, non-empty micro-batches");
  const auto micro_batches = static_cast<int64_t>(inputs.size());
  return training_step(
      config_, micro_batches, state_, [&](int64_t micro, const ForwardMode& mode, const LossOptions& loss_options) {
        const Tensor& tokens = inputs[static_cast<size_t>(micro)];
        causal_lm_forward(state_.model, tokens, cache_, mode);
        const CrossEntropyResult r = causal_lm_loss(targets[static_cast<size_t>(micro)], loss_options, cache_);
        causal_lm_backward(state_.model, cache_, state_.grad_model);
        return MicroBatchResult{r.loss, tokens.numel()};
      });
}

double evaluate_lm(const CausalLM& model, std::string_view text, int64_t T, int64_t max_windows, int64_t B) {
  CausalLMCache cache;
  return evaluate_lm(model, text, T, max_windows, B, cache);
}

double evaluate_lm(const CausalLM& model, std::string_view text, int64_t T, int64_t max_windows, int64_t B,
                   CausalLMCache& cache) {
  const std::vector<int64_t> offsets = evaluation_offsets(text, T, max_windows);
  const auto count = static_cast<int64_t>(offsets.size());
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
  return evaluate_lm(state_.model, data_.validation, config_.seq_len, config_.eval_windows, config_.batch_size, cache_);
}

std::string LmTrainer::save(const nlohmann::json& metrics) {
  const nlohmann::json data = {
      {"source", data_.source}, {"train_bytes", data_.train.size()}, {"validation_bytes", data_.validation.size()}};
  return save_training(config_, state_, causal_lm_metadata(state_.model.config), data, metrics);
}

}  // namespace cabm
