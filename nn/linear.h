// Linear map y = x Wᵀ + b, PyTorch's nn.Linear (weight [out, in]).
#pragma once

#include "core/tensor.h"

namespace cabm {

struct Linear {
  Tensor weight;  // [out, in], unit column stride (may be a row slice of a packed weight)
  Tensor bias;    // [out]; undefined when the layer has no bias

  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }
};

Linear make_linear(int64_t in_features, int64_t out_features, bool bias);  // zero parameters

// x: [rows, in], y: [rows, out] — 2-d views with unit column stride (row strides free).
void linear_forward(const Linear& layer, const Tensor& x, const Tensor& y);

// A contiguous [.., E] tensor seen as [rows, E] (a view; 2-d tensors pass through).
Tensor as_rows(const Tensor& t);

}  // namespace cabm
