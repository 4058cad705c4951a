// Moving module parameters in and out of safetensors files by PyTorch state_dict name.
#pragma once

#include "cabm/io/safetensors.h"
#include "cabm/nn/parameters.h"

#include <map>
#include <string>

namespace cabm {

// Copies every parameter from `file` (F32, or BF16 converted), name `prefix + name`, checking
// shapes and values. Strict like PyTorch's load_state_dict: a missing key, a wrong shape, or
// (when `allow_unexpected` is false) a tensor in the file under `prefix` that no parameter takes
// is a cabm::Error naming the file and the key; so is a weight that is not finite
// (check_finite_weights).
void load_parameters(const SafetensorsFile& file, const NamedTensors& params, const std::string& prefix = "",
                     bool allow_unexpected = false);

// The flat (row-major) index of the first NaN or ±inf element of an F32 or BF16 tensor, or -1
// when every element is finite (BOOL and I64 tensors have none). One pass, no copy of a
// contiguous tensor.
int64_t find_non_finite(const Tensor& t);

// Every loader of model weights from a file (load_parameters; load_hf_encoder) calls this on each
// tensor before it is used: a NaN or ±inf weight would make every output NaN without a word, so
// it is a cabm::Error of one line,
//   "PATH: tensor 'KEY' holds nan at element J (a model's weights must be finite)".
// (Inputs are the user's data and are not checked: PyTorch propagates NaN there, so does cabm.)
void check_finite_weights(const SafetensorsFile& file, const std::string& key, const Tensor& t);

// The parameters as a name → tensor map, ready for write_safetensors.
std::map<std::string, Tensor> to_tensor_map(const NamedTensors& params, const std::string& prefix = "");

}  // namespace cabm
