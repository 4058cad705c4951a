// Training a character-level causal language model (nn/causal_lm.h) on a TextSplit.
//
// One optimizer step (1-based step t):
//   grads ← 0
//   for each of `accum` micro-batches: B random windows of T + 1 bytes from the training text
//     (data RNG), forward in training mode (dropout stream: seed, micro-batch counter),
//     loss scaled by 1/accum, backward (accumulates)
//   clip the global gradient norm;  lr ← schedule(t);  AdamW update
// Everything random is counter-based or drawn from a generator whose state is (seed,
// position), and both are saved in the checkpoint: a resumed run reproduces the losses of an
// uninterrupted one bit for bit at the same thread count.
#pragma once

#include "io/text_data.h"
#include "nn/causal_lm.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/train_config.h"

#include <cstdint>
#include <string>

namespace cabm {

struct StepStats {
  int64_t step = 0;  // the optimizer step just taken
  double loss = 0;   // mean training loss over its micro-batches (nats per token)
  double lr = 0;
  float grad_norm = 0;  // before clipping
  int64_t tokens = 0;   // tokens processed by this step
  double seconds = 0;   // wall time of this step
};

// The model's configuration for a training configuration (bytes: V = 256, T_max = seq_len).
CausalLMConfig lm_model_config(const TrainConfig& config);

class LmTrainer {
 public:
  // Fresh run: parameters from config.init, else initialised from config.seed.
  LmTrainer(const TrainConfig& config, TextSplit data);
  // Continues from a checkpoint made by save(): weights, optimizer, step, data position.
  void restore(const LoadedCheckpoint& checkpoint);

  // One optimizer step on `accum` micro-batches drawn from the training text.
  StepStats train_step();
  // One optimizer step on given micro-batches (inputs/targets I64 [B, T] each), e.g. for
  // parity tests against PyTorch on a fixed batch. Gradients are averaged over them.
  StepStats train_step_on(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets);
  double evaluate();  // mean validation loss, nats per byte (eval mode, fixed windows)
  std::string save(const nlohmann::json& metrics = {});  // checkpoint into config.out_dir

  int64_t step() const { return opt_.step; }
  const TrainConfig& config() const { return config_; }
  const CausalLM& model() const { return model_; }
  const TextSplit& data() const { return data_; }
  const NamedTensors& parameters() const { return params_; }
  const NamedTensors& gradients() const { return grads_; }
  const AdamW& optimizer() const { return opt_; }
  uint64_t data_position() const { return data_rng_.position(); }

 private:
  TrainConfig config_;
  TextSplit data_;
  CausalLM model_, grad_model_;
  NamedTensors params_, grads_;
  AdamW opt_;
  Rng data_rng_;
  CausalLMCache cache_;
  std::vector<Tensor> inputs_, targets_;  // accum × I64 [B, T]
  std::vector<int64_t> eval_offsets_;
};

// Mean loss (nats per byte) of `model` over windows of `text` (evaluation_offsets), in eval
// mode, B windows at a time.
double evaluate_lm(const CausalLM& model, std::string_view text, int64_t T, int64_t max_windows, int64_t B);

// The data position stream: data RNG seed derived from the run seed.
uint64_t data_seed(uint64_t seed);

}  // namespace cabm
