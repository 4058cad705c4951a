// The training-loop skeleton of both trainers (lm_trainer.h: a causal LM on text;
// langid_trainer.h: a classifier on words). A trainer keeps its data, how it draws a batch and
// the forward / loss / backward of one micro-batch; the rest is here, once, so that the two
// tasks set up, step, resume and checkpoint alike:
//   set-up  the model and a gradient twin of the same config, parameters from --init or drawn
//           from the seed, bf16 copies, AdamW, the schedule completed from the run
//   step    grads ← 0; per micro-batch (dropout stream: seed, step · accum + micro) the loss
//           gradient scaled by 1/accum; then mean loss, clip, lr(t), AdamW, bf16 refresh
//   resume  weights, optimizer state and the data stream's position from a checkpoint
//   save    model.safetensors (the config as metadata), optimizer.safetensors, state.json
// Everything random is counter-based or drawn from a generator whose state is (seed,
// position), and both are saved: a resumed run reproduces an uninterrupted one bit for bit at
// the same thread count.
#pragma once

#include "cabm/core/rng.h"
#include "cabm/interop/state_dict.h"
#include "cabm/nn/forward_mode.h"
#include "cabm/nn/init.h"
#include "cabm/nn/loss.h"
#include "cabm/nn/mixed_precision.h"
#include "cabm/nn/parameters.h"
#include "cabm/train/adamw.h"
#include "cabm/train/checkpoint.h"
#include "cabm/train/distributed.h"
#include "cabm/train/train_config.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace cabm {

struct StepStats {
  int64_t step = 0;  // the optimizer step just taken
  double loss = 0;   // mean training loss over its micro-batches (nats per token)
  double lr = 0;
  float grad_norm = 0;  // before clipping
  int64_t tokens = 0;   // tokens processed by this step (by all ranks)
  double seconds = 0;   // wall time of this step
  double comm_seconds = 0;  // of which averaging the gradients over ranks (0 on one process)
};

// The data position stream: data RNG seed derived from the run seed.
uint64_t data_seed(uint64_t seed);

// Model is CausalLM or Classifier. params and grads are the two models' parameter lists, which
// zip name by name; backward accumulates into grad_model, zeroed once per step.
template <typename Model>
struct TrainingState {
  Model model, grad_model;  // grad_model: made with model's config
  NamedTensors params, grads;
  AdamW opt;
  Rng data_rng;  // draws the batches; saved with its position
};

// What one micro-batch reports: its mean loss (not scaled by 1/accum) and its tokens.
struct MicroBatchResult {
  double loss = 0;
  int64_t tokens = 0;
};

// Fills in what the schedule takes from the run: total_steps, d_model and, for the warm-up
// schedule, the scale that makes its peak config.schedule.lr.
void complete_schedule(TrainConfig& config);

// Refuses, before anything is allocated, a run whose parameters, gradients, AdamW state and one
// micro-batch's saved activations (a lower bound of what it will allocate) exceed the memory
// this process may use (cabm/core/memory.h); the error names the flags. `parameters`: the
// model's count; `outputs`: its logits per token (V) or per sequence (classes).
void check_training_memory(const TrainConfig& config, double parameters, int64_t outputs);
// An allocation failure while building the model or its optimizer, rethrown naming the flags.
[[noreturn]] void rethrow_training_out_of_memory(const TrainConfig& config, const OutOfMemory& e);

// The training mode of micro-batch `micro` of the step after `step`: its dropout masks are a
// function of (seed, rank, step · micro_batches + micro) alone, so a resumed run draws the same
// ones, and each rank of a data-parallel run its own (rank 0 those of a single process).
ForwardMode micro_batch_mode(const TrainConfig& config, int64_t step, int64_t micro_batches, int64_t micro);

// The optimizer half of a step, once the micro-batches' gradients are in `grads`: stats for
// step opt.step + 1 with the given mean loss (a non-finite one is a cabm::Error: diverged),
// the gradient clipped, the AdamW update at the schedule's lr.
StepStats optimizer_step(const TrainConfig& config, double loss, const NamedTensors& params, const NamedTensors& grads,
                         AdamW& opt);

// Resumes the optimizer and the data stream from a checkpoint (for_resume: it has both).
void restore_optimizer_and_data(const LoadedCheckpoint& checkpoint, AdamW& opt, Rng& data_rng);

// state.json of a checkpoint at `step`; `data` describes the trainer's data set.
nlohmann::json checkpoint_state(const TrainConfig& config, int64_t step, const Rng& data_rng, nlohmann::json data,
                                const nlohmann::json& metrics);

