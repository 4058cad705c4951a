// AdamW (Loshchilov & Hutter 2019, "Decoupled weight decay regularization") with the exact
// semantics of torch.optim.AdamW (PyTorch 1.13, single-tensor path), per parameter p with
// gradient g at step t (1-based):
//   p ← p · (1 − lr·wd)                       decoupled decay, before the Adam update
//   m ← β1·m + (1 − β1)·g
//   v ← β2·v + (1 − β2)·g²
//   p ← p − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + eps)      eps outside the square root
// Scalars (1 − lr·wd, bias corrections, step size) are computed in double, as Python does, and
// rounded to float once; the element-wise math is float32 in PyTorch's operation order, so one
// step matches PyTorch to within an ulp or two.
//
// Weight decay is per parameter: `default_weight_decay` decides from the parameter's name and
// rank (matrices decay; biases, LayerNorm parameters and embeddings do not), the common
// practice since GPT-2/minGPT. The optimizer state is (step, m and v per parameter name), which
// is exactly what a checkpoint stores.
#pragma once

#include "cabm/core/tensor.h"
#include "cabm/nn/parameters.h"

#include <cstdint>
#include <string>
#include <vector>

namespace cabm {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

struct AdamW {
  AdamWConfig config;
  int64_t step = 0;                  // completed steps; the next update uses step + 1
  std::vector<std::string> names;    // parameter names, in the model's order
  std::vector<Tensor> exp_avg;       // m, one per parameter, same shape, contiguous
  std::vector<Tensor> exp_avg_sq;    // v
  std::vector<double> weight_decay;  // per parameter: config.weight_decay or 0
};

// True for parameters that get weight decay: rank >= 2 and not an embedding table (a name
// containing "embed", "wte" or "wpe"). Biases and LayerNorm weights are rank 1.
bool default_weight_decay(const std::string& name, const Tensor& param);

// Zero moments for every parameter; decay per `default_weight_decay`. Parameters must be F32
// and contiguous.
AdamW make_adamw(const NamedTensors& params, const AdamWConfig& config);

// One update with learning rate `lr`. `grads` zips with `params` name by name (checked).
void adamw_step(AdamW& opt, const NamedTensors& params, const NamedTensors& grads, double lr);

// Sets every element of every tensor to 0 (gradient buffers at the start of a step).
void zero_tensors(const NamedTensors& tensors);

}  // namespace cabm
