// Training a character-level causal language model (cabm/nn/causal_lm.h) on a TextSplit.
//
// One optimizer step (1-based step t):
//   grads ← 0
//   for each of `accum` micro-batches: B random windows of T + 1 bytes from the training text
//     (data RNG), forward in training mode (dropout stream: seed, micro-batch counter),
//     loss scaled by 1/accum, backward (accumulates)
//   (data parallel over K ranks, cabm/train/distributed.h: a micro-batch is K·B windows, rank r
//   takes windows r·B … r·B + B − 1; the gradients are averaged over the ranks)
//   clip the global gradient norm;  lr ← schedule(t);  AdamW update
// The set-up, the optimizer half of a step, resume and checkpoints are the shared skeleton of
// cabm/train/training_state.h: a resumed run reproduces the losses of an uninterrupted one bit for
// bit at the same thread count.
#pragma once

#include "cabm/io/text_data.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/train/checkpoint.h"
#include "cabm/train/train_config.h"
#include "cabm/train/training_state.h"

#include <cstdint>
#include <string>

namespace cabm {

// The model's configuration for a training configuration (bytes: V = 256, T_max = seq_len).
CausalLMConfig lm_model_config(const TrainConfig& config);

class LmTrainer {
 public:
  // Fresh run: parameters from config.init, else initialised from config.seed.
  LmTrainer(const TrainConfig& config, TextSplit data);
  // Continues from a checkpoint made by save(): weights, optimizer, step, data position.
  void restore(const LoadedCheckpoint& checkpoint);
  // Data parallelism: every rank takes rank 0's weights, optimizer state and data position.
  void synchronize_ranks();

  // One optimizer step on `accum` micro-batches drawn from the training text.
  StepStats train_step();
  // One optimizer step on given micro-batches (inputs/targets I64 [B, T] each), e.g. for
  // parity tests against PyTorch on a fixed batch. Gradients are averaged over them.
  StepStats train_step_on(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets);
  double evaluate();  // mean validation loss, nats per byte (eval mode, fixed windows)
  std::string save(const nlohmann::json& metrics = {});  // checkpoint into config.out_dir

  int64_t step() const { return state_.opt.step; }
  const TrainConfig& config() const { return config_; }
  const CausalLM& model() const { return state_.model; }
  const TextSplit& data() const { return data_; }
  const NamedTensors& parameters() const { return state_.params; }
  const NamedTensors& gradients() const { return state_.grads; }
  const AdamW& optimizer() const { return state_.opt; }
  uint64_t data_position() const { return state_.data_rng.position(); }

 private:
  TrainConfig config_;
  TextSplit data_;
  TrainingState<CausalLM> state_;
  CausalLMCache cache_;
  std::vector<Tensor> inputs_, targets_;   // accum × I64 [B, T]
  Tensor global_inputs_, global_targets_;  // data parallelism: I64 [K·B, T], this rank's rows copied out
};

// Mean loss (nats per byte) of `model` over windows of `text` (evaluation_offsets), in eval
// mode, B windows at a time. The overload with a cache runs in its workspaces (a trainer passes
// its training cache: its activations are dead between steps, and fresh ones cost page faults).
double evaluate_lm(const CausalLM& model, std::string_view text, int64_t T, int64_t max_windows, int64_t B);
double evaluate_lm(const CausalLM& model, std::string_view text, int64_t T, int64_t max_windows, int64_t B,
                   CausalLMCache& cache);

}  // namespace cabm