// A fresh run: state.model and state.grad_model are made (zero parameters) by the caller;
// this takes the parameters from config.init when given, else initialises them from
// config.seed, and sets up everything else. Completes config.schedule (complete_schedule).
template <typename Model>
void start_training(TrainConfig& config, TrainingState<Model>& state) {
  state.params = named_parameters(state.model);
  state.grads = named_parameters(state.grad_model);
  if (config.init.empty()) {
    Rng init_rng(config.seed);
    init_parameters(state.model, init_rng);
  } else {
    load_parameters(read_safetensors(config.init), state.params);
  }
  set_precision(state.model, config.precision);  // bf16 copies of the initial weights
  state.opt = make_adamw(state.params, config.adamw);
  state.data_rng = Rng(data_seed(config.seed));
  complete_schedule(config);
}

// Continues from a checkpoint made by save_training: weights, optimizer, step, data position.
template <typename Model>
void restore_training(const LoadedCheckpoint& checkpoint, TrainingState<Model>& state) {
  load_parameters(checkpoint.model, state.params);
  refresh_bf16_weights(state.model);
  restore_optimizer_and_data(checkpoint, state.opt, state.data_rng);
}

// Copies rank 0's weights, optimizer state and data position to every rank of a data-parallel
// run (after set-up or resume; nothing on one process), so that all ranks start identical.
template <typename Model>
void broadcast_training_state(TrainingState<Model>& state) {
  if (!world().distributed()) return;
  broadcast_from_rank0(state.params);
  for (std::vector<Tensor>* moments : {&state.opt.exp_avg, &state.opt.exp_avg_sq})
    for (const Tensor& t : *moments) broadcast_from_rank0(t.raw_data(), t.nbytes());
  uint64_t words[3] = {static_cast<uint64_t>(state.opt.step), state.data_rng.seed(), state.data_rng.position()};
  broadcast_from_rank0(words, sizeof(words));
  state.opt.step = static_cast<int64_t>(words[0]);
  state.data_rng = Rng(words[1], words[2]);
  refresh_bf16_weights(state.model);
}

// One optimizer step over `micro_batches` micro-batches. micro_batch(micro, mode, loss_options)
// runs forward in `mode`, the loss with `loss_options` (its gradient scaled by 1/micro_batches)
// and backward into state.grad_model, and returns a MicroBatchResult. In a data-parallel run
// each rank has run its share of every micro-batch; the losses, token counts and gradients are
// then averaged (summed) over the ranks, so that the clipping sees the global norm and AdamW
// steps identically everywhere.
template <typename Model, typename MicroBatch>
StepStats training_step(const TrainConfig& config, int64_t micro_batches, TrainingState<Model>& state,
                        MicroBatch&& micro_batch) {
  const auto start = std::chrono::steady_clock::now();
  zero_tensors(state.grads);
  LossOptions loss_options;
  loss_options.grad_scale = 1.0f / static_cast<float>(micro_batches);
  double loss_sum = 0.0;
  int64_t tokens = 0;
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    const MicroBatchResult r =
        micro_batch(micro, micro_batch_mode(config, state.opt.step, micro_batches, micro), loss_options);
    loss_sum += r.loss;
    tokens += r.tokens;
  }
  std::vector<double> sums = {loss_sum, static_cast<double>(tokens)};
  all_reduce_sum(sums);
  const double comm_seconds = all_reduce_mean(state.grads);
  const double mean_loss = sums[0] / static_cast<double>(micro_batches * world().size);
  StepStats stats = optimizer_step(config, mean_loss, state.params, state.grads, state.opt);
  refresh_bf16_weights(state.model);  // mixed precision: the next products see the new weights
  stats.tokens = static_cast<int64_t>(sums[1]);
  stats.comm_seconds = comm_seconds;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

// Checkpoints the run into config.out_dir (keeping config.keep_checkpoints); returns the
// checkpoint's directory. model_metadata: the model's config (cabm/train/model_config.h).
template <typename Model>
std::string save_training(const TrainConfig& config, const TrainingState<Model>& state,
                          std::map<std::string, std::string> model_metadata, nlohmann::json data,
                          const nlohmann::json& metrics) {
  CheckpointWrite w;
  w.step = state.opt.step;
  w.params = &state.params;
  w.model_metadata = std::move(model_metadata);
  w.optimizer = &state.opt;
  w.state = checkpoint_state(config, state.opt.step, state.data_rng, std::move(data), metrics);
  return save_checkpoint(config.out_dir, w, config.keep_checkpoints);
}

}  // namespace cabm
